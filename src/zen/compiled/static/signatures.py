"""Typed kernel signatures from the argument-check messages TVM compiles into each kernel.

Every kernel checks its arguments at entry and carries the text of its signature for the error it
would raise, e.g. `fused_conv2d_add(x: Tensor([T.int64(1), T.int64(3), T.int64(32), T.int64(32)],
float32), p_conv1_weight: Tensor([...], float32), ...)`. The strings survive stripping. They give
the shape and dtype of arguments the bytecode does not describe, such as weights passed in as
function parameters (`keep_params_as_input=True`), which have no shape check of their own.
"""

from __future__ import annotations

import re

_ARG = rb"[A-Za-z_][A-Za-z0-9_]*: Tensor\(\[(?:T\.int64\(\d+\)(?:, )?)*\], [a-z0-9]+\)"
_SIG = re.compile(rb"([A-Za-z_][A-Za-z0-9_.]{0,200})\(((?:" + _ARG + rb"(?:, )?){1,64})\)")
_ONE = re.compile(rb"([A-Za-z_][A-Za-z0-9_]*): Tensor\(\[((?:T\.int64\(\d+\)(?:, )?)*)\], ([a-z0-9]+)\)")
MAX_SIGNATURES = 100_000


def kernel_signatures(data: bytes) -> dict[str, list[tuple[str, tuple[int, ...], str]]]:
    """Kernel name -> [(argument name, shape, dtype)] for every signature text found in the file."""
    sigs: dict[str, list[tuple[str, tuple[int, ...], str]]] = {}
    for n, m in enumerate(_SIG.finditer(data)):
        if n >= MAX_SIGNATURES:
            break
        name = m.group(1).decode("ascii")
        args = []
        for a in _ONE.finditer(m.group(2)):
            dims = tuple(int(d) for d in re.findall(rb"\d+", a.group(2).replace(b"int64", b"")))
            args.append((a.group(1).decode("ascii"), dims, a.group(3).decode("ascii")))
        sigs.setdefault(name, args)
    return sigs
