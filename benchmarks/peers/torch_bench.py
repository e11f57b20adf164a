#!/usr/bin/env python3
"""PyTorch beside lockstep's benchmarks. One measurement per run:

  torch_bench.py step --config S|M|L|cnn [--precision fp32|bf16] [--repeats N]
                                                        one process, one thread: a training step
                                                        (bf16: torch.autocast("cpu", torch.bfloat16))
  torch_bench.py ddp --replicas 1|2 [--repeats N]       config M at global batch 256: one process,
                                                        or DistributedDataParallel over 2 processes (gloo)
  torch_bench.py mainjob [--epochs E]                   the Fashion-MNIST main job, one process, 2 threads
  torch_bench.py allreduce --mib N [--repeats N]        torch.distributed all_reduce (gloo), 2 processes

Threads: one per process (torch.set_num_threads(1), one inter-op thread), except the main job,
which gets the machine's 2 threads.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

what = sys.argv[1] if len(sys.argv) > 1 else ""
THREADS = 2 if what == "mainjob" else 1
common.limit_threads(THREADS)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

VERSION = f"torch-{torch.__version__}"


def set_threads():
    torch.set_num_threads(THREADS)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process


def dense_stack(widths, dropout=0.0):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
            if dropout:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def cnn():
    """examples/fashion_mnist --model cnn: TensorFlow's layers-tutorial CNN (NCHW)."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 1024), nn.ReLU(), nn.Dropout(0.4), nn.Linear(1024, 10))


def step_bench():
    set_threads()
    config = common.arg("config", "M")
    repeats = int(common.arg("repeats", "10"))
    torch.manual_seed(7)
    if config == "cnn":
        batch, model = 64, cnn()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, classes = torch.rand(batch, 1, 28, 28), 10
    else:
        widths, batch = common.STEP_CONFIGS[config]
        model = dense_stack(widths)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x, classes = torch.rand(batch, widths[0]), widths[-1]
    y = torch.randint(0, classes, (batch,))
    loss_fn = nn.CrossEntropyLoss()
    precision = common.arg("precision", "fp32")
    bf16 = precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        # bf16: autocast's CPU policy (matmuls and convolutions in bf16, fp32 weights and loss).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    step(); step()
    calls = {"S": 20, "M": 2, "L": 1, "cnn": 1}[config]
    rate = common.best_rate(step, batch, repeats, calls)
    common.result(peer="pytorch", bench="step", config=config, batch=batch, samples_per_s=f"{rate:.1f}",
                  threads=torch.get_num_threads(), precision=precision, version=VERSION)


def init_group(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def ddp_worker(rank, world, port, repeats, steps, out):
    set_threads()
    batch = 256
    torch.manual_seed(7)
    x, y = torch.rand(batch, 784), torch.randint(0, 10, (batch,))
    model = dense_stack(common.STEP_CONFIGS["M"][0])
    if world > 1:
        init_group(rank, world, port)
        model = nn.parallel.DistributedDataParallel(model)
        shard = batch // world
        x, y = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    best = float("inf")
    for _ in range(repeats):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if world > 1:
            dist.barrier()
        best = min(best, time.perf_counter() - t0)
    if rank == 0:
        out.put(batch * steps / best)
    if world > 1:
        dist.destroy_process_group()


def ddp_bench():
    replicas = int(common.arg("replicas", "2"))
    repeats, steps = int(common.arg("repeats", "8")), int(common.arg("steps", "40"))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if replicas == 1:
        ddp_worker(0, 1, 0, repeats, steps, out)
    else:
        mp.spawn(ddp_worker, args=(replicas, 29531, repeats, steps, out), nprocs=replicas, join=True)
    common.result(peer="pytorch", bench="ddp", config="M", replicas=replicas, batch=256,
                  samples_per_s=f"{out.get():.1f}", backend="gloo" if replicas > 1 else "none", version=VERSION)


def allreduce_worker(rank, world, port, mib, repeats, out):
    set_threads()
    init_group(rank, world, port)
    data = torch.full(((mib << 20) // 4,), float(rank))
    dist.all_reduce(data)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(data)
        best = min(best, time.perf_counter() - t0)
    if rank == 0:
        out.put(best)
    dist.destroy_process_group()


def allreduce_bench():
    mib, repeats, world = int(common.arg("mib", "16")), int(common.arg("repeats", "10")), 2
    out = mp.get_context("spawn").Queue()
    mp.spawn(allreduce_worker, args=(world, 29532, mib, repeats, out), nprocs=world, join=True)
    algbw = (mib << 20) / out.get() / 1e9
    common.result(peer="pytorch", bench="allreduce", backend="gloo", workers=world, allreduce_bytes=mib << 20,
                  algbw_gb_per_s=f"{algbw:.2f}", busbw_gb_per_s=f"{algbw * 2 * (world - 1) / world:.2f}",
                  version=VERSION)


def mainjob():
    set_threads()
    epochs = int(common.arg("epochs", "20"))
    batch, lr, wd, seed = 128, 1e-3, 0.02, 42
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    tx, ty = common.read_idx("train")
    ex, ey = common.read_idx("t10k")
    train_x, train_y = torch.from_numpy(tx.copy()), torch.from_numpy(ty)
    test_x, test_y = torch.from_numpy(ex.copy()).float().mul_(1.0 / 255), torch.from_numpy(ey)
    model = dense_stack([784, 512, 256, 10], dropout=0.2)
    steps_per_epoch = (60000 + batch - 1) // batch
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd, eps=1e-8)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps_per_epoch, eta_min=0.0)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        order = torch.randperm(60000)
        for s in range(steps_per_epoch):
            idx = order[s * batch:(s + 1) * batch]
            xb = train_x[idx].float().mul_(1.0 / 255)
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), train_y[idx]).backward()
            opt.step()
            sched.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, 10000, 1000):
            correct += int((model(test_x[s:s + 1000]).argmax(1) == test_y[s:s + 1000]).sum())
    wall = time.perf_counter() - t0
    common.result(peer="pytorch", bench="mainjob", mode="one", epochs=epochs, wall_s=f"{wall:.1f}",
                  test_accuracy=f"{correct / 10000:.4f}", threads=torch.get_num_threads(), version=VERSION)


if __name__ == "__main__":
    {"step": step_bench, "ddp": ddp_bench, "mainjob": mainjob, "allreduce": allreduce_bench}[what]()
