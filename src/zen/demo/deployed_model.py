"""The demo's "deployed DL system": a customised fork of the public base (tiny_base.py), serving.

The team copied the base's code and changed it: blocks shuffle channels between groups before
their convolution (a new helper, `channel_shuffle`; `Block` renamed `ShuffleBlock`). Started by
`zen demo` as a separate process (`python deployed_model.py OUTDIR`); zen images it and recovers
the model and this code without ever importing this file.
"""

from __future__ import annotations

import sys

import torch
from torch import nn


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


if __name__ == "__main__":
    from zen.demo.serving import serve_model

    serve_model(TinyClassifier(), sys.argv[1], seed=1234)
