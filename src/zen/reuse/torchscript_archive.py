"""A TorchScript archive (the format `torch.jit.save` writes) rebuilt from a case, for `torch.jit.load`.

A `jit.load`ed or traced model has no Python class it was proven to come from (`torchscript.eager`), so it is
rebuilt the way it was deployed: from its TorchScript code, read from the image (`torchscript.sources`), and its
module tree, values and tensors (mr.json, weights.safetensors). The archive holds, under one top directory:

* `code/__torch__/**.py`: the code files exactly as the image held them;
* `data.pkl`: the module objects, pickled the way torch's own pickler does (protocol 2; each module an object of
  its TorchScript class, `__torch__.a.b.Name`, built from a dict of its attributes: submodules, tensors as
  persistent storages, ints, floats, bools, strings, tuples, typed lists); class constants are not attributes,
  they are in the code;
* `data/N`: each tensor's bytes, copied from weights.safetensors;
* `constants.pkl` and `constants/N`: the tensor constants the code names `CONSTANTS.cN`, with the values read from
  the graph nodes that hold them (`torchscript.sources`; code using one that was not read is refused before this is
  written); `version`, `byteorder`.

Nothing here imports torch or runs the code: `zen reuse` writes the archive; `load()` hands it to torch.jit.load.
"""

from __future__ import annotations

import ast
import os
import re
import struct
import zipfile
from pathlib import Path

from zen.runtime.errors import ZenError

ARCHIVE = "model.pt"
TOP = "model"
FORMAT_VERSION = b"3\n"  # what torch.jit.save of torch 2.x writes (the loader's upgraders key on it)
STORAGES = {"float32": "FloatStorage", "float64": "DoubleStorage", "float16": "HalfStorage", "bfloat16": "BFloat16Storage",
            "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage", "int8": "CharStorage",
            "uint8": "ByteStorage", "bool": "BoolStorage", "complex64": "ComplexFloatStorage",
            "complex128": "ComplexDoubleStorage"}  # fmt: skip
LIST_BUILDERS = {int: "build_intlist", float: "build_doublelist", bool: "build_boollist"}
# a class name from the image becomes a pickle GLOBAL (newline-terminated): only dotted identifiers are written
QUALIFIED = re.compile(r"__torch__(\.[A-Za-z_][A-Za-z0-9_]*)+")
USES = re.compile(r"CONSTANTS\.(c\d{1,6})\b")
NUMPY = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "int64": "<i8", "int32": "<i4", "int16": "<i2",
         "int8": "i1", "uint8": "u1", "bool": "?"}  # fmt: skip
CODE_FILE = re.compile(r"code/__torch__(/[A-Za-z_][A-Za-z0-9_]*)*\.py")  # as torchscript.sources takes them


class ArchiveError(ZenError):
    pass


def archive_problems(mr) -> list[str]:
    """Why no archive can be written for this TorchScript case (empty: it can)."""
    ts = (mr.deployment or {}).get("torchscript") or {}
    if from_graphs(ts):
        out: list[str] = []
    else:  # a traced model's own reason first: its code files were never expected to be in the image
        trace = ts.get("trace") or {}
        out = [f"a traced graph was not printed again: {why}" for why in
               [*trace.get("problems", []), *(trace.get("refused") or {}).values()]]  # fmt: skip
        out += [f"TorchScript code file {f} was not found in the image" for f in ts.get("missing", [])]
        out += [f"two different texts of TorchScript code file {f} are in the image" for f in ts.get("conflicts", [])]
        out += list(ts.get("problems", []))
        if not ts.get("files"):
            out.append("no TorchScript code was read (a profile without the code layout?)")
        known = set(ts.get("tensor_constants") or {})
        out += [f"{f} uses tensor constant CONSTANTS.{c}, whose value was not found in the image"
                for f, text in sorted((ts.get("files") or {}).items())
                for c in sorted(set(USES.findall(text)) - known)]  # fmt: skip
    out += [f"TorchScript class name {n[:80]!r} (module {p or 'model'}) is not a qualified name: refused"
            for p, n in (ts.get("classes") or {}).items() if not QUALIFIED.fullmatch(n)]  # fmt: skip
    out += [f"code file name {f[:80]!r} is not one torch.jit.save writes: refused"
            for f in (ts.get("files") or {}) if not CODE_FILE.fullmatch(f)]  # fmt: skip
    out += [f"{m.path or 'model'}.{n}: a tensor in a plain attribute, which zen does not write yet"
            for m in mr.modules for n in m.unregistered_tensors]  # fmt: skip
    out += [f"{t.key}: a {t.dtype} tensor, which a TorchScript archive written by zen cannot hold yet"
            for t in mr.tensors if t.dtype not in STORAGES]  # fmt: skip
    return out


class _Pickle:
    """The protocol-2 opcodes torch's own pickler uses for module state (no memo: the loader needs none)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")

    def glob(self, module: str, name: str) -> None:
        self.out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    def value(self, v) -> None:
        o = self.out
        if v is None:
            o += b"N"
        elif v is True or v is False:
            o += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            if -(1 << 31) <= v < 1 << 31:
                o += b"J" + struct.pack("<i", v)
            else:
                raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
                o += b"\x8a" + bytes([len(raw)]) + raw
        elif isinstance(v, float):
            o += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            raw = v.encode("utf-8", "surrogatepass")
            o += b"X" + struct.pack("<I", len(raw)) + raw
        elif isinstance(v, tuple):
            o += b"("
            for x in v:
                self.value(x)
            o += b"t"
        elif isinstance(v, list):
            kinds = {type(x) for x in v}
            builder = LIST_BUILDERS.get(next(iter(kinds))) if len(kinds) == 1 else None
            if builder:  # torch.jit._pickle's typed lists, as torch writes List[int], List[float], List[bool]
                self.glob("torch.jit._pickle", builder)
                o += b"("
            o += b"](" if v else b"]"
            for x in v:
                self.value(x)
            o += b"e" if v else b""
            if builder:
                o += b"tR"
        else:
            raise ArchiveError(f"a value of type {type(v).__name__} cannot be written to a TorchScript archive")

    def tensor(self, storage: str, dtype: str, numel: int, shape: list[int], requires_grad: bool) -> None:
        stride, acc = [], 1
        for d in reversed(shape):
            stride.insert(0, acc)
            acc *= max(d, 1)
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.out += b"(("
        self.value("storage")
        self.glob("torch", STORAGES[dtype])
        self.value(storage)
        self.value("cpu")
        self.value(numel)
        self.out += b"tQ"  # the persistent id: ('storage', class, key, location, numel)
        self.value(0)
        self.value(tuple(shape))
        self.value(tuple(stride))
        self.value(bool(requires_grad))
        self.glob("collections", "OrderedDict")
        self.out += b")RtR"


def _literal(enc, where: str):
    if isinstance(enc, dict) and "lit" in enc:
        text = enc["lit"]
        return float(text) if text in ("nan", "inf", "-inf") else ast.literal_eval(text)
    if isinstance(enc, dict) and "tuple" in enc:
        return tuple(_literal(x, where) for x in enc["tuple"])
    if isinstance(enc, dict) and "list" in enc:
        return [_literal(x, where) for x in enc["list"]]
    raise ArchiveError(f"{where}: a value zen did not decode ({str(enc)[:120]})", "see mr.json's module state")


def from_graphs(ts: dict) -> bool:
    """True when the code comes from the traced graphs (`torchscript.trace_ir`), not from text in the image: no
    code file was found, and every class of the model has a plan."""
    trace = ts.get("trace") or {}
    plans = trace.get("plans") or {}
    return bool(plans) and not trace.get("refused") and not trace.get("problems") and set(
        (ts.get("classes") or {}).values()) <= set(plans)  # fmt: skip


def _write_constants(z: zipfile.ZipFile, constants: dict[str, dict]) -> None:
    """`constants.pkl`: the tuple `CONSTANTS.cN` indexes, each tensor's bytes in `constants/N` (the values read from
    the image; an index the code never uses holds an empty tensor, as nothing reads it)."""
    import numpy as np

    count = 1 + max((int(k[1:]) for k in constants), default=-1)
    pk = _Pickle()
    pk.out += b"("
    for i in range(count):
        c = constants.get(f"c{i}") or {"dtype": "float32", "shape": [0], "values": []}
        if c["dtype"] not in NUMPY:
            raise ArchiveError(f"tensor constant c{i} of dtype {c['dtype']} cannot be written")
        conv = bool if c["dtype"] == "bool" else float if c["dtype"].startswith("float") else int
        data = np.array([v == "True" if conv is bool else conv(v) for v in c["values"]], NUMPY[c["dtype"]]).tobytes()
        pk.tensor(str(i), c["dtype"], len(c["values"]), list(c["shape"]), False)
        z.writestr(f"{TOP}/constants/{i}", data)
    pk.out += b"t."
    z.writestr(f"{TOP}/constants.pkl", bytes(pk.out))


def write_archive(mr, weights: Path, out: Path, files: dict[str, str] | None = None) -> Path:
    """Write `out/model.pt` from the case's MR and tensors (`files`: code printed from traced graphs, else the
    code files read from the image); the archive's path."""
    from zen.represent.tensorfile import read_header

    problems = archive_problems(mr)
    if problems:
        raise ArchiveError(f"no TorchScript archive can be written: {problems[0]}", "see mr.json's deployment.torchscript")
    ts = mr.deployment["torchscript"]
    records = {t.key: t for t in mr.tensors}
    by_path = {m.path: m for m in mr.modules}
    storages: dict[str, str] = {}  # tensor key -> storage name in data/
    pk = _Pickle()

    def module(path: str, depth: int = 0) -> None:
        if depth > 10_000:
            raise ArchiveError("module tree deeper than 10,000 levels")
        m = by_path[path]
        qualified = ts["classes"][path]
        pk.glob(*qualified.rsplit(".", 1))
        pk.out += b")\x81}("
        consts = set(ts.get("constants", {}).get(path, []))
        for name, enc in m.state.items():
            if name not in consts:
                pk.value(name)
                pk.value(_literal(enc, f"{path or 'model'}.{name}"))
        for name, key in {**m.parameter_keys, **m.buffer_keys}.items():
            pk.value(name)
            if key is None:
                pk.value(None)
                continue
            t = records[key]
            src = t.tied_to or key
            storages.setdefault(src, str(len(storages)))
            numel = 1
            for d in t.shape:
                numel *= d
            pk.tensor(storages[src], t.dtype, numel, list(t.shape), bool(t.requires_grad))
        for name, child in m.child_paths.items():
            pk.value(name)
            if child is None:
                pk.value(None)
            else:
                module(child, depth + 1)
        pk.out += b"ub"

    module(mr.modules[0].path)
    pk.out += b"."
    path = Path(out) / ARCHIVE
    part = path.with_name(ARCHIVE + ".part")  # an interrupted write never leaves a model.pt that load() would open
    with open(weights, "rb") as fh, zipfile.ZipFile(part, "w", zipfile.ZIP_STORED) as z:
        entries, _meta, base = read_header(Path(weights), fh, os.fstat(fh.fileno()).st_size)
        z.writestr(f"{TOP}/data.pkl", bytes(pk.out))
        for name, text in sorted((files if files is not None else ts["files"]).items()):
            z.writestr(f"{TOP}/{name}", text.encode("utf-8"))
        _write_constants(z, ts.get("tensor_constants") or {})
        for key, name in storages.items():
            e = entries.get(key)
            if e is None:
                raise ArchiveError(f"tensor {key} is not in {weights.name}", "recover the case again")
            fh.seek(base + e["start"])
            z.writestr(f"{TOP}/data/{name}", fh.read(e["end"] - e["start"]))
        z.writestr(f"{TOP}/version", FORMAT_VERSION)
        z.writestr(f"{TOP}/byteorder", b"little")
    os.replace(part, path)
    return path
