"""The evaluation scenario set: three model families, each a base and its customised forks (the
transformers/peft scenarios are in `hf.py`). Used by the tests and by `bench/run_families.py`.

A fork is its base's source with textual patches applied (what a team forking a repository
does): added classes, changed forward methods, new helper functions, renamed layers and classes,
wider layers. `materialize(name, directory)` writes the module file a target process imports, so
the repository holds each base once and every fork as a small, reviewable patch.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Variant:
    name: str
    base: str  # family base module (file in this directory)
    replace: tuple[tuple[str, str], ...] = ()  # (old, new): every occurrence, each must occur
    append: str = ""
    changes: tuple[str, ...] = field(default=())  # what the fork changed, for humans and reports


SE_BLOCK = '''

def se_gate(x):
    """Squeeze-and-excitation gate."""
    return torch.sigmoid(x)


class SEBlock(nn.Module):
    def __init__(self, channels, reduction=4):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, max(1, channels // reduction), 1)
        self.fc2 = nn.Conv2d(max(1, channels // reduction), channels, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * se_gate(self.fc2(F.relu(self.fc1(s))))
'''

GHOST = '''

class GhostModule(nn.Module):
    """Half the channels from a 1x1 conv, half from a cheap depthwise conv of those."""

    def __init__(self, cin, cout, ratio=2):
        super().__init__()
        init = cout // ratio
        self.primary = ConvBNAct(cin, init, kernel=1)
        self.cheap = ConvBNAct(init, cout - init, groups=init)

    def forward(self, x):
        y = self.primary(x)
        return torch.cat([y, self.cheap(y)], dim=1)
'''

LORA = '''

class LoRALinear(nn.Module):
    """A linear layer with a low-rank adapter added to its output."""

    def __init__(self, din, dout, rank=4, alpha=8.0):
        super().__init__()
        self.base = nn.Linear(din, dout)
        self.lora_a = nn.Linear(din, rank, bias=False)
        self.lora_b = nn.Linear(rank, dout, bias=False)
        nn.init.normal_(self.lora_b.weight, std=0.02)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale
'''

ROPE = """

def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(q, k, n):
    d = q.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
"""

VARIANTS = {
    v.name: v
    for v in [
        Variant("convnet", "convnet"),
        Variant("convnet_se", "convnet", (
            ("        self.shortcut = conv_bn(cin, cout, stride, kernel=1) if stride != 1 or cin != cout else nn.Identity()\n",
             "        self.shortcut = conv_bn(cin, cout, stride, kernel=1) if stride != 1 or cin != cout else nn.Identity()\n"
             "        self.se = SEBlock(cout)\n"),
            ("        out = self.conv2(out)\n", "        out = self.se(self.conv2(out))\n"),
        ), SE_BLOCK, ("added class SEBlock", "added helper se_gate", "changed BasicBlock.__init__/forward")),
        Variant("convnet_wide", "convnet", (
            ("def __init__(self, classes=10, width=8):", "def __init__(self, classes=10, width=12):"),
            ("        x = F.relu(self.stem(x))\n", "        x = F.relu6(self.stem(x))\n"),
            ("F.adaptive_avg_pool2d(x, 1)", "F.adaptive_max_pool2d(x, 1)"),
        ), "", ("widened layers", "changed ConvNet.forward")),
        Variant("convnet_renamed", "convnet", (
            ("BasicBlock", "ResidualUnit"), ("conv1", "c1"), ("conv2", "c2"), ("layer1", "stage1"), ("layer2", "stage2"),
        ), "", ("renamed class BasicBlock -> ResidualUnit", "renamed layers")),
        Variant("mobile", "mobile"),
        Variant("mobile_ghost", "mobile", (
            ("        self.expand = ConvBNAct(cin, hidden, kernel=1)\n", "        self.expand = GhostModule(cin, hidden)\n"),
        ), GHOST, ("added class GhostModule", "changed InvertedResidual.__init__")),
        Variant("mobile_wide", "mobile", (
            ("def __init__(self, classes=10, width_mult=1.0):", "def __init__(self, classes=10, width_mult=1.5):"),
            ("        x = self.features(x).mean(dim=(2, 3))\n", "        x = global_pool(self.features(x))\n"),
        ), "\n\ndef global_pool(x):\n    return x.amax(dim=(2, 3))\n",
            ("widened layers", "changed MobileNet.forward", "added helper global_pool")),
        Variant("gptmini", "gptmini"),
        Variant("gptmini_lora", "gptmini", (
            ("        self.qkv = nn.Linear(dim, 3 * dim)\n", "        self.qkv = LoRALinear(dim, 3 * dim)\n"),
        ), LORA, ("added class LoRALinear", "changed SelfAttention.__init__")),
        Variant("gptmini_rope", "gptmini", (
            ("        att = (q @ k.transpose(-2, -1))",
             "        q, k = apply_rope(q, k, n)\n        att = (q @ k.transpose(-2, -1))"),
            ("        x = self.tok(ids) + self.pos(pos)\n", "        x = self.tok(ids)\n"),
            ("        self.pos = nn.Embedding(context, dim)\n", ""),
            ("        pos = torch.arange(ids.shape[1], device=ids.device)\n", ""),
        ), ROPE, ("rotary position embedding (helpers rotate_half, apply_rope)", "removed positional embedding",
                  "changed SelfAttention.forward, GPTMini.__init__/forward")),
    ]
}  # fmt: skip
FAMILIES = {"convnet": ["convnet", "convnet_se", "convnet_wide", "convnet_renamed"],
            "mobile": ["mobile", "mobile_ghost", "mobile_wide"],
            "gptmini": ["gptmini", "gptmini_lora", "gptmini_rope"]}  # fmt: skip


def source(name: str) -> str:
    v = VARIANTS[name]
    text = (HERE / f"{v.base}.py").read_text()
    for old, new in v.replace:
        if old not in text:
            raise ValueError(f"{name}: patch target not found: {old!r}")
        text = text.replace(old, new)
    header = f'"""{name}: fork of {v.base} ({"; ".join(v.changes)})."""\n\n' if v.changes else ""
    return header + text + v.append


def materialize(name: str, directory: Path) -> Path:
    """Write the variant's module to directory/NAME.py and return the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(source(name))
    return path


def load(name: str, directory: Path, module_name: str | None = None):
    """Import a materialized variant as `module_name` (default: its own name)."""
    path = materialize(name, directory)
    mod_name = module_name or name
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod
