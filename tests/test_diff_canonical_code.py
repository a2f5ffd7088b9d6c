"""Class attributes holding functions compare by code, not by how the marshal bytes were written.

Library entries and cases written before zen's canonical marshal hold plain `marshal.dumps`
bytes, whose back-references follow the writing process's reference counts. The differ must
not report such a function as changed against a case that stores the canonical bytes."""

from __future__ import annotations

import base64
import marshal
import sys

from zen.cpython.code.canonical_marshal import dumps
from zen.diff.differ import class_attribute_changes
from zen.represent.pr import ClassRecord


def _act(x, scale=2.0):
    y = x * scale
    return (y, "activation", ("relu", "gelu"))


def _other(x):
    return x + 1


def _enc(code_bytes: bytes) -> dict:
    return {
        "function": "fork:_act",
        "code": base64.b64encode(code_bytes).decode(),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }


def _cls(module: str, attrs: dict) -> ClassRecord:
    return ClassRecord(
        address="0x1",
        name=f"{module}.Block",
        module=module,
        qualname="Block",
        bases=[],
        mro_names=[],
        methods=[],
        model_specific=True,
        attributes=attrs,
    )


def test_old_plain_marshal_equals_canonical():
    raw, canon = marshal.dumps(_act.__code__), dumps(_act.__code__)
    assert raw != canon, "test needs bytes that differ only in how they were written"
    assert marshal.loads(raw) == marshal.loads(canon)
    base = {"b": _cls("base", {"act": _enc(raw), "expansion": 4})}
    rec = {"r": _cls("base", {"act": _enc(canon), "expansion": 4})}
    assert class_attribute_changes(rec, base, {"base:Block": "base:Block"}) == {}


def test_changed_function_and_value_still_reported():
    base = {"b": _cls("base", {"act": _enc(marshal.dumps(_act.__code__)), "expansion": 4})}
    rec = {"r": _cls("base", {"act": _enc(dumps(_other.__code__)), "expansion": 2})}
    out = class_attribute_changes(rec, base, {"base:Block": "base:Block"})
    assert set(out["base:Block"]) == {"act", "expansion"}


def test_unreadable_code_compared_as_is():
    bad = {"function": "x", "code": "not base64!!", "python": "3.11"}
    base = {"b": _cls("base", {"act": bad})}
    rec = {"r": _cls("base", {"act": dict(bad)})}
    assert class_attribute_changes(rec, base, {"base:Block": "base:Block"}) == {}
    rec2 = {"r": _cls("base", {"act": {**bad, "code": "AAAA"}})}
    assert "act" in class_attribute_changes(rec2, base, {"base:Block": "base:Block"})["base:Block"]
