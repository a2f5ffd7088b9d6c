"""The demo's "deployed DL system": a small image classifier with custom code, serving requests.

Started by `zen demo` as a separate process: it builds the model, runs inference on a fixed input,
writes what it knows about itself to OUTDIR/truth.json, prints READY and waits on stdin. zen then
images this process and recovers what it can without ever importing this file.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

torch.manual_seed(1234)
torch.set_num_threads(1)


def channel_shuffle(x, groups):
    """A custom helper the model calls from forward: the kind of code zen must recover."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleBlock(nn.Module):
    def __init__(self, channels, groups=2):
        super().__init__()
        self.groups = groups
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(channel_shuffle(x, self.groups)))) + x


class TinyClassifier(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(ShuffleBlock(16), ShuffleBlock(16, groups=4))
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def main(outdir: str) -> None:
    model = TinyClassifier().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        y = model(x)
    import hashlib

    digests = {k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest() for k, v in model.state_dict().items()}
    truth = {
        "pid": os.getpid(),
        "state_sha256": digests,
        "model_id": id(model),
        "modules": {name or "<root>": type(m).__qualname__ for name, m in model.named_modules()},
        "parameters": sum(p.numel() for p in model.parameters()),
        "prediction": int(y.argmax()),
    }
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    print("READY", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1])
