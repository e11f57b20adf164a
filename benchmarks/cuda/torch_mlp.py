#!/usr/bin/env python3
"""PyTorch on GPU 0, on the work bench_cuda_mlp times for lockstep, one key=value line each:

  torch_config=L precision=fp32|tf32|bf16  MLP config L (1024-4096-4096-1024, ReLU, batch 512,
                                           cross-entropy, SGD): FP32 with TF32 off, FP32 with TF32
                                           on, and bf16 autocast
  torch_cnn batch=256 precision=fp32       the Fashion-MNIST example's CNN (conv 5x5 32, pool,
                                           conv 5x5 64, pool, dense 1024, dense 10), cuDNN, TF32 off
  torch_cnn_bn batch=256 precision=fp32    the same with BatchNorm2d after each convolution

The best of three runs of 50 timed steps after 3 untimed ones; the loss (the batch's mean) stays
on the device until the end (no step waits for its own work, as lockstep's steps with
defer_readback do)."""
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
    """Samples per second and step time of the best of three runs of `steps` SGD steps, after 3
    untimed ones; the first and the last timed loss."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()  # the batch's mean, as lockstep's gradient is

    def step():  # the loss stays on the device: no step waits for its own work
        opt.zero_grad(set_to_none=True)
        if autocast_dtype is None:
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast("cuda", dtype=autocast_dtype):
                loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    best = float("inf")
    first = last = None
    for _ in range(3):  # the best of three timed runs
        t0 = time.perf_counter()
        for i in range(steps):
            last = step()
            if first is None:
                first = last
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return x.shape[0] * steps / best, 1e3 * best / steps, first.item(), last.item()


def tf32(on):
    """TF32 tensor cores for FP32 matrix products and convolutions, on or off."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 1024)).to(dev)


def cnn(batch_norm=False):
    def norm(channels):
        return [torch.nn.BatchNorm2d(channels)] if batch_norm else []
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 32, 5, padding=2), *norm(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 5, padding=2), *norm(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(3136, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)).to(dev)


def main():
    torch.manual_seed(1)
    x = torch.rand(512, 1024, device=dev) - 0.5
    y = torch.randint(0, 1024, (512,), device=dev)
    for precision in ("fp32", "tf32", "bf16"):
        tf32(precision == "tf32")
        rate, ms, first, last = timed(mlp(), x, y, 50, torch.bfloat16 if precision == "bf16" else None)
        print(f"torch_config=L precision={precision} samples_per_s={rate:.0f} step_ms={ms:.3f} "
              f"loss_first={first:.4f} loss_last={last:.4f} torch={torch.__version__}", flush=True)
    tf32(False)
    x = torch.rand(256, 784, device=dev) - 0.5
    y = torch.randint(0, 10, (256,), device=dev)
    for name, batch_norm in (("torch_cnn", False), ("torch_cnn_bn", True)):
        rate, ms, first, last = timed(cnn(batch_norm), x, y, 50)
        print(f"{name} batch=256 precision=fp32 samples_per_s={rate:.0f} step_ms={ms:.3f} "
              f"loss_first={first:.4f} loss_last={last:.4f} cudnn={torch.backends.cudnn.version()}", flush=True)


main()
