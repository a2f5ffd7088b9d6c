"""Making classes as the image had them, in this process (reuse only; see zen.patch.apply).

Most recovered classes are made with `types.new_class` from their recovered namespace. Two kinds
cannot be: an `enum.Enum`'s class dictionary holds the enum machinery's own state (`_member_map_`,
`_value2member_map_`, ...) that its metaclass refuses to be given, and a `collections.namedtuple`'s
field accessors are C descriptors no encoding carries. Both are made the way their own factories
make them, from what the recovered namespace says (members and their values; field names and
defaults).
"""

from __future__ import annotations

import types
from typing import Any


def bind_ns(ns: dict, attr: str, binding: str, f: types.FunctionType) -> None:
    if binding == "staticmethod":
        ns[attr] = staticmethod(f)
    elif binding == "classmethod":
        ns[attr] = classmethod(f)
    elif binding.startswith("property."):
        part = binding.split(".", 1)[1]
        cur = ns.get(attr)
        ns[attr] = ({"fget": cur.getter, "fset": cur.setter, "fdel": cur.deleter}[part](f)
                    if isinstance(cur, property) else property(**{part: f}))  # fmt: skip
    else:
        ns[attr] = f


def namedtuple_fields(c: dict, bases: tuple) -> tuple[str, ...] | None:
    """The fields of a recovered class made by collections.namedtuple (None for other classes)."""
    enc = c["attributes"].get("_fields") or {}
    if bases != (tuple,) or "tuple" not in enc:
        return None
    names = [x.get("lit") for x in enc["tuple"]]
    if not all(isinstance(n, str) for n in names):
        return None
    from zen.patch.decode import literal

    return tuple(literal(n) for n in names)


def namedtuple_class(c: dict, fields: tuple[str, ...], module: str) -> type:
    import collections

    from zen.patch.decode import literal

    defaults = {literal(k["lit"]): literal(v["lit"]) for k, v in (c["attributes"].get("_field_defaults") or {}).get("dict", [])
                if "lit" in k and "lit" in v}  # fmt: skip
    tail = [defaults[f] for f in fields if f in defaults]
    if tail and list(defaults) != list(fields[len(fields) - len(tail) :]):
        tail = []
    cls = collections.namedtuple(c["name"], fields, defaults=tail or None, module=module)
    cls.__qualname__ = c["qualname"]
    return cls


def sunder(name: str) -> bool:
    return len(name) > 2 and name[0] == name[-1] == "_" and name[1] != "_" and name[-2] != "_"


def enum_members(c: dict) -> dict[str, Any]:
    """{member name: value} of a recovered Enum class, in definition order, from its
    `_value2member_map_` (value -> member) and `_member_names_`: members themselves are encoded
    as references to the class being made, so their values come from the enum's own map."""
    from zen.patch.decode import literal

    attrs = c["attributes"]
    order = [literal(x["lit"]) for x in (attrs.get("_member_names_") or {}).get("list", []) if "lit" in x]
    values: dict[str, Any] = {}
    for k, v in (attrs.get("_value2member_map_") or {}).get("dict", []):
        if "lit" in k and v.get("enum") == c["key"] and v.get("name") in order:
            values.setdefault(v["name"], literal(k["lit"]))
    return {n: values[n] for n in order if n in values}


def fill_class_cell(f: types.FunctionType, cls: type) -> None:
    """`super()` without arguments reads the `__class__` cell: point it at the class now holding f."""
    for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        if name == "__class__":
            cell.cell_contents = cls
