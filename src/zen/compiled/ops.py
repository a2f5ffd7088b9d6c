"""Operator vocabulary: how kernel names split into ops, and each op's PyTorch expression and attributes.

A kernel name such as `fused_conv2d1_add1_tir_sigmoid` lists the relax ops TVM fused into it, in
order; names can be hashed or renamed, so the list is only a starting point. Each op here knows
its operand count, the attribute values worth trying given the tensors' shapes, and the PyTorch
expression computing it. The same expression text is evaluated when probing (to check a guess
against the kernel's measured output) and written into the rebuilt model's source, so what was
verified is what is shipped. Nothing here imports torch.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any

Shape = tuple[int, ...]

# ops with operands beyond the running value: how many tensor operands they take in total
ANCHORS = {"conv1d": 2, "conv2d": 2, "matmul": 2, "dense": 2, "batch_norm": 5, "layer_norm": 3, "take": 2, "where": 3}
BINARY = {
    "add": "torch.add({a}, {b})",
    "subtract": "torch.sub({a}, {b})",
    "multiply": "torch.mul({a}, {b})",
    "divide": "torch.div({a}, {b})",
    "maximum": "torch.maximum({a}, {b})",
    "minimum": "torch.minimum({a}, {b})",
    "power": "torch.pow({a}, {b})",
    "equal": "torch.eq({a}, {b})",
    "not_equal": "torch.ne({a}, {b})",
    "less": "torch.lt({a}, {b})",
    "greater": "torch.gt({a}, {b})",
    "logical_and": "torch.logical_and({a}, {b})",
    "logical_or": "torch.logical_or({a}, {b})",
}
SHAPED = {
    "reshape",
    "flatten",
    "expand_dims",
    "squeeze",
    "transpose",
    "permute_dims",
    "mean",
    "sum",
    "max",
    "softmax",
    "log_softmax",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "max_pool1d",
    "avg_pool1d",
    "concatenate",
    "zeros",
    "ones",
    "full",
    "cast",
    "broadcast_to",
    "split",
}
UNARY_TOKENS = {
    "relu",
    "sigmoid",
    "tanh",
    "erf",
    "exp",
    "sqrt",
    "rsqrt",
    "negative",
    "clip",
    "gelu",
    "gelu_tanh",
    "silu",
    "hardswish",
    "hardsigmoid",
    "leaky_relu",
    "elu",
    "softplus",
    "abs",
    "log",
    "square",
    "logical_not",
    "quantize",
    "dequantize",
    "act",
}  # act: an activation named by nothing (generic fusion patterns)
VOCAB = set(ANCHORS) | set(BINARY) | SHAPED | UNARY_TOKENS
RESHAPES = {"reshape", "flatten", "expand_dims", "squeeze", "broadcast_to"}
SHAPE_PRESERVING = set(BINARY) | UNARY_TOKENS | {"batch_norm", "layer_norm", "softmax", "log_softmax", "act", "cast"}

# elementwise functions told apart by how they respond to inputs (NeuroDeX: behaviour, not names)
ACTIVATIONS = {
    "identity": "{x}",
    "relu": "F.relu({x})",
    "relu6": "F.relu6({x})",
    "sigmoid": "torch.sigmoid({x})",
    "tanh": "torch.tanh({x})",
    "gelu": "F.gelu({x})",
    "gelu_tanh": "F.gelu({x}, approximate='tanh')",
    "silu": "F.silu({x})",
    "hardswish": "F.hardswish({x})",
    "hardsigmoid": "F.hardsigmoid({x})",
    "leaky_relu": "F.leaky_relu({x}, {slope})",
    "elu": "F.elu({x})",
    "softplus": "F.softplus({x})",
    "mish": "F.mish({x})",
    "exp": "torch.exp({x})",
    "erf": "torch.erf({x})",
    "sqrt": "torch.sqrt({x})",
    "rsqrt": "torch.rsqrt({x})",
    "negative": "torch.neg({x})",
    "abs": "torch.abs({x})",
    "square": "torch.square({x})",
    "log": "torch.log({x})",
    "logical_not": "torch.logical_not({x})",
    "eq_neginf": "torch.eq({x}, float('-inf'))",
    "ne_neginf": "torch.ne({x}, float('-inf'))",
    "isfinite": "torch.isfinite({x})",
    "eq_zero": "torch.eq({x}, 0)",
    "ne_zero": "torch.ne({x}, 0)",
    "clamp": "torch.clamp({x}, {lo}, {hi})",
    "affine": "torch.add(torch.mul({x}, {scale}), {shift})",
    # relax quantize then dequantize (int8 activations): round(x / scale) + zero point, clamped, mapped back
    "fake_quant": "torch.fake_quantize_per_tensor_affine({x}, {scale}, {zero_point}, {qmin}, {qmax})",
    "quantize": "torch.clamp(torch.round(torch.div({x}, {scale})) + {zero_point}, {qmin}, {qmax}).to(torch.{dtype})",
}
# the relax ops (other than scalar add/subtract/multiply/divide) each activation is lowered to: a run of ops
# named in a kernel can only be an activation whose lowering contains them all
ACT_TOKENS = {
    "identity": set(),
    "relu": {"relu"},
    "relu6": {"clip"},
    "sigmoid": {"sigmoid"},
    "tanh": {"tanh"},
    "gelu": {"erf", "gelu"},
    "gelu_tanh": {"tanh", "power", "gelu", "gelu_tanh"},
    "silu": {"sigmoid", "silu"},
    "hardswish": {"clip", "hardswish"},
    "hardsigmoid": {"clip", "hardsigmoid"},
    "elu": {"exp", "elu"},
    "softplus": {"exp", "log", "softplus"},
    "mish": {"exp", "log", "tanh", "softplus"},
    "exp": {"exp"},
    "erf": {"erf"},
    "sqrt": {"sqrt"},
    "rsqrt": {"rsqrt", "sqrt"},
    "negative": {"negative"},
    "abs": {"abs"},
    "square": {"square"},
    "log": {"log"},
}
EPS = [1e-5, 1e-3, 1e-6, 1e-12, 1e-4, 1e-2, 1e-1, 1e-8, 1e-7, 1e-9, 1e-10, 1e-11]


# a kernel's body TVM commonly fuses: an anchor, then a bias or residual add, an activation ("act": any,
# told by behaviour) and a gate; tried after the collected patterns for kernels whose names say nothing
GENERIC_TAILS = (
    ["add"],
    ["add", "act"],
    ["act"],
    ["add", "add"],
    ["add", "add", "act"],
    ["add", "act", "add"],
    ["add", "act", "multiply"],
    ["add", "add", "act", "multiply"],
    ["act", "add"],
    ["add", "act", "multiply", "add"],
)
GENERIC_ANCHORS = ("conv2d", "matmul", "batch_norm", "layer_norm", "conv1d")
# a normalisation fused with the concatenation feeding it or fed by it (dense blocks, ghost modules)
GENERIC_JOINS = [
    ["concatenate", "batch_norm", "act"],
    ["concatenate", "batch_norm"],
    ["batch_norm", "act", "concatenate"],
    ["batch_norm", "concatenate"],
]


def fusion_patterns() -> list[list[str]]:
    """Op sequences TVM fuses into one kernel, most common first (fusion_patterns.json, collected from
    real libraries by tools/fusion_patterns.py, or the file ZEN_FUSION_PATTERNS names): the readings tried
    for a kernel whose name says nothing."""
    global _PATTERNS
    if _PATTERNS is None:
        path = Path(os.environ.get("ZEN_FUSION_PATTERNS") or Path(__file__).with_name("fusion_patterns.json"))
        try:
            data = json.loads(path.read_text())
            _PATTERNS = [[str(t) for t in p["ops"]] for p in data["patterns"] if set(p["ops"]) <= VOCAB]
        except (OSError, ValueError, KeyError, TypeError):
            _PATTERNS = []
        generic = [[a, *tail] for tail in GENERIC_TAILS for a in GENERIC_ANCHORS] + GENERIC_JOINS
        _PATTERNS += [g for g in generic if g not in _PATTERNS]
    return _PATTERNS


_PATTERNS: list[list[str]] | None = None


def split_kernel_name(name: str) -> list[str] | None:
    """The op tokens of a kernel name, or None where a part is not a known op (a hashed or renamed kernel)."""
    parts = [p for p in name.split("_") if p]
    if parts and parts[0] == "fused":
        parts = parts[1:]
    ops: list[str] = []
    i = 0
    while i < len(parts):
        if parts[i] == "tir":
            i += 1
            continue
        for width in (3, 2, 1):
            cand = "_".join(parts[i : i + width])
            base = cand
            while base and base not in VOCAB and base[-1].isdigit():
                base = base[:-1]
            if base in VOCAB and len(parts[i : i + width]) == width:
                ops.append(base)
                i += width
                break
        else:
            return None
    return ops or None


def conv_candidates(x: Shape, w: Shape, out: Shape | None, nd: int) -> list[dict]:
    """Stride/padding/dilation/groups whose output shape fits; most common settings first."""
    if len(x) != nd + 2 or len(w) != nd + 2 or w[1] == 0 or x[1] % w[1]:
        return []
    groups = x[1] // w[1]
    res = []
    strides = sorted(set(range(1, 5)) | set(w[2:]))  # patch embeddings: stride = kernel size
    for s, d in itertools.product(strides, range(1, 4)):
        for p in sorted(range(0, max(w[2:]) * d + 1), key=lambda p: (p != (max(w[2:]) // 2) * d, p)):
            shape = tuple((x[2 + i] + 2 * p - d * (w[2 + i] - 1) - 1) // s + 1 for i in range(nd))
            if out is None or tuple(out[2:]) == shape:
                res.append({"stride": s, "padding": p, "dilation": d, "groups": groups})
    res.sort(key=lambda a: (a["dilation"], a["stride"]))
    return res


def _pool_size(n: int, k: int, s: int, p: int, ceil: bool) -> int:
    """Output length of a pooling window (PyTorch's rule, including ceil_mode's last-window check)."""
    v = (n + 2 * p - k + ((s - 1) if ceil else 0)) // s + 1
    if ceil and (v - 1) * s >= n + p:
        v -= 1
    return v


def pool_candidates(x: Shape, out: Shape | None, nd: int, kind: str) -> list[dict]:
    if out is None or len(x) != nd + 2:
        return []
    res = []
    for k in range(1, 8):
        for s in sorted(set(range(1, 5)) | {k}):
            for p in range(0, k // 2 + 1):
                for ceil in (False, True):
                    if tuple(_pool_size(n, k, s, p, ceil) for n in x[2:]) == tuple(out[2:]):
                        for cip in (True,) if kind == "max" or p == 0 else (False, True):
                            res.append({"kernel": k, "stride": s, "padding": p, "ceil": ceil, "count_include_pad": cip})
    res.sort(key=lambda a: (a["ceil"], a["padding"] != 0, a["stride"] != a["kernel"]))
    return res


def reduce_candidates(x: Shape, out: Shape | None) -> list[dict]:
    if out is None:
        return []
    res = []
    for r in range(1, len(x) + 1):
        for axes in itertools.combinations(range(len(x)), r):
            kept = [n for i, n in enumerate(x) if i not in axes]
            keep = [1 if i in axes else n for i, n in enumerate(x)]
            if tuple(keep) == tuple(out):
                res.append({"dim": list(axes), "keepdim": True})
            if tuple(kept) == tuple(out):
                res.append({"dim": list(axes), "keepdim": False})
    return res


def candidates(op: str, x: Shape, operands: list[Shape], out: Shape | None, out_dtype: str = "float32") -> list[dict]:
    """Attribute settings to try for `op` applied to an input of shape `x` (out: its shape if known)."""
    if op in ("conv1d", "conv2d"):
        return conv_candidates(x, operands[0], out, 1 if op == "conv1d" else 2)
    if op in ("max_pool2d", "avg_pool2d", "max_pool1d", "avg_pool1d"):
        return pool_candidates(x, out, 2 if op.endswith("2d") else 1, op[:3])
    if op == "adaptive_avg_pool2d":
        return [{"size": list(out[2:])}] if out else []
    if op in ("mean", "sum", "max"):
        return reduce_candidates(x, out)
    if op in ("softmax", "log_softmax"):
        return [{"dim": d} for d in [-1] + list(range(len(x) - 1))]
    if op == "reshape" and out is None:  # ahead of a transpose: one axis split in two (a channel shuffle's groups)
        return [
            {"shape": list(x[:d]) + [g, n // g] + list(x[d + 1 :])}
            for d, n in sorted(enumerate(x), key=lambda e: (e[1] == 1, e[0] != 1, e[0]))
            for g in range(2, n)
            if n % g == 0
        ]
    if op in ("reshape", "flatten", "expand_dims", "squeeze", "zeros", "ones", "broadcast_to"):
        return [{"shape": list(out)}] if out is not None else []
    if op in ("transpose", "permute_dims"):
        perms = [p for p in itertools.permutations(range(len(x))) if out is None or tuple(x[i] for i in p) == tuple(out)]
        return [{"perm": list(p)} for p in perms[:120]]
    if op in ("batch_norm", "layer_norm"):
        return [{"eps": e} for e in EPS]
    if op == "concatenate":  # a size-1 axis (batch 1) joins like any other: the real axes first, channels first
        return [{"dim": d} for d in sorted(range(len(x)), key=lambda d: (x[d] == 1, d != 1, d))]
    if op == "cast":
        return [{"dtype": d} for d in dict.fromkeys([out_dtype, "bool", "int8", "int32", "int64", "float32"])]
    if op == "split":  # only as a kernel's last op, where search._search_split handles it
        return []
    if op in BINARY:
        return [{"swap": False}, {"swap": True}] if op in ("subtract", "divide", "power") else [{"swap": False}]
    return [{}]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return repr(float(f"{v:.9g}")) if math.isfinite(v) else f"float('{v}')"
    return repr(v)


def _gather(attrs: dict, args: list[str]) -> str:
    """One term of a linear data-movement kernel (see probe_linear), plus the running sum or shift."""
    x = args[-1]
    perm = attrs.get("perm")
    if perm is not None:
        inner = x if perm == sorted(perm) else f"torch.permute({x}, {perm})"
        term = f"torch.reshape({inner}, {attrs['shape']})"
    else:
        term = f"torch.reshape(F.pad(torch.reshape({x}, [-1]), (0, 1))[{attrs['index_name']}], {attrs['shape']})"
    if attrs.get("scale", 1.0) != 1.0:
        term = f"torch.mul({term}, {_fmt(attrs['scale'])})"
    if len(args) == 2:
        return f"torch.add({args[0]}, {term})"
    shift = attrs.get("shift", 0.0)
    if isinstance(shift, list):
        return f"torch.add({term}, {attrs['shift_name']})"
    return term if shift == 0.0 else f"torch.add({term}, {_fmt(shift)})"


def expression(op: str, attrs: dict, args: list[str]) -> str:
    """PyTorch source computing `op` on the operand expressions `args` (args[0]: the running value)."""
    a = {k: _fmt(v) for k, v in attrs.items()}
    x = args[0] if args else ""
    if op in ("conv1d", "conv2d"):
        return (
            f"F.{op}({x}, {args[1]}, None, stride={a['stride']}, padding={a['padding']}, "
            f"dilation={a['dilation']}, groups={a['groups']})"
        )
    if op in ("matmul", "dense"):
        return f"torch.matmul({x}, {args[1]})" if op == "matmul" else f"F.linear({x}, {args[1]})"
    if op == "batch_norm":
        return f"F.batch_norm({x}, {args[3]}, {args[4]}, {args[1]}, {args[2]}, False, 0.0, {a['eps']})"
    if op == "layer_norm":
        return f"F.layer_norm({x}, tuple({args[1]}.shape), {args[1]}, {args[2]}, {a['eps']})"
    if op == "take":
        return f"F.embedding({args[1]}.long(), {args[0]})"
    if op in BINARY:
        l, r = (args[1], args[0]) if attrs.get("swap") else (args[0], args[1])
        return BINARY[op].format(a=l, b=r)
    if op in ("max_pool2d", "max_pool1d"):
        return f"F.{op}({x}, {a['kernel']}, {a['stride']}, {a['padding']}, ceil_mode={a['ceil']})"
    if op in ("avg_pool2d", "avg_pool1d"):
        return (
            f"F.{op}({x}, {a['kernel']}, {a['stride']}, {a['padding']}, ceil_mode={a['ceil']}, "
            f"count_include_pad={a['count_include_pad']})"
        )
    if op == "adaptive_avg_pool2d":
        return f"F.adaptive_avg_pool2d({x}, {a['size']})"
    if op in ("mean", "sum"):
        return f"torch.{op}({x}, dim={a['dim']}, keepdim={a['keepdim']})"
    if op == "max":
        return f"torch.amax({x}, dim={a['dim']}, keepdim={a['keepdim']})"
    if op in ("softmax", "log_softmax"):
        return f"torch.{op}({x}, dim={a['dim']})"
    if op in ("reshape", "flatten", "expand_dims", "squeeze"):
        return f"torch.reshape({x}, {a['shape']})"
    if op in ("transpose", "permute_dims"):
        return f"torch.permute({x}, {a['perm']})"
    if op == "concatenate":
        return f"torch.cat([{', '.join(args)}], dim={a['dim']})"
    if op in ("zeros", "ones"):
        return f"torch.{op}({a['shape']})"
    if op == "full":
        return f"torch.full({a['shape']}, {a['value']})"
    if op == "broadcast_to":
        return f"torch.broadcast_to({x}, {a['shape']})"
    if op == "where":
        return f"torch.where({args[0]}, {args[1]}, {args[2]})"
    if op == "cast":
        return f"{x}.to(torch.{re.sub('[^a-z0-9]', '', attrs['dtype'])})"
    if op == "gather":
        return _gather(attrs, args)
    if op == "split":  # one output of a split kernel (the rest come from the same steps)
        return f"torch.split({x}, {a['sizes']}, dim={a['dim']})[{a['index']}]"
    if op == "constant":  # a folded kernel output, held by the model under this name
        return attrs["name"]
    if op == "act" and attrs["fn"] == "affine" and attrs.get("shift") == 0.0:
        return f"torch.mul({x}, {a['scale']})"
    if op == "act":
        kw = {k: v for k, v in a.items() if k != "fn"}
        if "dtype" in attrs:  # a type name, not a string literal
            kw["dtype"] = re.sub("[^a-z0-9]", "", attrs["dtype"])
        return ACTIVATIONS[attrs["fn"]].format(x=x, **kw)
    raise KeyError(op)
