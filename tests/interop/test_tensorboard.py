"""TensorBoard reads back what lockstep writes: every tag, step and value, through the path of its
scalar dashboard (EventAccumulator.Reload().Scalars(tag)); a writer killed with SIGKILL loses at
most its last record."""
import argparse
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(directory):
    """Every scalar TensorBoard finds in `directory`: {tag: [(step, value), ...]}."""
    ea = EventAccumulator(directory, size_guidance={"scalars": 0})  # 0: keep every event
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def check_known_scalars(tool, work):
    d = fresh(os.path.join(work, "scalars"))
    subprocess.run([tool, "scalars", d], check=True)
    got = scalars(d)
    want = {"a/sine": [], "a/square": [], "b/neg": []}
    for step in range(100):
        want["a/sine"].append((3 * step, np.float32(np.sin(0.1 * step))))
        want["a/square"].append((3 * step, np.float32(step * step)))
        want["b/neg"].append((3 * step, np.float32(-1.5 - step)))
    want["c/large_step"] = [(1 << 40, np.float32(0.25))]
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for tag, series in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in series], tag
        for (_, v), (_, w) in zip(got[tag], series):
            assert np.float32(v) == w, (tag, v, w)
    print("known scalars: %d tags, %d values read back exactly" % (len(want), sum(map(len, want.values()))))


def check_fit(tool, work):
    d = fresh(os.path.join(work, "fit"))
    expected = os.path.join(work, "fit-expected.txt")
    subprocess.run([tool, "fit", d, expected], check=True)
    want = {}
    with open(expected) as f:
        for line in f:
            tag, step, value = line.split()
            want.setdefault(tag, {})[int(step)] = np.float32(float(value))
    got = scalars(d)
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for tag, series in want.items():
        steps = [s for s, _ in got[tag]]
        assert steps == sorted(series), (tag, steps, sorted(series))
        for step, value in got[tag]:
            assert np.float32(value) == series[step], (tag, step, value, series[step])
    print("fit: %d tags, %d values read back exactly" % (len(want), sum(map(len, want.values()))))


def check_restart(tool, work):
    """A restart (SessionLog START at step 6, as a resumed fit writes) replaces the earlier file's
    steps 6 and later: each step shows once, with the resumed run's value."""
    d = fresh(os.path.join(work, "restart"))
    subprocess.run([tool, "restart", d], check=True)
    assert len([f for f in os.listdir(d) if "tfevents" in f]) == 2
    got = scalars(d)["restart"]
    want = [(s, np.float32(s if s < 6 else s + 100)) for s in range(10)]
    assert [(s, np.float32(v)) for s, v in got] == want, got
    print("restart at step 6: steps 0..9 once each, 6..9 from the resumed run")


def check_kill(tool, work, stop_after):
    d = fresh(os.path.join(work, "kill-%d" % stop_after))
    p = subprocess.Popen([tool, "count", d], stdout=subprocess.PIPE, text=True)
    acknowledged = -1
    for line in p.stdout:
        acknowledged = int(line)  # this record's write() had returned
        if acknowledged >= stop_after:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    got = scalars(d)["count"]
    steps = [s for s, _ in got]
    assert steps == list(range(len(steps))), "the records read back are not 0, 1, 2, ..."
    assert all(np.float32(v) == s for s, v in got)
    assert len(steps) >= acknowledged + 1, (len(steps), acknowledged)
    print("SIGKILL after record %d: %d records read back (every acknowledged one)" % (acknowledged, len(steps)))


def check_torn_record(work):
    """A record cut short (a write the kill interrupted) costs that record only."""
    src = os.path.join(work, "kill-400")
    name = [f for f in os.listdir(src) if "tfevents" in f][0]
    whole = len(scalars(src)["count"])
    data = open(os.path.join(src, name), "rb").read()
    for cut in (1, 5, 13, 20):  # inside the last record's CRC, data, and length fields
        d = fresh(os.path.join(work, "torn-%d" % cut))
        with open(os.path.join(d, name), "wb") as f:
            f.write(data[:-cut])
        got = scalars(d)["count"]
        assert [s for s, _ in got] == list(range(whole - 1)), (cut, len(got), whole)
    print("a file whose last record is cut short reads back all %d records before it" % (whole - 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    check_known_scalars(a.tool, a.work)
    check_fit(a.tool, a.work)
    check_restart(a.tool, a.work)
    for n in (1, 57, 400):
        check_kill(a.tool, a.work, n)
    check_torn_record(a.work)
    print("interop tensorboard: passed")


if __name__ == "__main__":
    sys.exit(main())
