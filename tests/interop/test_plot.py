"""scripts/plot.py draws lockstep metrics files (two runs in one file, a run without validation,
NaN written as null) into a PNG, and refuses a file that is not one; with --trace it draws one
step of a timeline and names a step that is not in it."""
import argparse
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    one = os.path.join(a.work, "one.jsonl")
    two = os.path.join(a.work, "two.jsonl")
    with open(one, "w") as f:
        for run in range(2):  # the file was appended to by two runs
            for e in range(5):
                f.write(json.dumps({"epoch": e, "step": 10 * (e + 1), "train_loss": 1.0 / (e + 1 + run),
                                    "train_accuracy": 0.5 + 0.05 * e, "val_loss": 1.1 / (e + 1),
                                    "val_accuracy": 0.45 + 0.05 * e, "samples_per_second": 3000 + 10 * e,
                                    "seconds": 1.5, "lr": 1e-3 / (e + 1), "steps": 10, "samples": 640,
                                    "val_samples": 100}) + "\n")
    with open(two, "w") as f:
        for e in range(3):
            f.write(json.dumps({"epoch": e, "step": 7 * (e + 1), "train_loss": 0.9 / (e + 1), "train_accuracy": None,
                                "val_loss": None, "val_accuracy": None, "samples_per_second": 2500, "seconds": 2,
                                "lr": 1e-3, "steps": 7, "samples": 448, "val_samples": 0}) + "\n")
    for x in ("epoch", "step"):
        png = os.path.join(a.work, f"curves-{x}.png")
        subprocess.run([sys.executable, a.script, "--x", x, "--label", "run A", "--label", "run B", "--out", png, one, two],
                       check=True)
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
        size = os.path.getsize(png)
        assert 5_000 < size < 400_000, size
    bad = os.path.join(a.work, "bad.jsonl")
    with open(bad, "w") as f:
        f.write("not json\n")
    r = subprocess.run([sys.executable, a.script, "--out", os.path.join(a.work, "bad.png"), bad], capture_output=True, text=True)
    assert r.returncode != 0 and "bad.jsonl:1" in r.stderr, r.stderr
    # --trace: one step of a timeline, and a step that is not in it named
    trace = os.path.join(a.work, "trace.json")
    events = [{"ph": "M", "pid": 0, "tid": t, "ts": 0, "name": "thread_name", "cat": "__metadata",
               "args": {"name": n}} for t, n in ((0, "replica 0"), (1, "driver"))]
    for step in (10, 11):
        t0 = 1000.0 * step
        events += [{"ph": "X", "pid": 0, "tid": 1, "ts": t0 - 50, "dur": 50, "name": "pipeline wait", "cat": "pipeline",
                    "args": {"step": step}},
                   {"ph": "X", "pid": 0, "tid": 1, "ts": t0, "dur": 900, "name": "train_step", "cat": "step",
                    "args": {"step": step}}]
        events += [{"ph": "X", "pid": 0, "tid": 0, "ts": t0 + 100 * i, "dur": 90, "name": n, "cat": "compute",
                    "args": {"layer": i}} for i, n in enumerate(["forward", "forward", "backward", "backward"])]
        events.append({"ph": "X", "pid": 0, "tid": 0, "ts": t0 + 350, "dur": 300, "name": "reduce bucket",
                       "cat": "communication", "args": {"bucket": 0}})
    with open(trace, "w") as f:
        json.dump({"traceEvents": events}, f)
    png = os.path.join(a.work, "step.png")
    r = subprocess.run([sys.executable, a.script, "--trace", trace, "--step", "11", "--out", png], capture_output=True, text=True)
    assert r.returncode == 0 and "step 11, 7 spans" in r.stdout, r.stdout + r.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
    r = subprocess.run([sys.executable, a.script, "--trace", trace, "--step", "12", "--out", png], capture_output=True, text=True)
    assert r.returncode != 0 and "step 12 is not in the trace" in r.stderr, r.stderr
    print("interop plot: passed")


if __name__ == "__main__":
    sys.exit(main())
