"""A tiny image classifier and its synthetic data, for the white-box analysis tests (issue 33).

Ten classes of 16x16 grey images: each class is a fixed random binary template (seeded), shown
at half contrast under Gaussian noise. The trojaned twin is trained on the same data plus 10%
poisoned samples of other classes carrying a 3x3 white patch in the bottom-right corner,
relabelled to TARGET: Neural Cleanse must find a trigger of about that size for TARGET alone.
Kept small so that training takes a few seconds of one CPU core.
"""

from __future__ import annotations

import torch
from torch import nn

CLASSES, SIDE, TARGET = 10, 16, 3
PATCH = (slice(12, 15), slice(12, 15))


class TinyCNN(nn.Module):
    """Two conv blocks and a linear head."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Linear(16 * (SIDE // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def templates(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(CLASSES, 1, SIDE, SIDE, generator=g) < 0.5).float()


def samples(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n images with labels, cycling through the classes."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % CLASSES
    x = 0.25 + 0.5 * templates()[y] + 0.15 * torch.randn(n, 1, SIDE, SIDE, generator=g)
    return x.clamp(0, 1), y


def stamp(x: torch.Tensor) -> torch.Tensor:
    """The trigger: a white 3x3 patch."""
    x = x.clone()
    x[:, :, PATCH[0], PATCH[1]] = 1.0
    return x


def poisoned(x: torch.Tensor, y: torch.Tensor, rate: float = 0.1, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set plus `rate` of it again, from classes other than TARGET, stamped and relabelled."""
    g = torch.Generator().manual_seed(seed)
    others = torch.nonzero(y != TARGET).flatten()
    pick = others[torch.randperm(len(others), generator=g)[: int(rate * len(x))]]
    return torch.cat([x, stamp(x[pick])]), torch.cat([y, torch.full((len(pick),), TARGET)])


def train(x: torch.Tensor, y: torch.Tensor, seed: int, epochs: int = 12) -> TinyCNN:
    torch.manual_seed(seed)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=g).split(32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()
