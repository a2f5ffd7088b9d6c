"""Mobile family base: a MobileNetV2-like network of inverted residual blocks."""

import torch
from torch import nn


def make_divisible(v, divisor=4):
    return max(divisor, int(v + divisor / 2) // divisor * divisor)


class ConvBNAct(nn.Sequential):
    def __init__(self, cin, cout, kernel=3, stride=1, groups=1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()
        )


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = make_divisible(cin * expand)
        self.use_res = stride == 1 and cin == cout
        self.expand = ConvBNAct(cin, hidden, kernel=1)
        self.depthwise = ConvBNAct(hidden, hidden, stride=stride, groups=hidden)
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.use_res else y


class MobileNet(nn.Module):
    def __init__(self, classes=10, width_mult=1.0):
        super().__init__()
        c = make_divisible(8 * width_mult)
        blocks = [ConvBNAct(3, c, stride=2)]
        for t, cout, n, s in ((1, 8, 1, 1), (4, 12, 2, 2), (4, 16, 2, 1)):
            cout = make_divisible(cout * width_mult)
            for i in range(n):
                blocks.append(InvertedResidual(c, cout, s if i == 0 else 1, t))
                c = cout
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(c, classes))

    def forward(self, x):
        x = self.features(x).mean(dim=(2, 3))
        return self.classifier(x)


def build(seed=0):
    torch.manual_seed(seed)
    return MobileNet().eval(), torch.randn(2, 3, 16, 16)
