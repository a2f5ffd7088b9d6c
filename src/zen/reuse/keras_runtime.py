"""Rebuilding a recovered Keras model in a TensorFlow environment. EXECUTES code recovered from an image.

Runs in the investigator's TF environment (the `load()` of a package `zen reuse` writes for a Keras case, and the
child `zen verify --python EXE` starts), never in zen's analysis process: it imports keras, numpy and, only for
subclassed models, zen's patch applier (pure Python). The model is constructed again from the MR, not unpickled:

* built-in layers (`keras.*` classes): `cls(**init)`, `init` being the constructor arguments Keras kept
  (`_auto_config`), or, where the deployed code passed objects, the configuration attributes that match the
  constructor's parameters (activations resolved by their qualified name);
* a Sequential: its layers, in order, in a new Sequential of the same name;
* a functional model: every recorded node replayed in order (`graph.functional[path].nodes`: which layer was
  called on which producer's output, arguments in the deployed order), then `keras.Model(inputs, outputs)`;
* a subclassed model or custom layer: its class is synthesised from the recovered code (the self-contained patch
  in patch.json, applied as for PyTorch), constructed with its recorded arguments and called once on zeros of its
  recorded build shape so that its variables exist.

Then every variable is assigned from weights.safetensors by its Keras path (by position, shapes checked, when the
rebuilt model's auto-generated names differ), and the report says what was assigned and how.

    python -m zen.reuse.keras_runtime verify PKG --inputs X.safetensors [--expect Y.safetensors] [--save Z]

prints a JSON result (what `zen verify` shows): each input run through `model(x)` and compared bit for bit.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

# safetensors dtype names <-> numpy dtype names (bfloat16 comes from ml_dtypes, which TensorFlow depends on)
ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
             "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64",
             "BOOL": "bool"}  # fmt: skip
KERAS_PREFIXES = ("keras.", "tensorflow.", "tf_keras.")
ACTIVATION_PARAMS = ("activation", "recurrent_activation")
MAX_HEADER = 100 * 1024 * 1024


class KerasReuseError(Exception):
    """A package that cannot be rebuilt here: the message says what and what to do."""


def _np_dtype(name: str):
    import numpy as np

    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def read_safetensors(path: Path) -> dict[str, Any]:
    """name -> numpy array (own memory), read with numpy alone (no safetensors package in the TF environment)."""
    import numpy as np

    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise KerasReuseError(f"{path} is not a safetensors file (too short)")
    n = struct.unpack_from("<Q", raw)[0]
    if n > min(MAX_HEADER, len(raw) - 8):
        raise KerasReuseError(f"{path} is not a safetensors file (header length {n})")
    try:
        header = json.loads(raw[8 : 8 + n])
    except ValueError as exc:
        raise KerasReuseError(f"{path} is not a safetensors file ({exc})") from None
    data, out = raw[8 + n :], {}
    for key, e in header.items():
        if key == "__metadata__":
            continue
        if e.get("dtype") not in ST_DTYPES:
            raise KerasReuseError(f"{path}: tensor {key} has dtype {e.get('dtype')!r}, which this reader does not know")
        lo, hi = e["data_offsets"]
        dt = _np_dtype(ST_DTYPES[e["dtype"]])
        if not 0 <= lo <= hi <= len(data) or (hi - lo) != dt.itemsize * int(np.prod(e["shape"], dtype=np.int64)):
            raise KerasReuseError(f"{path}: tensor {key} has data offsets outside the file or of the wrong size")
        out[key] = np.frombuffer(data[lo:hi], dtype=dt).reshape(e["shape"]).copy()
    return out


def write_safetensors(path: Path, arrays: dict[str, Any]) -> None:
    """The inverse of read_safetensors (keys sorted, 8-byte aligned header), for outputs."""
    import numpy as np

    names = {v: k for k, v in ST_DTYPES.items()}
    header, chunks, off = {}, [], 0
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        b = a.tobytes()
        header[key] = {"dtype": names[str(a.dtype)], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def _lit(text: str | None, where: str) -> Any:
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise KerasReuseError(f"{where}: {text!r} is not a literal ({exc})") from None


def _resolve(dotted: str, resolver: Any) -> Any:
    """A function by qualified name ('keras.src.activations.activations.relu'): Keras's from the installed Keras,
    any other only through the patch (recovered code), never by importing a module the case names."""
    mod, _, name = dotted.rpartition(".")
    if mod.startswith(KERAS_PREFIXES):
        return getattr(importlib.import_module(mod), name)
    if resolver is None:
        raise KerasReuseError(f"function {dotted} is not Keras's and the package has no recovered code for it")
    return resolver.func(f"{mod}:{name}")


class Builder:
    """Constructs the layers of one MR (each path once: shared layers stay shared)."""

    def __init__(self, mr: dict, resolver: Any = None) -> None:
        import keras
        from keras.src.models.functional import Functional

        self.keras, self.functional_cls = keras, Functional
        self.mr, self.resolver = mr, resolver
        self.modules = {m["path"]: m for m in mr["modules"]}
        self.graphs = (mr.get("graph") or {}).get("functional") or {}
        self.made: dict[str, Any] = {}
        self.notes: list[str] = []

    def cls(self, m: dict) -> type:
        ref = f"{m['cls_module']}:{m['cls_qualname']}"
        if not m["cls_module"].startswith(KERAS_PREFIXES):
            if self.resolver is None:
                raise KerasReuseError(f"class {ref} is not Keras's and the package has no recovered code (patch.json)",
                                      "write the package again with `zen reuse CASE -o DIR`")  # fmt: skip
            return self.resolver.cls(ref)
        obj: Any = importlib.import_module(m["cls_module"])
        for part in m["cls_qualname"].split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise KerasReuseError(f"class {ref} is not in the installed Keras", "use the Keras version of the case")
        return obj

    def kwargs(self, cls: type, m: dict) -> dict[str, Any]:
        """Constructor arguments: the recorded ones, else configuration attributes the constructor accepts."""
        k = (m.get("state") or {}).get("keras") or {}
        where = m["path"] or "<root>"
        init = _lit(k.get("init"), f"constructor arguments of {where}")
        sig = inspect.signature(cls.__init__)
        params = sig.parameters
        open_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if init is None:
            init, hp = {}, m.get("hyperparameters") or {}
            for name, p in list(params.items())[1:]:
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or name in ("name", "dtype") or name not in hp:
                    continue
                value = _lit(hp[name], f"{where}.{name}")
                if name in ACTIVATION_PARAMS and isinstance(value, str) and "." in value:
                    value = _resolve(value, self.resolver)
                init[name] = value
            self.notes.append(f"{where}: constructed from its configuration attributes ({len(init)} arguments)")
        if "name" not in init and ("name" in params or open_kw) and k.get("name"):
            init["name"] = k["name"]
        policy = _lit((m.get("hyperparameters") or {}).get("dtype_policy"), f"{where}.dtype_policy")
        if "dtype" not in init and ("dtype" in params or open_kw) and isinstance(policy, str):
            init["dtype"] = policy
        return dict(init)

    def layer(self, path: str) -> Any:
        if path in self.made:
            return self.made[path]
        if path not in self.modules:
            raise KerasReuseError(f"the model's graph names {path!r}, which is not a layer of the MR")
        m = self.modules[path]
        cls = self.cls(m)
        keras = self.keras
        if issubclass(cls, keras.Sequential) and m["cls_module"].startswith(KERAS_PREFIXES):
            children = [self.layer(m["child_paths"].get(c) or (f"{path}.{c}" if path else c)) for c in m["children"]]
            obj = cls(children, name=m["state"]["keras"]["name"])
        elif path in self.graphs and cls.__module__.startswith(KERAS_PREFIXES) and issubclass(cls, self.functional_cls):
            obj = self.functional(path, cls)
        else:
            obj = cls(**self.kwargs(cls, m))
        if (m.get("hyperparameters") or {}).get("trainable") == "False":
            obj.trainable = False  # a frozen layer stays frozen (BatchNormalization then always infers)
        self.made[path] = obj
        return obj

    def functional(self, path: str, cls: type) -> Any:
        keras = self.keras
        g = self.graphs[path]
        if "nodes" not in g:
            raise KerasReuseError(f"the functional graph of {path or '<root>'} has no call records",
                                  "recover the case again with this zen (older cases lack them)")  # fmt: skip
        outputs: dict[tuple[str, int], list] = {}

        def decode(enc: Any) -> Any:
            if "ref" in enc:
                op, ni, ti = enc["ref"]
                if (op, ni) not in outputs:
                    raise KerasReuseError(f"node {op}#{ni} is used before it is computed")
                return outputs[(op, ni)][ti]
            if "lit" in enc:
                return ast.literal_eval(enc["lit"])
            if "tuple" in enc:
                return tuple(decode(x) for x in enc["tuple"])
            if "list" in enc:
                return [decode(x) for x in enc["list"]]
            if "dict" in enc:
                return {k: decode(v) for k, v in enc["dict"]}
            raise KerasReuseError(f"a call argument in {path or '<root>'} is not rebuildable: {enc}")

        for node in g["nodes"]:
            op = node["op"]
            if op.startswith("op:"):
                raise KerasReuseError(f"the functional model {path or '<root>'} calls operation {op[3:]!r}, which is "
                                      "not a layer: replaying keras.ops calls is not supported yet")  # fmt: skip
            lay = self.layer(op)
            if isinstance(lay, keras.layers.InputLayer):
                out = lay.output
            else:
                out = lay(*decode(node.get("args", {"tuple": []})), **decode(node.get("kwargs", {"dict": []})))
            outputs[(op, node["index"])] = keras.tree.flatten(out)
        k = self.modules[path]["state"]["keras"]
        return keras.Model(inputs=decode(g["inputs"]), outputs=decode(g["outputs"]), name=k["name"])

    def build_by_call(self, model: Any, m: dict) -> None:
        """A subclassed model has no variables until it runs: call it once on zeros of its recorded build shape."""
        import numpy as np

        shapes = _lit(((m.get("state") or {}).get("keras") or {}).get("build"), "build shapes")
        if not shapes:
            raise KerasReuseError(f"{m['cls_qualname']} was never built in the image (no build shapes): its variables "
                                  "cannot be created")  # fmt: skip
        arrays = {k: np.zeros([1 if d is None else d for d in s], "float32") for k, s in shapes.items()}
        if len(arrays) == 1:
            model(next(iter(arrays.values())))
        else:
            model(**{k.removesuffix("_shape"): v for k, v in arrays.items()})
        self.notes.append(f"built by one call on zeros of shape {shapes}")


def assign(model: Any, weights: dict[str, Any], mr: dict) -> dict:
    """Assign every recovered variable: by Keras path, or by position when the rebuilt paths differ."""
    variables = list(model.variables)
    keys = [t["key"] for t in mr["tensors"]]
    paths = [v.path for v in variables]
    by_path = set(paths) == set(keys) and len(paths) == len(keys)
    if not by_path and len(variables) != len(keys):
        raise KerasReuseError(f"the rebuilt model has {len(variables)} variables, the recovered one {len(keys)}",
                              "the rebuilt architecture differs from the deployed one (see the report's notes)")  # fmt: skip
    pairs = [(v, v.path) for v in variables] if by_path else list(zip(variables, keys))
    problems = []
    status = {t["key"]: t["status"] for t in mr["tensors"]}
    for v, key in pairs:
        if key not in weights:
            problems.append(f"{key}: no recovered data (status {status.get(key, '?')})")
            continue
        a = weights[key]
        if tuple(a.shape) != tuple(v.shape) or str(a.dtype) != str(v.dtype):
            raise KerasReuseError(f"variable {v.path}: rebuilt {v.dtype}{list(v.shape)}, recovered {key} "
                                  f"{a.dtype}{list(a.shape)}")  # fmt: skip
        v.assign(a)
    return {"assigned": len(pairs) - len(problems), "variables": len(variables),
            "matched_by": "path" if by_path else "position", "missing": problems}  # fmt: skip


def load_package(pkg_dir: Path) -> tuple[Any, dict]:
    """(model, report) of a Keras reuse package."""
    pkg_dir = Path(pkg_dir)
    try:
        import keras
    except ImportError as exc:
        raise KerasReuseError(f"Keras is not importable by {sys.executable}: {exc}",
                              "run this in the TensorFlow environment (tools/tf-venv.sh builds one)") from None  # fmt: skip
    mr = json.loads((pkg_dir / "mr.json").read_text())
    if mr.get("framework") != "keras":
        raise KerasReuseError(f"{pkg_dir} holds a {mr.get('framework')} model, not a Keras one")
    resolver, patch_report = None, None
    if (pkg_dir / "patch.json").is_file():  # user classes: synthesised from the recovered code, as for PyTorch
        from zen.patch.apply import apply_patch
        from zen.patch.format import read_patch

        applied = apply_patch(read_patch(pkg_dir / "patch.json"))
        resolver, patch_report = applied.resolver, applied.to_json()
    b = Builder(mr, resolver)
    root = b.modules[""]
    model = b.layer("")
    if not model.built or (not model.variables and mr["tensors"]):
        b.build_by_call(model, root)
    report = assign(model, read_safetensors(pkg_dir / "weights.safetensors"), mr)
    report.update({"framework": "keras", "keras": keras.__version__, "notes": b.notes, "patch": patch_report})
    return model, report


def _first(out: Any) -> Any:
    import keras

    flat = keras.tree.flatten(out)
    return flat[0] if flat else None


def verify(pkg_dir: Path, inputs: Path, expect: Path | None, save: Path | None) -> dict:
    """Run the rebuilt model (`model(x)`, as the deployed process ran it) on each input; compare bit for bit."""
    import numpy as np

    model, report = load_package(pkg_dir)
    xs = read_safetensors(inputs)
    want = read_safetensors(expect) if expect else {}
    rows, outs = [], {}
    for key in sorted(xs):
        try:
            y = np.asarray(_first(model(xs[key])))
        except Exception as exc:  # noqa: BLE001 - recovered code or a wrong input: report, don't crash
            rows.append({"input": key, "error": f"{type(exc).__name__}: {exc}"})
            continue
        outs[key] = y
        row: dict[str, Any] = {"input": key, "shape": list(y.shape), "dtype": str(y.dtype)}
        if key in want:
            e = want[key]
            row["equal"] = bool(e.shape == y.shape and e.dtype == y.dtype and e.tobytes() == y.tobytes())
            if not row["equal"] and e.shape == y.shape:
                row["max_abs_diff"] = float(np.max(np.abs(e.astype("float64") - y.astype("float64"))))
        elif want:
            row["error"] = "no expected output with this key"
        rows.append(row)
    if save is not None:
        write_safetensors(save, outs)
    return {"results": rows, "report": report}


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="zen.reuse.keras_runtime")
    ap.add_argument("command", choices=["verify"])
    ap.add_argument("package", type=Path)
    ap.add_argument("--inputs", type=Path, required=True)
    ap.add_argument("--expect", type=Path)
    ap.add_argument("--save", type=Path)
    a = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        result = verify(a.package, a.inputs, a.expect, a.save)
    except KerasReuseError as exc:
        result = {"error": str(exc.args[0]), "hint": exc.args[1] if len(exc.args) > 1 else ""}
    except Exception as exc:  # noqa: BLE001 - ZenError from the patch applier, or recovered code failing
        result = {"error": f"{type(exc).__name__}: {exc}", "hint": getattr(exc, "hint", "") or ""}
    print("ZEN-RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
