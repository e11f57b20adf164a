#!/usr/bin/env python3
"""PyTorch on GPU 0, on the work bench_cuda_mlp times for lockstep, one key=value line each:

  torch_config=L precision=fp32|tf32|bf16  MLP config L (1024-4096-4096-1024, ReLU, batch 512,
                                           cross-entropy, SGD): FP32 with TF32 off, FP32 with TF32
                                           on, and bf16 autocast
  torch_cnn batch=256 precision=fp32       the Fashion-MNIST example's CNN (conv 5x5 32, pool,
                                           conv 5x5 64, pool, dense 1024, dense 10), cuDNN, TF32 off

Each step reads the loss on the host (one synchronisation per step, as lockstep's step does)."""
import sys
import time

try:
    import torch
except ImportError:
    print("torch_config=L skipped: no torch")
    sys.exit(0)
if not torch.cuda.is_available():
    print("torch_config=L skipped: torch sees no CUDA device")
    sys.exit(0)

dev = torch.device("cuda:0")
torch.backends.cudnn.benchmark = True


def timed(model, x, y, steps, autocast_dtype=None):
    """Samples per second and step time of `steps` SGD steps after 3 untimed ones; the first and
    last timed loss."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    def step():
        opt.zero_grad(set_to_none=True)
        if autocast_dtype is None:
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast("cuda", dtype=autocast_dtype):
                loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item() / x.shape[0]

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    first = last = 0.0
    for i in range(steps):
        last = step()
        if i == 0:
            first = last
    torch.cuda.synchronize()
    s = time.perf_counter() - t0
    return x.shape[0] * steps / s, 1e3 * s / steps, first, last


def mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 1024)).to(dev)


def cnn():
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(3136, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)).to(dev)


def main():
    torch.manual_seed(1)
    x = torch.rand(512, 1024, device=dev) - 0.5
    y = torch.randint(0, 1024, (512,), device=dev)
    for precision in ("fp32", "tf32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        rate, ms, first, last = timed(mlp(), x, y, 20, torch.bfloat16 if precision == "bf16" else None)
        print(f"torch_config=L precision={precision} samples_per_s={rate:.0f} step_ms={ms:.3f} "
              f"loss_first={first:.4f} loss_last={last:.4f} torch={torch.__version__}", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x = torch.rand(256, 784, device=dev) - 0.5
    y = torch.randint(0, 10, (256,), device=dev)
    rate, ms, first, last = timed(cnn(), x, y, 10)
    print(f"torch_cnn batch=256 precision=fp32 samples_per_s={rate:.0f} step_ms={ms:.3f} "
          f"loss_first={first:.4f} loss_last={last:.4f} cudnn={torch.backends.cudnn.version()}", flush=True)


main()
