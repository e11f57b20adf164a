#!/usr/bin/env python3
"""Draws training curves from lockstep's metrics files (fit_options::metrics_file: one JSON object
per epoch) as one PNG: loss, accuracy, learning rate and samples/s against epochs or steps, each
file a run, several runs on the same axes (training solid, validation dashed).

  scripts/plot.py [--x epoch|step] [--label NAME ...] [--out curves.png] [--title T] METRICS...

A file that starts again at epoch 0 holds several runs; each is drawn on its own. Needs matplotlib:
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
            except json.JSONDecodeError as e:
                sys.exit(f"plot.py: {path}:{n}: not a JSON object ({e})")
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


PANELS = [("loss", [("train_loss", "train"), ("val_loss", "validation")]),
          ("accuracy", [("train_accuracy", "train"), ("val_accuracy", "validation")]),
          ("learning rate", [("lr", None)]),
          ("samples/s", [("samples_per_second", None)])]


def main():
    ap = argparse.ArgumentParser(description="Training curves from lockstep metrics files, as one PNG.")
    ap.add_argument("metrics", nargs="+", help="metrics files (JSON lines written by fit)")
    ap.add_argument("--x", choices=["epoch", "step"], default="epoch", help="horizontal axis (default: epoch)")
    ap.add_argument("--label", action="append", default=[], help="name of each file's run(s), in order (default: file name)")
    ap.add_argument("--out", default="curves.png", help="the PNG to write (default: curves.png)")
    ap.add_argument("--title", default=None, help="a title above the panels")
    ap.add_argument("--dpi", type=int, default=80, help="resolution (default 80: a small file)")
    ap.add_argument("--install-deps", action="store_true", help="apt-get install python3-matplotlib when missing (root)")
    a = ap.parse_args()
    if a.label and len(a.label) != len(a.metrics):
        sys.exit("plot.py: give one --label per metrics file")
    need_matplotlib(a.install_deps)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

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
