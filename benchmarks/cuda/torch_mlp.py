#!/usr/bin/env python3
"""MLP config L (1024-4096-4096-1024, ReLU, batch 512, cross-entropy, SGD) trained by PyTorch on
GPU 0 in FP32 (TF32 off): the baseline printed beside lockstep's gpu_config=L line."""
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

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda:0")
batch = 512
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
x = torch.rand(batch, 1024, device=dev) - 0.5
y = torch.randint(0, 1024, (batch,), device=dev)


def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()  # one host synchronisation per step, as in lockstep


for _ in range(3):
    step()
torch.cuda.synchronize()
steps = 20
t0 = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
s = time.perf_counter() - t0
print(f"torch_config=L samples_per_s={steps * batch / s:.0f} step_ms={1e3 * s / steps:.3f} torch={torch.__version__}")
