"""The programmatic representation (PR) and the unified representation (UR) of a recovered model.

PR (ZEN Eq. 3): the classes, functions and code objects implementing the model, each code object
with its function ID, attributes, a hash of its de-specialised bytecode and a version-normalised
instruction listing; the system-wide census they were filtered from (Table I); the packages the
code comes from (the execution context E, Eq. 6).

UR (Eq. 4-5): ϕ maps every node of the module tree to exactly one class (its primary
programmatic element), plus the code implementing it: the methods of its model-specific classes
and everything those call. A helper reached from several nodes is *owned* by the first node (in
module-tree order) that reaches it and *used* by the others, so every code object has exactly
one owning node while each node still lists its full closure.

Plain data; versioned (`"format": 1`); deterministic for one image.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from zen.represent.jsontext import as_plain, compact

PR_FORMAT = 1
UR_FORMAT = 1


@dataclass
class Signature:
    args: list[str]
    posonly: int
    kwonly: list[str]
    varargs: str | None
    varkw: str | None
    defaults: int  # positional defaults present
    kwdefaults: list[str]  # keyword-only names with defaults

    def text(self) -> str:
        parts = []
        n_pos = len(self.args)
        for i, a in enumerate(self.args):
            d = "=…" if i >= n_pos - self.defaults else ""
            parts.append(a + d)
            if self.posonly and i == self.posonly - 1:
                parts.append("/")
        if self.varargs:
            parts.append("*" + self.varargs)
        elif self.kwonly:
            parts.append("*")
        parts += [k + ("=…" if k in self.kwdefaults else "") for k in self.kwonly]
        if self.varkw:
            parts.append("**" + self.varkw)
        return "(" + ", ".join(parts) + ")"


@dataclass
class CodeRecord:
    """One model-specific code object with everything a fingerprint compares."""

    address: str
    function: str | None  # the (first) function object holding this code (None for nested code)
    fid: str  # function ID: module:qualname(signature)
    module: str
    qualname: str
    owner_class: str | None
    signature: Signature | None
    argcount: int
    posonlyargcount: int
    kwonlyargcount: int
    nlocals: int
    stacksize: int
    flags: int
    varnames: list[str]
    cellvars: list[str]
    freevars: list[str]
    names: list[str]
    consts: list[str]  # display forms (code objects as <code qualname>, sets sorted)
    filename: str
    firstlineno: int
    calls: dict[str, Any]  # {"observed": n (saturates), "saturated": bool, "specialised": bool}
    bytecode_sha256: str
    listing_sha256: str
    listing: list[str]
    functions: list[str] = field(default_factory=list)  # every model function using this code object
    attr: str | None = None  # the owner class's dict key holding the function
    binding: str | None = None  # "function", "staticmethod", "classmethod", "property.fget", ...
    defaults_enc: dict | None = None  # encoded __defaults__ / __kwdefaults__ / closure cells (cpython.snapshot)
    kwdefaults_enc: dict | None = None
    closure_enc: list[dict] = field(default_factory=list)
    globals_module: str | None = None  # __name__ of the function's globals, when not `module`
    dict_enc: dict | None = None  # the function's __dict__ (e.g. __wrapped__ of a decorator's wrapper)
    # the other model functions sharing this code object (one decorator's wrapper on many methods):
    # per function {function, qualname, module, globals_module, owner, attr, binding, defaults_enc, kwdefaults_enc,
    # closure_enc, dict_enc}
    others: list[dict] = field(default_factory=list)
    parent: str | None = None  # enclosing code object for nested code
    children: list[str] = field(default_factory=list)
    defaults: str | None = None  # repr of __defaults__ (plain values) for functions
    kwdefaults: str | None = None
    closure: list[str] = field(default_factory=list)  # display of closure cell contents


@dataclass
class ClassRecord:
    address: str
    name: str  # module.qualname
    module: str
    qualname: str
    bases: list[str]
    mro_names: list[str]  # (not "mro": a dataclass would take type.mro for a default)
    methods: list[str]  # attribute names holding functions (incl. static/class methods, properties)
    model_specific: bool
    attributes: dict[str, Any] = field(default_factory=dict)  # other class-dict entries, encoded
    metaclass: str | None = None  # module:qualname when not `type`


@dataclass
class ProgrammaticRepresentation:
    codes: list[CodeRecord]
    classes: list[ClassRecord]
    modules: dict[str, str | None]  # model-specific module name -> file
    dependencies: dict[str, int]  # excluded modules referenced by model code -> references
    counts: dict[str, dict[str, int]]  # Table I: {"system": {...}, "model": {...}}
    context: dict[str, Any]  # execution context E
    system_codes: list[list]  # compact: [address, module, qualname, bytecode_sha256] for every code object
    exclusion: list[str] = field(default_factory=list)  # what "not model code" meant here
    # module -> {global name referenced by its model code (LOAD_GLOBAL) -> encoded value (cpython.snapshot)}
    module_globals: dict[str, dict[str, Any]] = field(default_factory=dict)
    listing_version: int = 1  # zen.cpython.code.listing.LISTING_VERSION of the listings (1: before it was recorded)
    format: int = PR_FORMAT

    def to_json(self) -> dict[str, Any]:
        # shallow conversion: dataclasses.asdict deep-copies and is 10x slower on thousands of records
        d = dict(vars(self))
        d["codes"] = [record_json(c) for c in self.codes]
        d["classes"] = [dict(vars(c)) for c in self.classes]
        return {"format": d.pop("format"), "kind": "zen-pr", **d}

    def dumps(self) -> str:
        """Compact JSON text (one code record per line; `jq .` pretty-prints it)."""
        return self.dump_bytes().decode("utf-8")

    def dump_bytes(self, system_codes: bytes | None = None, more_codes: EncodedRecords | None = None) -> bytes:
        """`dumps()` as the UTF-8 file `textio.write_text` writes. A PR holds thousands of records
        and no floats: `jsontext.compact` writes them. `system_codes`: that table already
        encoded (`compact(rows)`, made by another process while this one built the rest); it
        replaces the object's own. `more_codes`: code records after the object's own, as another
        process encoded them (`build_pr(encoded=...)` counted them), written as they are."""
        d = self.to_json()
        codes = d.pop("codes")
        head = b",".join(compact(k) + b":" + (system_codes if k == "system_codes" and system_codes is not None else compact(v))
                         for k, v in d.items())  # fmt: skip
        body = b",\n".join(compact(c) for c in codes)
        if more_codes is not None and more_codes.lines:  # compact JSON holds no raw newline: each one ends a record
            body = b",\n".join(part for part in (body, more_codes.lines.replace(b"\n", b",\n")) if part)
        return b"".join((b"{", head, b',"codes":[\n', body, b"\n]}\n"))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProgrammaticRepresentation:
        if d.get("kind") != "zen-pr" or d.get("format") != PR_FORMAT:
            raise ValueError(f"not a zen PR (format {PR_FORMAT})")
        codes = [record_from_json(c) for c in d["codes"]]
        return cls(
            codes=codes, classes=[ClassRecord(**c) for c in d["classes"]], modules=d["modules"],
            dependencies=d["dependencies"], counts=d["counts"], context=d["context"], system_codes=d["system_codes"],
            exclusion=d.get("exclusion", []), module_globals=d.get("module_globals", {}),
            listing_version=d.get("listing_version", 1),
        )  # fmt: skip


def record_json(c: CodeRecord) -> dict[str, Any]:
    """A code record as pr.json holds it (the fields in order, the signature as an object)."""
    return {**vars(c), "signature": vars(c.signature) if c.signature else None}


def record_from_json(d: dict[str, Any]) -> CodeRecord:
    """`CodeRecord(**d)` (the signature as a `Signature`), without the call: a transformers pr.json holds ~4,500
    records of 35 fields, and the keyword call took 0.08 s of every command reading it (this: 0.03 s). The fields
    in their order, defaults where absent; an unknown field is a TypeError, a missing one a KeyError (the callers
    catch both, as they caught the call's TypeError)."""
    r = _new(CodeRecord)
    if tuple(d) == _CODE_FIELDS:  # every field, in order, as zen writes them: a copy of the dict is the record's
        r.__dict__ = dict(d)  # (0.07 -> 0.01 s of a transformers pr.json; the caller's dict is left as it was)
    elif not d.keys() <= _CODE_FIELD_SET:
        raise TypeError(f"CodeRecord got unexpected fields {sorted(d.keys() - _CODE_FIELD_SET)[:3]}")
    else:
        r.__dict__.update({k: d[k] if k in d else _CODE_DEFAULTS[k]() for k in _CODE_FIELDS})
    r.signature = Signature(**d["signature"]) if d.get("signature") else None
    return r


_new = object.__new__
_CODE_FIELDS = tuple(f.name for f in fields(CodeRecord))
_CODE_FIELD_SET = frozenset(_CODE_FIELDS)
_CODE_DEFAULTS = {f.name: f.default_factory if f.default_factory is not MISSING else (lambda v=f.default: v)
                  for f in fields(CodeRecord) if f.default is not MISSING or f.default_factory is not MISSING}  # fmt: skip


def lines_to_bytes(items: list[dict[str, Any]]) -> bytes:
    """JSON objects as pr.json holds them: one compact object per line."""
    return b"\n".join(compact(d) for d in items)


def lines_from_bytes(data: bytes) -> list[dict[str, Any]]:
    """`lines_to_bytes` read back, exactly: a line orjson reads differently than json would (it
    reads an int beyond 64 bits as a float, and refuses an escaped lone surrogate) is read by
    json, so every object is written again to the same bytes."""
    import json

    import orjson

    out = []
    for line in data.split(b"\n") if data else ():
        try:
            d = orjson.loads(line)
            if compact(d) != line:
                d = json.loads(line)
        except orjson.JSONDecodeError:
            d = json.loads(line)
        out.append(d)
    return out


def records_to_bytes(records: list[CodeRecord]) -> bytes:
    return lines_to_bytes([record_json(c) for c in records])


def records_from_bytes(data: bytes) -> list[CodeRecord]:
    return [record_from_json(d) for d in lines_from_bytes(data)]


@dataclass
class EncodedRecords:
    """Code records as pr.json holds them (`records_to_bytes`: one per line), with the one field the rest of the PR
    needs from them (each record's module). `zen recover` makes part of its records in a forked child; the parent
    writes the child's lines into pr.json as they are instead of decoding them into records and encoding them again
    (the same bytes: the same `compact` of the same `record_json`, in one process or the other)."""

    lines: bytes
    modules: list[str]

    def __len__(self) -> int:
        return len(self.modules)

    def records(self) -> list[CodeRecord]:
        return records_from_bytes(self.lines)

    def to_bytes(self) -> bytes:
        return compact(self.modules) + b"\n" + self.lines

    @classmethod
    def from_bytes(cls, data: bytes) -> EncodedRecords:
        head, _, lines = data.partition(b"\n")
        modules = json.loads(head)
        if not isinstance(modules, list) or len(modules) != (lines.count(b"\n") + 1 if lines else 0):
            raise ValueError("encoded code records: the module list does not match the records")
        return cls(lines, modules)


def encode_records(records: list[CodeRecord]) -> EncodedRecords:
    return EncodedRecords(records_to_bytes(records), [c.module for c in records])


def classes_to_bytes(classes: list[ClassRecord]) -> bytes:
    return lines_to_bytes([dict(vars(c)) for c in classes])


def classes_from_bytes(data: bytes) -> list[ClassRecord]:
    return [ClassRecord(**d) for d in lines_from_bytes(data)]


@dataclass
class NodeMapping:
    path: str
    cls: str  # ϕ(node): the one primary programmatic element
    classes: list[str]  # model-specific classes in the node class's MRO
    methods: list[str]  # code addresses of those classes' methods
    owned: list[str]  # closure code objects this node owns (first to reach them)
    used: list[str]  # closure code objects owned by an earlier node


@dataclass
class UnifiedRepresentation:
    """ϕ as a list of node mappings. By construction every node maps to exactly one class (its
    `cls`) and every code object is owned by exactly one node (Eq. 4); `shared_code_objects`
    counts the helpers other nodes also use."""

    nodes: list[NodeMapping]
    shared_code_objects: int = 0
    format: int = UR_FORMAT

    def to_json(self) -> dict[str, Any]:
        d = as_plain(self)
        return {"format": d.pop("format"), "kind": "zen-ur", **d}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> UnifiedRepresentation:
        if d.get("kind") != "zen-ur" or d.get("format") != UR_FORMAT:
            raise ValueError(f"not a zen UR (format {UR_FORMAT})")
        return cls(nodes=[NodeMapping(**n) for n in d["nodes"]], shared_code_objects=d.get("shared_code_objects", 0))
