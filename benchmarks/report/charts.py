#!/usr/bin/env python3
"""Draws the ratios of the side-by-side tables of docs/benchmarks.md as PNG bar charts (one per
table, each under 150 KB), reading the tables from the page itself, so the pictures always show
the page's numbers. benchmarks/run.sh runs it after make_report.py; it can also redraw the charts
of an existing page. Needs matplotlib (Debian's python3-matplotlib, which
benchmarks/peers/setup.sh installs).

  charts.py --page docs/benchmarks.md --out docs/img
"""
import argparse
import os
import re
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("charts.py: matplotlib is missing (apt-get install python3-matplotlib, and run /usr/bin/python3)")

LOCKSTEP = "#1f6f8b"
PEER_COLOURS = ["#e07b39", "#7a9e3c", "#9b59b6", "#c0392b"]


def tables(page):
    """{section title: [row dict, ...]} for every '### title' followed by a markdown table."""
    out, title, head = {}, None, None
    for line in open(page, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("### "):
            title, head = line[4:].strip(), None
            continue
        if title is None or not line.startswith("|"):
            if head is not None and not line.startswith("|"):
                title, head = None, None
            continue
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if head is None:
            head = cells
            out[title] = []
        elif not all(set(c) <= set("-") for c in cells):
            out[title].append(dict(zip(head, cells)))
    return out


def number(cell):
    """The first number of a cell ('2.77×', '40 285', '14.60 s / 487 MiB'), or None for '—'."""
    m = re.search(r"-?\d[\d ]*(?:\.\d+)?", cell.replace("\u202f", " "))
    if not m or cell.strip().startswith("—"):
        return None
    return float(m.group(0).replace(" ", ""))


def bars(ax, groups, series, colours, ylabel, lines=(), fmt="{:.2f}×"):
    """Grouped bars: groups along x, one bar per series (values None are left out)."""
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, values) in enumerate(series):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        for x, v in zip(xs, values):
            if v is None:
                continue
            ax.bar(x, v, width * 0.92, color=colours[i % len(colours)], label=name)
            ax.annotate(fmt.format(v), (x, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
    handles, labels = ax.get_legend_handles_labels()
    seen = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    ax.legend(seen.values(), seen.keys(), fontsize=8, frameon=False, loc="upper center", ncol=len(seen))
    for y, label in lines:
        ax.axhline(y, color="#555555", lw=0.8, ls="--")
        ax.annotate(label, (len(groups) - 0.55, y), fontsize=7, color="#555555", va="bottom", ha="right")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    top = max([v for _, values in series for v in values if v is not None] + [y for y, _ in lines] + [1.0])
    ax.set_ylim(0, top * 1.3)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    size = os.path.getsize(path)
    if size > 150 * 1024:
        sys.exit(f"charts.py: {path} is {size} bytes, more than 150 KB")
    print(f"charts.py: {path} ({size // 1024} KB)")


def step_chart(rows, path):
    groups = [r["config"].split(":")[0].split(" (")[0] for r in rows]
    series = [("lockstep / TensorFlow", [number(r["ours/TF"]) for r in rows]),
              ("lockstep / PyTorch", [number(r["ours/PyTorch"]) for r in rows]),
              ("lockstep / fastest SGEMM", [number(r["fastest SGEMM (ours/it)"].split("(")[-1]) for r in rows])]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bars(ax, groups, series, [PEER_COLOURS[0], PEER_COLOURS[1], "#888888"], "ratio of samples/s",
         [(1.0, "parity"), (2.0, "S goal: 2× best peer")])
    ax.set_title("Training step on one core: lockstep's samples/s over each peer's and over the SGEMM limit", fontsize=9)
    save(fig, path)


def scaling_chart(rows, path):
    names = {"lockstep `mirrored<cpu<0>, cpu<1>>` (threads), `shard_optimizer = false`": "lockstep\nthreads",
             "the same with `shard_optimizer` (the default for SGD with momentum)": "lockstep threads\nsharded update",
             "lockstep `multi_worker_mirrored`, `mpirun -np 2`": "lockstep\n2 processes (MPI)",
             "TensorFlow MirroredStrategy, 2 logical CPUs, tf.data": "TensorFlow\nMirroredStrategy",
             "PyTorch DDP, gloo, 2 processes": "PyTorch DDP\n(gloo)"}
    groups = [names.get(r["system"], r["system"]) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    values = [number(r["speedup"]) for r in rows]
    colours = [LOCKSTEP if r["system"].startswith(("lockstep", "the same")) else PEER_COLOURS[i % 4] for i, r in enumerate(rows)]
    for i, v in enumerate(values):
        if v is not None:
            ax.bar(i, v, 0.6, color=colours[i])
            ax.annotate(f"{v:.2f}×", (i, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
    for y, label in [(2.0, "linear"), (1.7, "goal 1.7")]:
        ax.axhline(y, color="#555555", lw=0.8, ls="--")
        ax.annotate(label, (len(rows) - 0.55, y), fontsize=7, color="#555555", va="bottom", ha="right")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel("speedup, 2 replicas over 1", fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_ylim(0, 2.3)
    ax.set_title("Data parallelism (config M, batch 256): each system's 2-replica speedup", fontsize=9)
    save(fig, path)


def mainjob_chart(rows, path):
    fig, ax = plt.subplots(figsize=(8, 3.6))
    groups = [re.sub(r" \(`.*`\)", "", r["system"]).replace("`", "").replace(", ", "\n", 1).replace(" with ", "\nwith ")
              for r in rows]
    values = [number(r["wall s"]) for r in rows]
    for i, (r, v) in enumerate(zip(rows, values)):
        if v is None:
            continue
        ours = r["system"].startswith(("lockstep", "the same"))
        ax.bar(i, v, 0.6, color=LOCKSTEP if ours else PEER_COLOURS[i % 4])
        ratio = r["its time / lockstep's"]
        label = f"{v:.0f} s" + ("" if ratio.startswith("—") else f"\n{ratio} lockstep's")
        ax.annotate(label, (i, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=7)
    ax.set_ylabel("wall seconds, 20 epochs", fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_ylim(0, max(v for v in values if v is not None) * 1.25)
    ax.set_title("Main job, Fashion-MNIST end to end: wall time (and each peer's time over lockstep's)", fontsize=9)
    save(fig, path)


def allreduce_chart(rows, path):
    groups = [r["size"] for r in rows]
    series = [("threads / gloo", [number(r["threads / gloo"]) for r in rows]),
              ("processes / gloo", [number(r["processes / gloo"]) for r in rows]),
              ("processes / MPI_Allreduce", [number(r["processes / MPI"]) for r in rows])]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bars(ax, groups, series, [LOCKSTEP, "#5fa8c4", PEER_COLOURS[2]], "ratio of bus bandwidth", [(1.0, "parity"), (3.0, "goal: 3× gloo")])
    ax.set_title("All-reduce between 2 replicas: lockstep's bandwidth over gloo's and Open MPI's", fontsize=9)
    save(fig, path)


def pipeline_chart(rows, path):
    groups = ["lockstep", "tf.data"]
    by = {("lockstep" if r["pipeline"].startswith("lockstep") else "tf.data"): r for r in rows}
    fig, ax = plt.subplots(figsize=(8, 3.2))
    values = [number(by[g]["sample GB/s"]) if g in by else None for g in groups]
    for i, v in enumerate(values):
        if v is not None:
            ax.bar(i, v, 0.5, color=LOCKSTEP if i == 0 else PEER_COLOURS[0])
            ax.annotate(f"{v:.2f} GB/s", (i, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
    ratio = by.get("tf.data", {}).get("lockstep / it", "—")
    ax.set_xticks(range(2))
    ax.set_xticklabels([f"lockstep ({ratio} tf.data)", "tf.data"], fontsize=8)
    ax.set_ylabel("sample GB/s", fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_ylim(0, max([v for v in values if v is not None] + [0.1]) * 1.25)
    ax.set_title("Input pipeline (shuffle, batch, scale, prefetch): samples delivered per second, in GB/s", fontsize=9)
    save(fig, path)


def compile_chart(rows, path):
    groups = ["main job's MLP", "LeNet-size CNN"][: len(rows)]
    ratios = [r["lockstep / dlib (time / memory)"].split(" / ") for r in rows]
    series = [("compile time, lockstep / dlib", [number(t[0]) for t in ratios]),
              ("peak memory, lockstep / dlib", [number(t[1]) if len(t) > 1 else None for t in ratios])]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    bars(ax, groups, series, [LOCKSTEP, "#5fa8c4"], "lockstep / dlib", [(1.0, "dlib"), (0.5, "goal 0.5")])
    ax.set_title("Compile cost of one translation unit: lockstep over dlib (lower is better)", fontsize=9)
    save(fig, path)


CHARTS = [("Single-device training step", "bench-step.png", step_chart),
          ("Data parallelism, 2 replicas", "bench-scaling.png", scaling_chart),
          ("Main job: Fashion-MNIST end to end", "bench-mainjob.png", mainjob_chart),
          ("All-reduce between 2 replicas", "bench-allreduce.png", allreduce_chart),
          ("Input pipeline", "bench-pipeline.png", pipeline_chart),
          ("Compile cost", "bench-compile.png", compile_chart)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", required=True, help="the benchmarks page whose tables are drawn")
    ap.add_argument("--out", required=True, help="directory of the PNG files")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    found = tables(a.page)
    for title, name, draw in CHARTS:
        if not found.get(title):
            print(f"charts.py: no table '{title}' in {a.page}; {name} not drawn")
            continue
        draw(found[title], os.path.join(a.out, name))


if __name__ == "__main__":
    main()
