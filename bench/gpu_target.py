"""A deployed model on a device, with its own record of every tensor, for bench/gpu.py.

Run: python gpu_target.py OUTDIR --model cnn|gpt2 [--device cuda|cpu]
Builds the model on the device, serves one request, and writes OUTDIR/truth.json (for every state_dict tensor:
data_ptr, byte count, dtype, shape, sha256 of its bytes, device), request.safetensors and response.safetensors (the
response copied to the CPU). Prints READY and waits on stdin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch
from safetensors.torch import save_file
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--model", default="cnn")
ap.add_argument("--device", default="cuda")
a = ap.parse_args()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.GELU(),
            nn.AdaptiveAvgPool2d(1))  # fmt: skip
        self.head = nn.Linear(64, 10)
        self.half_head = nn.Linear(64, 10).to(torch.float16)
        self.emb = nn.Embedding(100, 16).to(torch.bfloat16)
        self.register_buffer("scale", torch.tensor([0.5]))
        self.register_buffer("steps", torch.arange(8, dtype=torch.int64))

    def forward(self, x):
        h = self.features(x).flatten(1)
        return (self.head(h) + self.half_head(h.half()).float()) * self.scale


if a.model == "cnn":
    model = Net()
    request = torch.randn(2, 3, 32, 32)
elif a.model == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config())
    request = torch.randint(0, 50257, (1, 16))
else:
    sys.exit(f"unknown model {a.model}")
model = model.to(a.device).eval()
with torch.no_grad():
    y = model(request.to(a.device))
y = y.logits if hasattr(y, "logits") else y
if a.device.startswith("cuda"):
    torch.cuda.synchronize()
save_file({"x": request}, os.path.join(a.out, "request.safetensors"))
save_file({"x": y.detach().cpu().contiguous()}, os.path.join(a.out, "response.safetensors"))

tensors = {}
for k, t in model.state_dict(keep_vars=True).items():
    d = t.detach()
    raw = d.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if d.numel() else b""
    tensors[k] = {"ptr": d.data_ptr(), "nbytes": len(raw), "dtype": str(d.dtype).replace("torch.", ""),
                  "shape": list(d.shape), "sha256": hashlib.sha256(raw).hexdigest(), "device": str(d.device)}  # fmt: skip
info = {"pid": os.getpid(), "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "model": a.model, "device": a.device, "tensors": tensors}  # fmt: skip
if a.device.startswith("cuda"):
    info.update(gpu=torch.cuda.get_device_name(0), mem_allocated=torch.cuda.memory_allocated(),
                mem_reserved=torch.cuda.memory_reserved())  # fmt: skip
with open(os.path.join(a.out, "truth.json"), "w") as fh:
    json.dump(info, fh, indent=1)
print("READY", flush=True)
sys.stdin.read()
