"""Build code objects from `codebuild.code_spec` data inside an interpreter of the image's version.

zen's own interpreter cannot construct another minor version's code objects (`types.CodeType`
takes different arguments and bytecode is version specific); an interpreter of the image's
version can. Standard library only, and syntax every supported target interpreter accepts:

    python3.X -I -c 'import sys; sys.path.insert(0, SRC); from zen.cpython.code.codebuild_child import main; main()' SPEC OUT

reads a JSON list of specs from SPEC and writes the marshalled list of code objects to OUT, in
the canonical form of `canonical_marshal` (the same rule zen applies to its own code.marshal), so
that the bytes depend on the specs alone, not on this child's reference counts or interned strings.
Nothing built here is executed.
"""

from __future__ import annotations

import json
import sys
import types

from zen.cpython.code.canonical_marshal import dumps


def build(spec: dict):
    ((kind, v),) = spec.items()
    if kind == "code":
        return _code(v)
    if kind == "tuple":
        return tuple(build(x) for x in v)
    if kind == "frozenset":
        return frozenset(build(x) for x in v)
    if kind == "none":
        return None
    if kind == "ellipsis":
        return Ellipsis
    if kind == "int":
        return int(v)
    if kind == "float":
        return float(v)
    if kind == "complex":
        return complex(float(v[0]), float(v[1]))
    if kind == "bytes":
        return bytes.fromhex(v)
    if kind in ("str", "bool"):
        return v
    raise ValueError(f"unknown constant kind {kind}")


def _code(c: dict) -> types.CodeType:
    head = (c["argcount"], c["posonlyargcount"], c["kwonlyargcount"], c["nlocals"], c["stacksize"], c["flags"],
            bytes.fromhex(c["codestring"]), tuple(build(x) for x in c["consts"]), tuple(c["names"]),
            tuple(c["varnames"]), c["filename"], c["name"])  # fmt: skip
    tail = (tuple(c["freevars"]), tuple(c["cellvars"]))
    if sys.version_info >= (3, 11):  # noqa: UP036 - run by the image's interpreter, 3.8 and later
        args = (*head, c["qualname"], c["firstlineno"], bytes.fromhex(c["linetable"]), bytes.fromhex(c["exceptiontable"]), *tail)
    else:  # 3.8-3.10: no qualname, no exception table; the line table is co_lnotab / co_linetable
        args = (*head, c["firstlineno"], bytes.fromhex(c["linetable"]), *tail)
    return types.CodeType(*args)


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    with open(spec_path) as fh:
        specs = json.load(fh)
    codes = [build(s) for s in specs]
    with open(out_path, "wb") as fh:
        fh.write(dumps(codes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
