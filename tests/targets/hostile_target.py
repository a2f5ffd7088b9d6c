"""A real process whose model is built to break a forensic tool, with its ground truth.

Run: python hostile_target.py OUTDIR
The model holds: itself as a child (`model.me = model`), a 100 MB string attribute, a chain of
modules deeper than zen's default module-depth limit with a weight at the bottom, cyclic and
very deep containers, a huge code object, names with path traversal and HTML markup, and objects
whose dunder hooks (`__repr__`, `__getattr__`, `__eq__`, `__hash__`, `__del__`, `__reduce__`,
`__fspath__`) write a marker file when called: reading the image must never call them. The process
also maps a file whose name is not valid UTF-8 and puts keys of the wrong type into `sys.modules`.
Writes OUTDIR/truth.json (every parameter/buffer reachable without cycles, with sha256 of its data)
and prints READY; waits on stdin.
"""

from __future__ import annotations

import ast
import hashlib
import json
import mmap
import os
import sys
import types

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
OUT = sys.argv[1]
MARKER = os.path.join(OUT, "MARKER-hook-called")
CHAIN_DEPTH = 300  # deeper than zen's default module-depth limit (256)


def _touch(what: str) -> None:
    with open(MARKER, "a") as fh:
        fh.write(what + "\n")


class Trap:
    """Every hook a careless reader might call writes the marker file."""

    def __repr__(self):
        _touch("repr")
        return "Trap"

    def __getattr__(self, name):
        _touch(f"getattr {name}")
        raise AttributeError(name)

    def __eq__(self, other):
        _touch("eq")
        return False

    def __hash__(self):
        _touch("hash")
        return 1

    def __reduce__(self):
        _touch("reduce")
        return (Trap, ())

    def __fspath__(self):
        _touch("fspath")
        return "/tmp/trap"

    def __del__(self):
        pass  # deleting would be the process's business, not the reader's


class Link(nn.Module):
    def __init__(self, inner: nn.Module | None) -> None:
        super().__init__()
        self.inner = inner
        self.scale = nn.Parameter(torch.ones(1))


class Hostile(nn.Module):
    """A small working model under the traps."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)
        # a buffer whose name holds a lone surrogate: its state_dict key cannot be encoded as UTF-8
        self.register_buffer("mark\udc80", torch.arange(4.0))
        self.blob = "A" * 100_000_000  # one huge string attribute
        self.trap = Trap()
        self.traps = [Trap() for _ in range(3)]
        cyc: list = [1, 2]
        cyc.append(cyc)
        d: dict = {"self": None}
        d["self"] = d
        self.cyclic = cyc
        self.cyclic_dict = d
        deep: list = []
        cur = deep
        for _ in range(20_000):
            nxt: list = []
            cur.append(nxt)
            cur = nxt
        self.deep = deep
        self.big_list = list(range(2_000_000))
        self.big_dict = {f"k{i}": i for i in range(200_000)}
        setattr(self, "../../../../tmp/zen-escape", 1)  # noqa: B010 - a name no Python code could write
        setattr(self, "<script>alert('x')</script>", "<img src=x onerror=alert(1)>")  # noqa: B010
        chain: nn.Module | None = None
        for _ in range(CHAIN_DEPTH):
            chain = Link(chain)
        self.chain = chain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).mean(dim=(2, 3))
        return self.fc(surrogate_helper(h))


# model code naming a global whose name holds a lone surrogate (no source could say it; an AST can, and
# CPython keeps it in co_names): its listing is hashed like any other
_tree = ast.parse("def surrogate_helper(h):\n    return h + G\n")
_tree.body[0].body[0].value.right.id = "G\ud800"  # type: ignore[attr-defined]
_ns0: dict = {"G\ud800": 0.0, "__name__": __name__}
exec(compile(ast.fix_missing_locations(_tree), "<surrogate>", "exec"), _ns0)
surrogate_helper = _ns0["surrogate_helper"]

# a huge code object: a function with 200,000 constants in its body
_src = "def huge_code(x):\n    t = (" + ", ".join(str(i) for i in range(200_000)) + ")\n    return x\n"
_ns: dict = {}
exec(compile(_src, "<huge>", "exec"), _ns)
huge_code = _ns["huge_code"]
Hostile.__name__ = "Hostile<b>bold</b>[/bold]"
Hostile.__qualname__ = "Hostile<b>bold</b>[/bold]"


def main() -> None:
    model = Hostile().eval()
    model.me = model  # the module is its own child
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        y = model(x)
    # a mapped file whose name is not valid UTF-8
    bad = os.path.join(os.fsencode(OUT), b"bad-\xff\xfe-name.bin")
    with open(bad, "wb") as fh:
        fh.write(b"\0" * 8192)
    fd = os.open(bad, os.O_RDONLY)
    mapped = mmap.mmap(fd, 8192, prot=mmap.PROT_READ)
    # keys of the wrong type in sys.modules
    sys.modules[b"\xff\xfebytes-key"] = types.ModuleType("bytes_key")  # type: ignore[index]
    sys.modules[12345] = types.ModuleType("int_key")  # type: ignore[index]
    sys.modules["evil\udcffname"] = types.ModuleType("evil\udcffname")
    state = []
    for k, v in _state(model):
        data = v.detach().contiguous().numpy().tobytes()
        state.append({"key": k, "dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                      "sha256": hashlib.sha256(data).hexdigest()})  # fmt: skip
    truth = {"pid": os.getpid(), "id": id(model), "class_qualname": Hostile.__qualname__, "state": state,
             "chain_depth": CHAIN_DEPTH, "marker": MARKER, "output": y.tolist()}  # fmt: skip
    with open(os.path.join(OUT, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    globals().update(model=model, x=x, y=y, mapped=mapped, huge=huge_code)
    print("READY", flush=True)
    sys.stdin.read()


def _state(model: nn.Module):
    """state_dict()'s keys without its recursion (which loops on `model.me = model`): the first path
    of every module, as named_modules' memo gives it."""
    for path, m in model.named_modules():
        prefix = f"{path}." if path else ""
        for n, p in m._parameters.items():
            if p is not None:
                yield prefix + n, p
        for n, b in m._buffers.items():
            if b is not None and n not in m._non_persistent_buffers_set:
                yield prefix + n, b


if __name__ == "__main__":
    main()
