"""The demo's public base model: the open-source code a team forked to build the deployed model.

A tiny residual image classifier. `zen demo` runs it in its own process (`serve`), images that
process and adds the recovered model to a base-model library; the deployed model (deployed_model.py,
a customised fork) is then attributed to it, diffed against it, and rebuilt by patching this
module's code in a fresh process.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, channels, groups=2):
        super().__init__()
        self.groups = groups
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


class TinyClassifier(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Block(16), Block(16, groups=4))
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def serve(outdir: str) -> None:
    from zen.demo.serving import serve_model

    serve_model(TinyClassifier(), outdir, seed=7)
