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

import json
from typing import Any

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
