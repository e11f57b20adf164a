"""PyTorch loads lockstep's safetensors files with load_state_dict(strict=True) into the same
network and computes the same eval-mode outputs; lockstep loads files PyTorch wrote (F32, BF16,
F16) and computes the same outputs as PyTorch."""
import argparse
import os
import subprocess
import sys

import numpy as np
import torch
from torch import nn
from safetensors import safe_open
from safetensors.torch import load_file, save_file


class Residual(nn.Sequential):
    """lockstep's residual<...>: y = x + body(x), the body's layers numbered as in a Sequential."""

    def forward(self, x):
        return x + super().forward(x)


def network():
    """The interop network of tests/interop/interop_tool.cpp, layer for layer."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 4, 3, 1, 1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        Residual(nn.Conv2d(4, 4, 3, 1, 1), nn.BatchNorm2d(4), nn.ReLU()),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(64, 16),
        nn.ReLU(),
        nn.Linear(16, 5),
    )


def outputs(model, x):
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def close(got, want, what):
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    assert err <= 1e-5, "%s: outputs differ by %g relative" % (what, err)
    print("%s: %d outputs agree (largest difference %.2g relative)" % (what, want.size, err))


def lockstep_to_torch(tool, work, x_path, x, dtype):
    f = os.path.join(work, "lockstep-%s.safetensors" % dtype)
    y_path = os.path.join(work, "lockstep-%s.out" % dtype)
    subprocess.run([tool, "export", f, dtype, x_path, y_path], check=True)
    state = load_file(f)
    want_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    assert state["1.weight"].dtype == want_dtype and state["8.weight"].shape == (16, 64)
    assert state["2.num_batches_tracked"].dtype == torch.int64 and state["2.num_batches_tracked"].shape == ()
    with safe_open(f, "pt") as s:
        meta = s.metadata()
    assert meta["lockstep.signature"].startswith("0x") and "lockstep.version" in meta, meta
    model = network()
    model.load_state_dict(state, strict=True)  # every key, no extra, every shape
    y = np.fromfile(y_path, dtype=np.float32).reshape(-1, 5)
    close(y, outputs(model, x), "PyTorch loads lockstep's %s file" % dtype.upper())


def torch_to_lockstep(tool, work, x_path, x, dtype):
    torch.manual_seed(7)
    model = network()
    with torch.no_grad():  # batch norm with statistics worth the name
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(11)
    t = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    state = {k: (v.to(t) if v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()}
    f = os.path.join(work, "torch-%s.safetensors" % dtype)
    save_file(state, f)
    # the reference: the same network holding the rounded weights, in fp32
    model.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in state.items()}, strict=True)
    y_path = os.path.join(work, "torch-%s.out" % dtype)
    subprocess.run([tool, "import", f, x_path, y_path], check=True)
    y = np.fromfile(y_path, dtype=np.float32).reshape(-1, 5)
    close(y, outputs(model, x), "lockstep loads PyTorch's %s file" % dtype.upper())


def torch_file_refused(tool, work, x_path):
    state = network().state_dict()
    del state["4.1.running_var"]
    f = os.path.join(work, "torch-missing.safetensors")
    save_file({k: v.contiguous() for k, v in state.items()}, f)
    r = subprocess.run([tool, "import", f, x_path, os.path.join(work, "unused.out")], capture_output=True, text=True)
    assert r.returncode != 0 and "4.1.running_var" in r.stderr, r.stderr
    print("a file without 4.1.running_var is refused: " + r.stderr.strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    x = np.random.default_rng(3).normal(size=(32, 64)).astype(np.float32)
    x_path = os.path.join(a.work, "x.in")
    x.tofile(x_path)
    for dtype in ("f32", "bf16", "f16"):
        lockstep_to_torch(a.tool, a.work, x_path, x, dtype)
    for dtype in ("f32", "bf16", "f16"):
        torch_to_lockstep(a.tool, a.work, x_path, x, dtype)
    torch_file_refused(a.tool, a.work, x_path)
    print("interop safetensors: passed (torch %s)" % torch.__version__)


if __name__ == "__main__":
    sys.exit(main())
