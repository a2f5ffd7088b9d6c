"""Case files are evidence read back by every later command: check their shape before use.

A case directory may have been altered, truncated or crafted. Before any command builds MR, PR or
UR objects from JSON, the data is checked against the schema those files are written from: the
dataclasses in `represent.mr` and `represent.pr` *are* the schema (field names, which are
required, and the type of each), so the checker reads their type hints instead of repeating them
in a second description that could drift. Errors name the file and the JSON path of the first
mismatch (`mr.json: modules[3].hyperparameters: expected an object, found a list`).

`json_schema()` renders the same hints as JSON Schema (draft 2020-12) for other tools; the tests
validate real cases with both. The manifest, which has no dataclass, has a JSON Schema data file
(`schemas/manifest.schema.json`), validated with jsonschema.

Depth is bounded twice: json's decoder stops at Python's recursion limit (a RecursionError here
becomes a clear error), and `MAX_DEPTH` bounds nesting inside free-form (`Any`) values, which
later readers (snapshot decoding in reuse, literal_eval of hyper-parameters) walk recursively.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from pathlib import Path
from typing import Any

from zen import native
from zen.represent.jsontext import collector_paused, loads
from zen.runtime.errors import ZenError

MAX_DEPTH = 200  # nesting of JSON containers in a case file (real cases stay below 40)
MAX_STRING = 1 << 20  # characters of one string (names, addresses, literals; real cases stay below 100,000)
MAX_BLOB_STRING = 1 << 28  # a library export carries each model's code.marshal as base64 (5 MB for a small CNN)


class CaseFileError(ZenError):
    """A case file is not valid: unreadable, not JSON, too deep, or not of the expected shape."""


def parse_json(path: Path, what: str | None = None, max_string: int = MAX_STRING) -> Any:
    """Parse a JSON file with bounded nesting; every failure is a CaseFileError naming the file."""
    what = what or Path(path).name
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise CaseFileError(f"{path} cannot be read: {exc.strerror or exc}") from None
    return parse_json_bytes(text, what, max_string)


def parse_json_bytes(text: bytes, what: str, max_string: int = MAX_STRING, *, walk: bool = True) -> Any:
    """`parse_json` of bytes already read (an upload to `zen serve`, a file read once and hashed). `walk=False`:
    the caller bounds depth and strings itself (`record_from_json` does, in its typed walk)."""
    try:
        data = loads(text)
    except RecursionError:
        raise CaseFileError(f"{what} is nested too deeply to be a zen file", "recover the case again") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CaseFileError(f"{what} is not valid JSON: {exc}", "recover the case again") from None
    if walk:
        check_depth(data, what, max_string=max_string)
    return data


def check_depth(data: Any, what: str, limit: int = MAX_DEPTH, max_string: int = MAX_STRING) -> None:
    """Iteratively verify that containers nest at most `limit` deep and no string (key or value) is longer than
    `max_string`: every later reader and printer may then treat values as small (a 100 MB "address" made
    `zen show` run for minutes)."""
    stack = [(data, 0)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            raise CaseFileError(f"{what} nests deeper than {limit} levels: not a zen file")
        if isinstance(v, dict):
            for k, x in v.items():
                if len(k) > max_string or (type(x) is str and len(x) > max_string):
                    raise CaseFileError(f"{what} holds a string of more than {max_string:,} characters: not a zen file")
            stack.extend((x, d + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            if any(type(x) is str and len(x) > max_string for x in v):
                raise CaseFileError(f"{what} holds a string of more than {max_string:,} characters: not a zen file")
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
        elif type(v) is str and len(v) > max_string:
            raise CaseFileError(f"{what} is a string of more than {max_string:,} characters: not a zen file")


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)  # fmt: skip


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _required(cls: type) -> frozenset[str]:
    return frozenset(
        f.name for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    )  # fmt: skip


def check(value: Any, hint: Any, where: str) -> None:
    """Raise CaseFileError if `value` (parsed JSON) does not fit the type hint `hint`."""
    if hint is Any:
        return
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return
        errors = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                check(value, opt, where)
                return
            except CaseFileError as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else CaseFileError(f"{where}: unexpected {_kind(value)}")
    if dataclasses.is_dataclass(hint):
        check_record(value, hint, where)
        return
    if origin is list or hint is list:
        if type(value) is not list:
            raise CaseFileError(f"{where}: expected a list, found {_kind(value)}")
        (item,) = typing.get_args(hint) or (Any,)
        if item is str:
            bad = next((i for i, x in enumerate(value) if type(x) is not str), None)
            if bad is not None:
                raise CaseFileError(f"{where}[{bad}]: expected a string, found {_kind(value[bad])}")
        elif item is not Any:
            for i, x in enumerate(value):
                check(x, item, f"{where}[{i}]")
        return
    if origin is dict or hint is dict:
        if type(value) is not dict:
            raise CaseFileError(f"{where}: expected an object, found {_kind(value)}")
        args = typing.get_args(hint)
        if args and args[1] is not Any:
            for k, x in value.items():
                check(x, args[1], f"{where}.{k}")
        return
    if hint is float:
        ok = type(value) in (int, float)
    elif hint is int:
        ok = type(value) is int
    else:
        ok = type(value) is hint
    if not ok:
        raise CaseFileError(f"{where}: expected {_kind(hint())}, found {_kind(value)}")


def check_record(value: Any, cls: type, where: str, header: tuple[str, ...] = ()) -> None:
    """A JSON object holding the fields of dataclass `cls` (plus `header` keys such as kind/format)."""
    if type(value) is not dict:
        raise CaseFileError(f"{where}: expected an object, found {_kind(value)}")
    hints = _hints(cls)
    unknown = [k for k in value if k not in hints and k not in header]
    if unknown:
        raise CaseFileError(f"{where}: unexpected field {unknown[0]!r}")
    missing = sorted(_required(cls) - value.keys())
    if missing:
        raise CaseFileError(f"{where}: missing field {missing[0]!r}")
    for k, v in value.items():
        if k in hints:
            check(v, hints[k], f"{where}.{k}")


def bounded_record(value: Any, cls: type, header: tuple[str, ...] = ()) -> bool:
    """True when `value` passes `check_depth` and `check_record` (a JSON object of dataclass `cls`), decided in
    one walk by validators compiled per type hint, with no JSON paths built. False means "not sure": the caller
    runs the two reporting checks, which name the first problem (or pass, and the record is used).

    Why: those two walked a transformers pr.json (23 MB, 300,000 values) twice in Python, 0.5 s of every
    command that reads a case; this walk visits each value once, and lists of strings in C (`map`)."""
    if type(value) is not dict:
        return False
    if native.core is not None:  # the same walk compiled (zen.native); this module's validators are its reference
        return native.core.record_ok(value, _spec(cls, header), 0, MAX_DEPTH, MAX_STRING)
    return _record_ok(cls, header)(value, 0)


# zen.native._core's spec tags: each type hint compiled into a tuple its C walk reads
_S_ANY, _S_STR, _S_INT, _S_FLOAT, _S_EXACT, _S_UNION, _S_LIST, _S_DICT, _S_RECORD = range(9)


@functools.cache
def _spec(hint: Any, header: tuple[str, ...] | None = None) -> tuple:
    """The spec of `hint` for `native.core.record_ok`, mirroring `_ok` case by case (`header`: the extra keys of
    a top-level record, as `_record_ok` takes them)."""
    if header is not None:
        fields = {k: _spec(h) for k, h in _hints(hint).items()}
        return (_S_RECORD, fields, frozenset(fields) | frozenset(header), _required(hint))
    if hint is Any:
        return (_S_ANY,)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        return (_S_UNION, type(None) in args, tuple(_spec(o) for o in args if o is not type(None)))
    if dataclasses.is_dataclass(hint):
        return _spec(hint, ())
    if origin is list or hint is list:
        (item,) = typing.get_args(hint) or (Any,)
        return (_S_LIST, _spec(item))
    if origin is dict or hint is dict:
        args = typing.get_args(hint)
        return (_S_DICT, _spec(args[1]) if args else (_S_ANY,))
    if hint is str:
        return (_S_STR,)
    if hint is float:
        return (_S_FLOAT,)
    if hint is int:
        return (_S_INT,)
    return (_S_EXACT, hint)


_Ok = typing.Callable[[Any, int], bool]  # (value, depth of the container holding it) -> fits


_NESTING = frozenset((dict, list))


def _flat_ok(values: Any, kinds: set) -> bool:
    """Strings among a flat container's values (their types `kinds`, none a container) within MAX_STRING."""
    if str not in kinds:
        return True
    if len(kinds) == 1:
        return max(map(len, values), default=0) <= MAX_STRING
    # str() of the scalars beside the strings (None, numbers: a few characters, an int at most 4,300 digits)
    # bounds the strings' lengths from above, in C; only a container near the limit is looked at closely
    return sum(map(len, map(str, values))) <= MAX_STRING or all(len(x) <= MAX_STRING for x in values if type(x) is str)


def _plain_ok(v: Any, d: int) -> bool:
    """`check_depth` of a free-form value found at depth `d`, answering instead of raising. A container of
    scalars (pr.json's 80,000 system-code rows) is decided in C, without the walk."""
    t = type(v)
    if t is str:
        return len(v) <= MAX_STRING
    if t is list:
        kinds = set(map(type, v))
        if kinds.isdisjoint(_NESTING):
            return d <= MAX_DEPTH and _flat_ok(v, kinds)
    elif t is dict:
        kinds = set(map(type, v.values()))
        if kinds.isdisjoint(_NESTING):
            return d <= MAX_DEPTH and max(map(len, v), default=0) <= MAX_STRING and _flat_ok(v.values(), kinds)
    else:
        return True
    return _walk_ok(v, d)


def _walk_ok(v: Any, d: int) -> bool:
    stack = [(v, d)]
    while stack:
        v, d = stack.pop()
        if type(v) is str:
            if len(v) > MAX_STRING:
                return False
            continue
        if d > MAX_DEPTH:
            return False
        if type(v) is dict:
            if any(len(k) > MAX_STRING for k in v):
                return False
            stack.extend((x, d + 1) for x in v.values() if type(x) in (dict, list, str))
        elif type(v) is list:
            stack.extend((x, d + 1) for x in v if type(x) in (dict, list, str))
    return True


def _strings_ok(v: Any, d: int) -> bool:
    return type(v) is list and d <= MAX_DEPTH and all(type(x) is str for x in v) and max(map(len, v), default=0) <= MAX_STRING


@functools.cache
def _ok(hint: Any) -> _Ok:
    """The validator of one type hint (cached: a record type's validators are built once per process)."""
    if hint is Any:
        return _plain_ok
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_ok(o) for o in typing.get_args(hint) if o is not type(None)]
        nullable = type(None) in typing.get_args(hint)
        return lambda v, d: (v is None and nullable) or any(o(v, d) for o in options)
    if dataclasses.is_dataclass(hint):
        return _record_ok(hint, ())
    if origin is list or hint is list:
        (item,) = typing.get_args(hint) or (Any,)
        if item is str:
            return _strings_ok
        if item is Any:
            return lambda v, d: type(v) is list and _plain_ok(v, d)
        each = _ok(item)
        return lambda v, d: type(v) is list and d <= MAX_DEPTH and all(each(x, d + 1) for x in v)
    if origin is dict or hint is dict:
        args = typing.get_args(hint)
        if not args or args[1] is Any:
            return lambda v, d: type(v) is dict and _plain_ok(v, d)
        each = _ok(args[1])
        return lambda v, d: (type(v) is dict and d <= MAX_DEPTH and all(len(k) <= MAX_STRING for k in v)
                             and all(each(x, d + 1) for x in v.values()))  # fmt: skip
    if hint is str:
        return lambda v, d: type(v) is str and len(v) <= MAX_STRING
    if hint is float:
        return lambda v, d: type(v) in (int, float)
    if hint is int:
        return lambda v, d: type(v) is int
    return lambda v, d: type(v) is hint


@functools.cache
def _record_ok(cls: type, header: tuple[str, ...]) -> _Ok:
    fields = {k: _ok(h) for k, h in _hints(cls).items()}
    allowed = frozenset(fields) | frozenset(header)
    required = _required(cls)

    def ok(v: Any, d: int) -> bool:
        if type(v) is not dict or d > MAX_DEPTH or not v.keys() <= allowed or not required <= v.keys():
            return False
        # a header key (kind, format) is checked by the caller; its string length here
        return all(fields[k](x, d + 1) if k in fields else _plain_ok(x, d + 1) for k, x in v.items())

    return ok


def load_record(path: Path, cls: type, kind: str, fmt: int) -> Any:
    """Parse `path`, check it against `cls` and its kind/format header, and build it with
    `cls.from_json`; every failure is a CaseFileError naming the file and where."""
    name = Path(path).name
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise CaseFileError(f"{path} cannot be read: {exc.strerror or exc}") from None
    with collector_paused():
        return record_from_json(parse_json_bytes(text, name, walk=False), cls, kind, fmt, name)


def record_from_json(data: Any, cls: type, kind: str, fmt: int, name: str) -> Any:
    """`load_record` of parsed JSON (from `parse_json_bytes`): the same checks, the same errors."""
    if type(data) is not dict:
        raise CaseFileError(f"{name}: expected an object, found {_kind(data)}", "recover the case again")
    if data.get("kind") != kind or data.get("format") != fmt:
        raise CaseFileError(f"{name} is not a {kind} file of format {fmt}", "recover the case again with this zen")
    if not bounded_record(data, cls, ("kind", "format")):  # the fast walk doubts: the slow one says where and why
        check_depth(data, name)
        check_record(data, cls, name, ("kind", "format"))
    try:
        return cls.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a check above should have said why
        raise CaseFileError(f"{name} is not valid: {exc}") from None


def json_schema(cls: type) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a dataclass's JSON form, from the same hints `check` uses."""
    defs: dict[str, Any] = {}

    def of(hint: Any) -> dict[str, Any]:
        if hint is Any:
            return {}
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [of(a) for a in typing.get_args(hint)]}
        if dataclasses.is_dataclass(hint):
            if hint.__name__ not in defs:
                defs[hint.__name__] = {}
                defs[hint.__name__] = record(hint)
            return {"$ref": f"#/$defs/{hint.__name__}"}
        if origin is list or hint is list:
            (item,) = typing.get_args(hint) or (Any,)
            return {"type": "array", "items": of(item)}
        if origin is dict or hint is dict:
            args = typing.get_args(hint)
            return {"type": "object", "additionalProperties": of(args[1]) if args else {}}
        return {"type": {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}[hint]}

    def record(c: type, header: tuple[str, ...] = ()) -> dict[str, Any]:
        props = {k: of(h) for k, h in _hints(c).items()}
        props.update({h: {} for h in header})
        return {"type": "object", "properties": props, "required": sorted(_required(c)), "additionalProperties": False}

    top = record(cls, ("kind", "format"))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": cls.__name__, **top, "$defs": defs}
