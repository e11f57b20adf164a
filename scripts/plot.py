#!/usr/bin/env python3
"""Draws training curves from lockstep's metrics files (fit_options::metrics_file: one JSON object
per epoch) as one PNG: loss, accuracy, learning rate and samples/s against epochs or steps, each
file a run, several runs on the same axes (training solid, validation dashed).

  scripts/plot.py [--x epoch|step] [--label NAME ...] [--out curves.png] [--title T] METRICS...
  scripts/plot.py --trace TRACE.json [--step N] [--out step.png] [--title T]

A file that starts again at epoch 0 holds several runs; each is drawn on its own. With --trace, it
draws one training step of a timeline (fit_options::trace_file, fashion_mnist --trace): a row per
worker and thread, a bar per span from the driver's train_step span of step N (default: the first
traced step), coloured by kind. Needs matplotlib:
Debian's python3-matplotlib (with --install-deps, run as root, the script installs it with
apt-get); when the python3 running it lacks matplotlib it runs itself again with /usr/bin/python3.
"""
import argparse
import json
import math
import os
import subprocess
import sys


def need_matplotlib(install):
    try:
        import matplotlib  # noqa: F401

        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    probe = [system, "-c", "import matplotlib"]
    if os.path.realpath(sys.executable) != os.path.realpath(system) and os.path.exists(system):
        if subprocess.run(probe, stderr=subprocess.DEVNULL).returncode == 0:
            os.execv(system, [system] + sys.argv)
    if install and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        ok = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "python3-matplotlib"], env=env).returncode == 0
        if not ok:
            subprocess.run(["apt-get", "update", "-qq"], env=env)
            ok = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "python3-matplotlib"], env=env).returncode == 0
        if ok:
            os.execv(system, [system] + [a for a in sys.argv if a != "--install-deps"])
    sys.exit("plot.py: matplotlib is missing: apt-get install python3-matplotlib (or run this script as root with --install-deps)")


def runs_of(path):
    """The runs of a metrics file: lists of epoch records, a new run where the epoch number drops."""
    runs, current, last = [], [], None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:  # a line cut short by a failed write: the others still plot
                print(f"plot.py: {path}:{n}: not a JSON object ({e}), skipped", file=sys.stderr)
                continue
            if not isinstance(rec, dict) or "epoch" not in rec:
                sys.exit(f"plot.py: {path}:{n}: not a lockstep metrics record (no \"epoch\")")
            if last is not None and rec["epoch"] <= last:
                runs.append(current)
                current = []
            current.append(rec)
            last = rec["epoch"]
    if current:
        runs.append(current)
    if not runs:
        sys.exit(f"plot.py: {path}: no records")
    return runs


def series(run, key, x):
    xs, ys = [], []
    for rec in run:
        v = rec.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        xs.append(rec["epoch"] + 1 if x == "epoch" else rec["step"])
        ys.append(v)
    return xs, ys


def trace_events(path):
    """The complete events and thread names of a Chrome trace file lockstep wrote."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot.py: {path}: not a trace file ({e})")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        sys.exit(f"plot.py: {path}: no \"traceEvents\" list")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    return spans, names


SPAN_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "reduce bucket": "#55a868", "sum micro-shards": "#55a868",
                "epilogue": "#c44e52", "update": "#8172b3", "gather update": "#937860", "pipeline wait": "#8c8c8c",
                "train_step": "#dddddd", "accumulate": "#dddddd", "checkpoint": "#da8bc3"}


def draw_trace(a, plt):
    spans, names = trace_events(a.trace)
    steps = [e for e in spans if e["name"] == "train_step"]
    if not steps:
        sys.exit(f"plot.py: {a.trace}: no train_step span (was the step window empty?)")
    chosen = [e for e in steps if a.step is None or e["args"].get("step") == a.step]
    if not chosen:
        sys.exit(f"plot.py: {a.trace}: step {a.step} is not in the trace (traced: "
                 f"{sorted({e['args'].get('step') for e in steps})})")
    step = chosen[0]["args"].get("step")
    start = min(e["ts"] for e in chosen if e["args"].get("step") == step)
    end = max(e["ts"] + e["dur"] for e in chosen if e["args"].get("step") == step)
    # the batch's wait before the step, and every span inside [start, end]
    waits = [e for e in spans if e["name"] == "pipeline wait" and e["args"].get("step") == step]
    if waits:
        start = min(start, min(e["ts"] for e in waits))
    shown = [e for e in spans if e["ts"] >= start and e["ts"] + e["dur"] <= end + 1e-3]
    rows = sorted({(e["pid"], e["tid"]) for e in shown})
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.6))
    used = {}
    for y, row in enumerate(rows):
        for e in sorted((e for e in shown if (e["pid"], e["tid"]) == row), key=lambda e: -e["dur"]):
            colour = SPAN_COLOURS.get(e["name"], "#bbbbbb")
            nested = e["name"] not in ("train_step", "accumulate", "update")
            h = 0.5 if nested else 0.8
            bar = ax.barh(y, e["dur"] / 1e3, left=(e["ts"] - start) / 1e3, height=h, color=colour,
                          edgecolor="white", linewidth=0.3)
            used.setdefault(e["name"], bar)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"worker {p}, {names.get((p, t), 'thread %d' % t)}" for p, t in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start of the step's pipeline wait", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(used.values(), used.keys(), fontsize=7, frameon=False, ncol=min(5, len(used)), loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if len(rows) < 4 else -0.12))
    ax.set_title(a.title or f"step {step}", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=a.dpi)
    print(f"plot.py: wrote {a.out} ({os.path.getsize(a.out) // 1024} KB, step {step}, {len(shown)} spans)")


PANELS = [("loss", [("train_loss", "train"), ("val_loss", "validation")]),
          ("accuracy", [("train_accuracy", "train"), ("val_accuracy", "validation")]),
          ("learning rate", [("lr", None)]),
          ("samples/s", [("samples_per_second", None)])]


def main():
    ap = argparse.ArgumentParser(description="Training curves from lockstep metrics files, as one PNG.")
    ap.add_argument("metrics", nargs="*", help="metrics files (JSON lines written by fit)")
    ap.add_argument("--trace", help="draw one step of this trace file (fit_options::trace_file) instead")
    ap.add_argument("--step", type=int, default=None, help="with --trace: the step drawn (default: the first traced)")
    ap.add_argument("--x", choices=["epoch", "step"], default="epoch", help="horizontal axis (default: epoch)")
    ap.add_argument("--label", action="append", default=[], help="name of each file's run(s), in order (default: file name)")
    ap.add_argument("--out", default="curves.png", help="the PNG to write (default: curves.png)")
    ap.add_argument("--title", default=None, help="a title above the panels")
    ap.add_argument("--dpi", type=int, default=80, help="resolution (default 80: a small file)")
    ap.add_argument("--install-deps", action="store_true", help="apt-get install python3-matplotlib when missing (root)")
    a = ap.parse_args()
    if not a.trace and not a.metrics:
        sys.exit("plot.py: give metrics files, or --trace FILE")
    if a.label and len(a.label) != len(a.metrics):
        sys.exit("plot.py: give one --label per metrics file")
    need_matplotlib(a.install_deps)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if a.trace:
        if a.out == "curves.png":
            a.out = "step.png"
        draw_trace(a, plt)
        return

    named = []
    for i, path in enumerate(a.metrics):
        base = a.label[i] if a.label else os.path.splitext(os.path.basename(path))[0]
        runs = runs_of(path)
        for k, run in enumerate(runs):
            named.append((base if len(runs) == 1 else f"{base} #{k + 1}", run))
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for r, (name, run) in enumerate(named):
            colour = colours[r % len(colours)]
            for key, which in keys:
                xs, ys = series(run, key, a.x)
                if not xs:
                    continue
                label = name if which is None else f"{name}, {which}"
                ax.plot(xs, ys, color=colour, ls="--" if which == "validation" else "-", marker="o" if len(xs) < 30 else None,
                        ms=3, lw=1.3, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch" if a.x == "epoch" else "step", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        if ax.lines:
            ax.legend(fontsize=7, frameon=False)
    if a.title:
        fig.suptitle(a.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(a.out, dpi=a.dpi)
    print(f"plot.py: wrote {a.out} ({os.path.getsize(a.out) // 1024} KB, {len(named)} run(s))")


if __name__ == "__main__":
    main()
