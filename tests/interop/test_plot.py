"""scripts/plot.py draws lockstep metrics files (two runs in one file, a run without validation,
NaN written as null) into a PNG, and refuses a file that is not one."""
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
    print("interop plot: passed")


if __name__ == "__main__":
    sys.exit(main())
