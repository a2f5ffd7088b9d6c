"""TorchScript code files for a traced model, written from the IR plans the analysis read (`torchscript.trace_ir`).

A traced model has no code text in the image, only graphs, so its archive's code is printed from them: torch's own
printer turns each class's inlined forward graph into a function (in a child process, `reuse.trace_print`; zen's
analysis never imports torch), and this wraps the function's body in the class's TorchScript declaration:
`__parameters__`, `__buffers__`, every attribute with its type as the image's ClassType declares it, and a
`forward(self, ...)` whose first lines fetch the tensors the graph read from the module tree (`self.conv.weight`)
and rebuild its tensor constants from the values read out of the image.
"""

from __future__ import annotations

import json
import keyword
import re
import subprocess
import sys

from zen.runtime import childproc
from zen.runtime.errors import ZenError

# c10::ScalarType numbers (stable across torch releases): archive code spells a dtype as its number
DTYPES = {"uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6, "float64": 7, "bool": 11}
ANNOTATION = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\], ()]*")  # Tensor, Optional[bool], __torch__.a.B, Tuple[()]
SPECIAL = {"nan": 'float("nan")', "inf": 'float("inf")', "-inf": 'float("-inf")'}


class TraceCodeError(ZenError):
    pass


def trace_files(trace: dict, timeout: float = 600.0) -> dict[str, str]:
    """`{code/__torch__/....py: text}` for every class planned in `trace` (mr.json deployment.torchscript.trace)."""
    plans = trace.get("plans") or {}
    printed = _print({c: p["ir"] for c, p in plans.items() if p.get("ir")}, timeout)
    files: dict[str, list[str]] = {}
    for cls, plan in sorted(plans.items()):
        module, _, name = cls.rpartition(".")
        path = "code/" + module.replace(".", "/") + ".py"
        files.setdefault(path, []).append(class_text(cls, name, plan, printed.get(cls)))
    return {f: "\n".join(texts) for f, texts in files.items()}


def _print(irs: dict[str, str], timeout: float) -> dict[str, dict]:
    if not irs:
        return {}
    cmd = childproc.module_argv("zen.reuse.trace_print", [], python=sys.executable)
    try:
        res = childproc.run(cmd, input=json.dumps(irs), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise TraceCodeError(f"printing the traced graphs took more than {timeout:.0f} s") from None
    line = next((ln for ln in reversed(res.stdout.splitlines()) if ln.startswith("ZEN-RESULT ")), None)
    if line is None:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise TraceCodeError(f"torch did not print the traced graphs (exit {res.returncode}): {tail}")
    out = json.loads(line[len("ZEN-RESULT ") :])
    if "error" in out and isinstance(out["error"], str):
        raise TraceCodeError(out["error"], "install torch in zen's environment (bash install.sh) to rebuild traced models")
    bad = {c: r["error"] for c, r in out.items() if "error" in r}
    if bad:
        cls, why = sorted(bad.items())[0]
        raise TraceCodeError(f"torch refused the graph printed for {cls}: {why}", "see mr.json deployment.torchscript.trace")
    return out


def class_text(qual: str, name: str, plan: dict, printed: dict | None) -> str:
    """One class as `torch.jit.save` would declare it, with its forward from the printed graph."""
    if not name.isidentifier() or not name.isascii():
        raise TraceCodeError(f"a class name {name[:40]!r} that cannot be written in TorchScript code")
    lines = [f"class {name}(Module):",
             "  __parameters__ = [" + "".join(f'"{_plain(p)}", ' for p in plan["parameters"]) + "]",
             "  __buffers__ = [" + "".join(f'"{_plain(b)}", ' for b in plan["buffers"]) + "]"]  # fmt: skip
    lines += [_declare(a, t) for a, t in plan["declarations"]]
    if printed is not None:
        lines += _forward(qual, plan, printed)
    return "\n".join(lines) + "\n"


def _declare(name: str, annotation: str) -> str:
    """`  fc1 : Tensor`; a name that is not an identifier (a Sequential's `0`) the way torch.jit.save writes it."""
    if not ANNOTATION.fullmatch(annotation):
        raise TraceCodeError(f"attribute {name[:40]!r}: a type {annotation[:60]!r} that cannot be written in TorchScript code")
    if name.isidentifier() and name.isascii() and not keyword.iskeyword(name):
        return f"  {name} : {annotation}"
    return f'  __annotations__["{_plain(name)}"] = {annotation}'


def _forward(qual: str, plan: dict, printed: dict) -> list[str]:
    code, args = printed["code"].splitlines(), printed["arguments"]
    n_in, n_state = len(plan["inputs"]), len(plan["state"])
    if len(args) != n_in + n_state + len(plan["constants"]):
        raise TraceCodeError(f"{qual}: the printed graph takes {len(args)} arguments, the plan {n_in + n_state} and "
                             f"{len(plan['constants'])} constants")  # fmt: skip
    end = next((i for i, ln in enumerate(code) if ln.rstrip().endswith(":")), None)
    if end is None:
        raise TraceCodeError(f"{qual}: torch printed no function header")
    sig = "".join(f",\n    {a}: {t}" for a, t in args[:n_in])
    ret = printed["returns"][0] if len(printed["returns"]) == 1 else "Tuple[" + ", ".join(printed["returns"]) + "]"
    out = [f"  def forward(self: {qual}{sig}) -> {ret}:"]
    out += [f"    {a} = {_attr_path(p)}" for (a, _), p in zip(args[n_in:], plan["state"])]
    out += [f"    {a} = {_constant(c)}" for (a, _), c in zip(args[n_in + n_state :], plan["constants"])]
    out += ["  " + ln for ln in code[end + 1 :] if ln.strip()]
    return out


def _attr_path(path: list[str]) -> str:
    expr = "self"
    for atom in path:
        ok = atom.isidentifier() and atom.isascii() and not keyword.iskeyword(atom)
        expr = f"{expr}.{atom}" if ok else f'getattr({expr}, "{_plain(atom)}")'
    return expr


def _plain(atom: str) -> str:
    if not all(ch.isalnum() or ch == "_" for ch in atom):
        raise TraceCodeError(f"a module name {atom[:40]!r} that cannot be written in TorchScript code")
    return atom


def _constant(c: dict) -> str:
    if c["dtype"] not in DTYPES:
        raise TraceCodeError(f"a tensor constant of dtype {c['dtype']}")
    vals = []
    for v in c["values"]:
        if v in SPECIAL:
            vals.append(SPECIAL[v])
        elif v in ("True", "False") or _number(v):
            vals.append(v)
        else:
            raise TraceCodeError(f"a tensor constant value {v[:40]!r}")
    dtype = DTYPES[c["dtype"]]
    if not c["shape"]:
        return f"torch.tensor({vals[0]}, dtype={dtype})"
    if not vals:
        return f"torch.empty({c['shape']}, dtype={dtype})"
    return f"torch.reshape(torch.tensor([{', '.join(vals)}], dtype={dtype}), {c['shape']})"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
