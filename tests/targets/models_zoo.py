"""Model definitions shared by the target processes and the tests (which rebuild fresh copies).

Each factory returns (model, example_input). Everything is seeded, so a fresh copy built in the
test process has the same architecture; its weights come from what zen recovered.
"""

from __future__ import annotations

import torch
from families.hf import HF, build_hf  # noqa: F401  (bench/families, on the importer's sys.path)
from torch import nn


class ConvBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.2)
        self.act = nn.ReLU(inplace=False)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class CNN(nn.Module):
    """A small CNN with BatchNorm buffers, a residual connection and a Sequential."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = ConvBlock(3, 8)
        self.body = nn.Sequential(ConvBlock(8, 8), ConvBlock(8, 16, stride=2))
        self.skip = nn.Conv2d(8, 16, 1, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, classes)
        self.dropout_p = 0.1

    def forward(self, x):
        x = self.stem(x)
        y = self.body(x) + self.skip(x)
        return self.head(torch.flatten(self.pool(y), 1))


class TiedLM(nn.Module):
    """Embedding and output projection share one Parameter (GPT-2 style weight tying)."""

    def __init__(self, vocab=50, dim=12):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        return self.out(torch.tanh(self.mix(self.embed(ids))))


class Mixed(nn.Module):
    """Tensors of several dtypes: fp32, fp16, bf16, int8 and bool."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6).half()
        self.c = nn.Linear(6, 6).to(torch.bfloat16)
        self.register_buffer("qscale", torch.arange(-8, 8, dtype=torch.int8))
        self.register_buffer("mask", torch.tensor([True, False, True, True, False, True]))
        self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))

    def forward(self, x):
        x = self.a(x) * self.mask
        x = self.b(x.half()).float()
        x = self.c(x.to(torch.bfloat16)).float()
        return x + self.qscale[:6].float()


class Odd(nn.Module):
    """A transposed (non-contiguous) parameter, a 7-dim buffer, a non-persistent buffer, a None
    bias, a submodule registered twice, a plain tensor attribute that is not registered, and a list of
    tensors in one attribute."""

    def __init__(self):
        super().__init__()
        self.wt = nn.Parameter(torch.randn(4, 6).t())  # shape (6, 4), strides (1, 6)
        self.register_buffer("grid", torch.randn(2, 1, 3, 1, 2, 1, 2))  # more dims than inline slots
        self.register_buffer("cache", torch.zeros(3), persistent=False)
        self.proj = nn.Linear(4, 4, bias=False)
        shared = nn.Linear(4, 4)
        self.first = shared
        self.second = shared
        self.register_parameter("unused", None)
        self.scratch = torch.ones(2)  # not a buffer: not in state_dict
        self.anchors = [torch.ones(2), torch.zeros(3)]  # several tensors in one attribute (torchvision's anchors)
        self.register_buffer("table", torch.randn(256, 512))  # 512 KiB: malloc gives it its own mapping

    def forward(self, x):
        x = self.proj(x @ self.wt)
        return self.second(self.first(x)) + self.grid.sum() + self.table[0, :4]


class OnDevice(nn.Module):
    """A buffer on the meta device: shape and dtype exist, data does not (like a GPU tensor)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("ghost", torch.empty(4, 5, device="meta"))

    def forward(self, x):
        return self.lin(x)


def build(name: str):
    """(model in eval mode, example input) for a zoo model, deterministic."""
    torch.manual_seed({"cnn": 1, "tied": 2, "mixed": 3, "odd": 4, "ondevice": 5}[name])
    if name == "cnn":
        return CNN().eval(), torch.randn(2, 3, 16, 16)
    if name == "tied":
        return TiedLM().eval(), torch.randint(0, 50, (2, 7))
    if name == "mixed":
        return Mixed().eval(), torch.randn(3, 6)
    if name == "odd":
        return Odd().eval(), torch.randn(5, 6)
    if name == "ondevice":
        return OnDevice().eval(), torch.randn(2, 3)
    raise KeyError(name)


ZOO = ["cnn", "tied", "mixed", "odd", "ondevice"]
