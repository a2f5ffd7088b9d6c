"""ConvNet family base: a small ResNet-like classifier (test-tree family, issues 4-7)."""

import torch
import torch.nn.functional as F
from torch import nn


def conv_bn(cin, cout, stride=1, kernel=3):
    """A convolution followed by batch normalisation."""
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout))


def make_layer(cin, cout, blocks, stride):
    layers = [BasicBlock(cin, cout, stride)]
    for _ in range(blocks - 1):
        layers.append(BasicBlock(cout, cout, 1))
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = conv_bn(cin, cout, stride)
        self.conv2 = conv_bn(cout, cout)
        self.shortcut = conv_bn(cin, cout, stride, kernel=1) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        out = F.relu(self.conv1(x))
        out = self.conv2(out)
        return F.relu(out + self.shortcut(x))


class ConvNet(nn.Module):
    def __init__(self, classes=10, width=8):
        super().__init__()
        self.stem = conv_bn(3, width)
        self.layer1 = make_layer(width, width, 2, 1)
        self.layer2 = make_layer(width, width * 2, 2, 2)
        self.head = nn.Linear(width * 2, classes)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = self.layer2(self.layer1(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(seed=0):
    torch.manual_seed(seed)
    return ConvNet().eval(), torch.randn(2, 3, 16, 16)
