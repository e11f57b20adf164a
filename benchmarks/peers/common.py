"""Shared by the peer benchmarks: thread limits, the Fashion-MNIST reader, the networks' widths,
timing and the result lines that benchmarks/run.sh parses.

Every script prints `RESULT key=value ...` lines (values without spaces) and, when a measurement
cannot be made, `RESULT ... skipped=<reason>`.
"""
import gzip
import os
import sys
import time

# The configurations of benchmarks/bench_step.cpp: widths and batch (ReLU between dense layers,
# softmax cross-entropy, plain SGD with lr 1e-4).
STEP_CONFIGS = {
    "S": ([784, 128, 10], 64),
    "M": ([784, 512, 512, 10], 256),
    "L": ([1024, 4096, 4096, 1024], 512),
}
DATA_DIR = os.environ.get("LOCKSTEP_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


def limit_threads(n):
    """Caps every thread pool a framework may start at n threads; call before importing it."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ[var] = str(n)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def result(**kv):
    """Prints one result line."""
    print("RESULT " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)


def read_idx(split):
    """(images uint8 [n, 784], labels int64 [n]) of a Fashion-MNIST split, read and decoded from
    its gz files with numpy."""
    import numpy as np
    with gzip.open(os.path.join(DATA_DIR, f"{split}-images-idx3-ubyte.gz"), "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[4:8], "big")
    images = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 784)
    with gzip.open(os.path.join(DATA_DIR, f"{split}-labels-idx1-ubyte.gz"), "rb") as f:
        raw = f.read()
    labels = np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64)
    return images, labels


def best_rate(run, samples_per_call, repeats, calls):
    """Best samples/s over `repeats` wall-clock repeats of `calls` back-to-back calls of run()."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - t0) / calls)
    return samples_per_call / best


def arg(name, default=None):
    """The value after `--name` on the command line, or default."""
    flag = "--" + name
    if flag in sys.argv:
        return sys.argv[sys.argv.index(flag) + 1]
    return default
