"""`zen recover`'s code stage: pr.json, ur.json, code.marshal and requirements.txt (ZEN §IV-A).

The closure of the model's code is one walk, in this process. What follows it is split between
this process and forked copies of it (`zen.runtime.forking`), each starting with everything read so far:

    child 1 (from the start)  the system-wide code table (needs no closure)
    child 2 (after the walk)  the classes' records and part of the code records (by estimated
                              cost, so that both processes are done about together); not with
                              two cores (below)
    child 3 (after the walk)  code.marshal and the UR (at a lower priority: needed last)
    this process              the other code records, the context and the module globals (from
                              the closure, while the child makes its records), then pr.json

The children keep off this process's core while it works (`zen.runtime.affinity`). With two cores
they share the other one (with the tensor files' writer and the image digest), so this process,
alone on its core, makes every code record and the class records itself: measured on GPT-2, it
waited 0.3-0.39 s for child 2 when that made a tenth of the code records, 0.11-0.18 s when it made
only the class records (0.22 s here).

Every part is computed by the same functions as in one process, and where a child does not
deliver, this process computes its part itself: the files are the same either way
(`tests/test_marshal_canonical.py` recovers with `ZEN_FORK=0` and compares). The cyclic GC stays
off for the whole stage: it allocates millions of small, acyclic, long-lived records that the
collector would traverse again and again for nothing (`gc_paused`); the case bytes do not depend
on it (`canonical_marshal`).
"""

from __future__ import annotations

import struct
from functools import partial
from pathlib import Path

from zen.cpython.code.codebuild import can_rebuild
from zen.cpython.program.module_globals import module_globals
from zen.cpython.program.programmatic import (
    build_pr,
    build_ur,
    class_records,
    code_records,
    gc_paused,
    model_closure,
)
from zen.cpython.program.system_table import system_table
from zen.cpython.runtime import Runtime
from zen.evidence.hashing import Meanwhile
from zen.represent import case, textio
from zen.represent.jsontext import compact
from zen.represent.pr import EncodedRecords, classes_from_bytes, classes_to_bytes, encode_records
from zen.runtime.errors import ZenError
from zen.runtime.forking import NICE_ANALYSIS_PART, Forked, cores
from zen.runtime.leave import abandon

# cost estimate of one code record: a fixed part plus its bytecode (listing, constants)
RECORD_FIXED_COST = 400
# This process's share of the code records, with more than two cores. The child also makes the
# class records (about a quarter of the records' time on a transformers model), this process the
# execution context: with a core each, 0.6 balances the two.
PARENT_SHARE = 0.6


def write_code(out: Path, ip, heap, found, index, mr, space) -> dict[str, Meanwhile]:
    """The collector stays off for the whole stage, and the runtime (its caches: a few hundred
    thousand decoded instructions and records) is dropped before it is back on. Its first pass then
    has next to nothing to look at, instead of 0.05 s over objects about to be freed anyway. In the
    `zen` command, which leaves by os._exit, the runtime is not freed at all (`leave.abandon`).
    Returns the sha256 of the files it wrote that are worth hashing from memory (pr.json), being computed."""
    with gc_paused():
        rt = Runtime(ip, heap, found)
        system = Forked(partial(_system_table_bytes, rt))
        try:
            return _write(out, ip, rt, index, mr, space, system)
        finally:
            system.cancel()
            abandon(rt)
            del rt, system  # freed here by reference counting, while the collector is off (unless abandoned)


def _system_table_bytes(rt: Runtime) -> bytes:
    return compact(system_table(rt))


def _write(out: Path, ip, rt: Runtime, index, mr, space, system: Forked) -> dict[str, Meanwhile]:
    from zen.cpython.program.context import execution_context

    if (mr.deployment or {}).get("form") == "torchscript":  # the Python classes it was scripted from, if alive
        from zen.frontends.pytorch.torchscript.models import eager_classes

        eager = mr.deployment.get("eager") or {}
        if eager.get("complete"):  # scripted here: the classes the process compiled it from (torchscript.eager)
            nodes = [(p, int(a, 16)) for p, a in eager.get("addresses", {}).items()]
        else:
            by_name = eager_classes(rt, mr)
            nodes = [(m.path, by_name[m.cls]) for m in mr.modules if m.cls in by_name]
    else:
        nodes = [(path, node.type.addr) for path, node in index.walk(int(mr.root.address, 16))]
    seeds = sorted({t for _, t in nodes})
    result = model_closure(rt, seeds)
    readable = [c for c in sorted(result.codes) if rt.code(c) is not None]  # one PR record each
    theirs = None  # with two cores this process makes every record (module docstring)
    cut = len(readable)
    if cores() > 2:
        cut = _balanced_cut(rt, readable)
        theirs = Forked(lambda: _frame(encode_records(code_records(rt, result, readable[cut:])).to_bytes(),
                                       classes_to_bytes(class_records(rt, result))))  # fmt: skip
    # needed last: below the records' child, which this process waits for first
    rest = Forked(lambda: _marshal_and_ur(ip, rt, result, readable, nodes), nice=NICE_ANALYSIS_PART + 2)
    try:
        mine = code_records(rt, result, readable[:cut])
        info = getattr(space, "info", None)
        machine = "x86_64" if info is not None else None
        model_modules = {rt.module_name(f) or "?" for f in (rt.function(a) for a in result.functions) if f}
        context = execution_context(rt, model_modules, result.dependencies, {t.device for t in mr.tensors}, machine)
        loaded = module_globals(rt, result, readable)  # from the closure: while the child makes its records
        encoded = None
        if theirs is not None:
            records, classes_bytes = _unframe(theirs.result())
            # the child's records stay as it encoded them: written into pr.json as they are (`EncodedRecords`)
            encoded = EncodedRecords.from_bytes(records)  # type: ignore[arg-type]  # (the child always frames bytes)
            classes = classes_from_bytes(classes_bytes)
        else:
            classes = class_records(rt, result)
        pr = build_pr(rt, result, context, system=False, records=mine, classes=classes, encoded=encoded)
        pr.module_globals = loaded
        data = pr.dump_bytes(system_codes=system.result(), more_codes=encoded)
        # written and hashed by threads while the rest goes on; `run._finish` waits for both (and any write error)
        written = Meanwhile(data, out / case.PR_FILE)
        del data
        try:
            textio.write_text(out / case.REQUIREMENTS, "\n".join(context["requirements"]) + "\n")
            marshal, ur = _unframe(rest.result())
            (out / case.UR_FILE).write_bytes(ur)
            if marshal is not None:
                (out / case.CODE_FILE).write_bytes(marshal)
        except BaseException:
            written.join()  # no pr.json left being written behind a failed stage (the caller removes its files)
            raise
        return {case.PR_FILE: written}
    finally:
        if theirs is not None:
            theirs.cancel()
        rest.cancel()


def _balanced_cut(rt: Runtime, addrs: list[int]) -> int:
    """Where to split the code records between this process and the child that also makes the
    class records: this process takes `PARENT_SHARE` of their estimated cost."""
    costs = [RECORD_FIXED_COST + len(rt.code(a).code) for a in addrs]  # type: ignore[union-attr]
    mine, acc = sum(costs) * PARENT_SHARE, 0
    for i, c in enumerate(costs):
        acc += c
        if acc >= mine:
            return i + 1
    return len(addrs)


def _marshal_and_ur(ip, rt: Runtime, result, readable: list[int], nodes) -> bytes:
    """code.marshal (None where this Python cannot rebuild the image's code) and ur.json, framed."""
    marshal = _code_marshal(ip, rt, readable) if can_rebuild(ip) else None
    ur = build_ur(rt, nodes, [f"{c:#x}" for c in readable], result).dumps().encode("utf-8", "backslashreplace")
    return _frame(marshal, ur)


def _frame(first: bytes | None, second: bytes) -> bytes:
    """Two byte strings (the first may be None) as one."""
    return struct.pack("<q", -1 if first is None else len(first)) + (first or b"") + second


def _unframe(data: bytes) -> tuple[bytes | None, bytes]:
    (n,) = struct.unpack_from("<q", data)
    if n < 0:
        return None, data[8:]
    return data[8 : 8 + n], data[8 + n :]


def _code_marshal(ip, rt: Runtime, readable: list[int]) -> bytes:
    """Every readable code object of the closure rebuilt (in address order, as the PR lists them),
    in canonical marshal form (bytes independent of zen's own process)."""
    from zen.cpython.code import canonical_marshal
    from zen.cpython.code.codebuild import rebuild_code, rebuilt_memo

    memo = rebuilt_memo(ip)  # shared with the PR's encoder of nested functions (when in-process)
    codes = {}
    for addr in readable:
        try:  # from the code records the closure read already (rt.code), not read again
            codes[f"{addr:#x}"] = rebuild_code(ip, addr, memo, read=rt.code)
        except ZenError:
            continue
    return canonical_marshal.dumps(codes)
