"""A process whose model calls functions that a decorator replaced by instances of a class made inside a function.

Run: python local_class_target.py OUTDIR
kernels (a dependency of transformers 5.25) does this to `apply_rotary_pos_emb`: `use_kernel_forward_from_hub`
makes a class `Func` inside `_create_func_module`, names it after the function's module, and leaves an instance
in the function's place; `use_kernelized_func` gives each layer more instances in a dict attribute. Here the same
shape without kernels: kfunc_lib.py holds the decorator, kfunc_model.py the model (both written to OUTDIR and
imported from there). Writes OUTDIR/truth.json (the model id and the model-specific code from live objects,
code_truth.py) and OUTDIR/kfunc.io.pt (an input and the model's output on it).
"""

from __future__ import annotations

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import code_truth  # noqa: E402

LIB = """
from torch import nn


def _create_func_module(func):
    class Func(nn.Module):
        scale = 1.0

        def forward(self, *args, **kwargs):
            return func(*args, **kwargs) * self.scale

    Func.__module__ = func.__module__  # as kernels does, for pickle
    return Func


def as_module(func):
    return _create_func_module(func)()
"""

MODEL = """
import torch
from torch import nn

from kfunc_lib import as_module


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


@as_module
def mix(x):
    return x + 0.5 * rotate_half(x)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self._funcs = {"mix": type(mix)()}  # a plain dict attribute, not submodules (kernels' _kernel_funcs)

    def forward(self, x):
        return self._funcs["mix"](self.lin(x)) + mix(x)


class KNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.blocks(x))
"""

KEEP: list = []


def main(outdir: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for name, text in (("kfunc_lib", LIB), ("kfunc_model", MODEL)):
        with open(os.path.join(outdir, f"{name}.py"), "w") as fh:
            fh.write(text)
    sys.path.insert(0, outdir)
    import kfunc_model

    model = kfunc_model.KNet().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        y = model(x)
    torch.save({"input": x, "output": y}, os.path.join(outdir, "kfunc.io.pt"))
    info, _codes = code_truth.model_truth(code_truth.Truth(), model)
    info["model_id"] = id(model)
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump({"pid": os.getpid(), "models": {"kfunc": info}}, fh)
    KEEP.append((model, x, y))
    print("READY", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1])
