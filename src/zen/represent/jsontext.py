"""Compact JSON text of large records, fast and byte-for-byte what `json.dumps` writes.

A PR holds thousands of code records (a transformers process: 4,000 records, 20 MB of text);
the standard library's encoder spends a quarter of a second on them, orjson (a Rust encoder)
a fortieth. The two agree byte for byte on what case records hold (str, int, bool, None, lists,
tuples and str-keyed dicts, written compactly with non-ASCII kept), which the tests check on
the records of a real image and on generated strings. Where orjson refuses a value (a lone
surrogate carried from an image, an int beyond 64 bits, a non-str key) that record goes through
`json.dumps` instead, exactly as before: the output depends on the value only, never on which
encoder happened to be faster.

Floats are the exception the caller must rule out: orjson writes `1e-7` where `json` writes
`1e-07` (and NaN as null), and telling a float apart would cost as much as `json` itself. Code
records and the system table hold none by construction (values from an image are encoded as
their `repr` text, `cpython.snapshot`); `compact` is only used for them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import json
from collections.abc import Iterator
from typing import Any

from zen import native

try:
    import orjson
except ImportError:  # pragma: no cover - a declared dependency; the standard encoder is the same text
    orjson = None  # type: ignore[assignment]


def compact(obj: Any) -> bytes:
    """The UTF-8 bytes `textio.write_text` writes for `json.dumps(obj, ensure_ascii=False,
    separators=(",", ":"))` (a lone surrogate as its JSON escape), for float-free `obj`."""
    if orjson is not None:
        try:
            return orjson.dumps(obj, default=_refuse)
        except (TypeError, orjson.JSONEncodeError):
            pass
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


def _refuse(value: Any) -> Any:
    raise TypeError(f"not a plain JSON value: {type(value).__name__}")


def loads(text: bytes | str) -> Any:
    """`json.loads`, faster: orjson parses strict RFC 8259 JSON to the same values (floats bit for bit, checked in
    the tests); what it refuses (NaN, a number past a double, a lone surrogate, an integer past 64 bits, nesting
    past 1,024) goes to `json`, which decides as before. The cyclic collector is paused meanwhile (see
    `collector_paused`). orjson reads an integer past 64 bits as a float without a word: text that may hold one
    is left to json (`_long_number`)."""
    with collector_paused():
        if orjson is not None and not _long_number(text):
            try:
                return orjson.loads(text)
            except orjson.JSONDecodeError:
                pass
        return json.loads(text)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection while a large record is parsed and built: a 23 MB pr.json makes a million containers,
    all survivors, and the collections their allocation triggers walked them again and again (a third of the
    parse). What the block leaves unreachable in cycles is collected after it, as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_DIGIT_MAP = bytes(49 if 48 <= c <= 57 else 48 for c in range(256))  # digits -> "1", every other byte -> "0"
_RUN = b"1" * 19


def _long_number(text: bytes | bytearray | str) -> bool:
    """Whether `text` may hold a JSON integer of 19 digits or more (past 64 bits, or close): a run of digits that
    starts a value (after `[`, `:`, `,` or at the start; the manifest's stat times are such). Found by mapping
    digits to one byte and searching for 19 of them (bytes.find: 25 ms over a 23 MB pr.json, where a regex took
    165 ms). Runs inside strings (hex digests hold some) cost a look back each; past one per 4 KiB of text, json
    is simply used (bounded work)."""
    raw = text if isinstance(text, (bytes, bytearray)) else text.encode("utf-8", "surrogatepass")
    most = 64 + len(raw) // 4096
    if native.core is not None:  # the same answer in one pass, without the copy (0.06 s of a 25 MB pr.json)
        return native.core.long_number(raw, most)
    mask = raw.translate(_DIGIT_MAP)
    at, n = mask.find(_RUN), 0
    while at != -1:
        n += 1
        if n > most:
            return True
        i = at - 1
        while i >= 0 and raw[i] in b" \t\r\n-":
            i -= 1
        if i < 0 or raw[i] in b"[:,":
            return True
        end = mask.find(b"0", at)
        if end == -1:
            return False
        at = mask.find(_RUN, end)
    return False


_ATOMIC = frozenset((str, int, float, bool, type(None)))


def as_plain(obj: Any) -> Any:
    """`dataclasses.asdict(obj)`, the same values of the same types, without its `copy.deepcopy` of every leaf: a
    str, int, float, bool or None is its own copy (deepcopy returns it). GPT-2's MR: 60,000 leaves, 0.02 -> 0.005 s
    (CPython 3.12 added the same shortcut to `asdict`). Containers are copied as `asdict` copies them; anything
    else is deep-copied, as there."""
    if type(obj) in _ATOMIC:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[as_plain(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_plain(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((as_plain(k), as_plain(v)) for k, v in obj.items())
    return copy.deepcopy(obj)
