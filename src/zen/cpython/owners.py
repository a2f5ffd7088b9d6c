"""Which classes hold a function: every class dict of the process, indexed by what it points to.

The closure resolves `self.name` through the classes that hold the function being scanned, and a
code record names the class that holds its function; both ask `Runtime.holders(f)` for a few
thousand functions, while the classes that may hold one are all of the process's heap classes
(~10,000 in a process that imported transformers, ~100,000 dict entries). Reading every class
namespace and the kind of every value in it to answer those questions cost more than the
questions. Here every entry's value, and the words a wrapper keeps its function in (staticmethod
and classmethod callable, property fget/fset/fdel, bound method im_func), are gathered at once
into one sorted array: a question looks its function up there and checks the few entries found
exactly as the per-class reading would (`Runtime.namespace`, `Runtime.bound_functions`), so the
answers, and their order, are the same (`tests/test_bulk_readers.py` compares them).
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from zen.memory.scan import gather_u64
from zen.runtime.errors import ZenError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


class RuntimeView(Protocol):
    """What the index needs of the runtime (zen.cpython.runtime.Runtime, which builds the index on first use): typed
    here so that owners depends on nothing above it."""

    ip: ImageReader

    def kind(self, addr: int) -> str: ...

    def type(self, addr: int) -> Any: ...

    type_addrs: list[int]

    def namespace(self, dict_addr: int) -> dict[str, int]: ...

    def namespace_table(self) -> Any: ...

    def bound_functions(self, v: int) -> Any: ...


Holder = tuple[int, str, str]  # (class address, attribute name, binding)


class OwnerIndex:
    """`holders(f)` for every function f: (class, attribute name, binding), classes in address
    order, attributes in dict order, a property's fget, fset, fdel in that order."""

    def __init__(self, rt: RuntimeView) -> None:
        # A proxy, not a reference: the runtime holds this index, and a cycle would leave the
        # runtime's caches (hundreds of thousands of decoded instructions) to the cyclic collector,
        # a 0.1 s pass over them once recovery drops the runtime, instead of freeing them at once.
        self.rt = weakref.proxy(rt)
        ip = rt.ip
        self.classes = [t for t in map(rt.type, rt.type_addrs) if t is not None and t.is_heap and t.dict_addr]
        table = rt.namespace_table()
        # the classes of each dict of the table (none: a module's; two only in a damaged image,
        # where a stale type object shares a live one's dict), and the items of the class dicts
        self.classes_of: dict[int, list[int]] = {}
        for ci, t in enumerate(self.classes):
            self.classes_of.setdefault(table.index[t.dict_addr], []).append(ci)
        is_class = np.zeros(len(table.dicts), dtype=bool)
        is_class[list(self.classes_of)] = True
        mine = is_class[table.owner]
        self.entry_ids = np.flatnonzero(mine)  # positions in the table's arrays
        self.table = table
        values = table.values[mine]
        # dicts the vectorised reader left alone: read class by class, as before
        self._read: dict[int, list[tuple[int, int, int, Holder]]] = {}
        for ci, t in enumerate(self.classes):
            if table.ok[table.index[t.dict_addr]]:
                continue
            for pos, (name, v) in enumerate(rt.namespace(t.dict_addr).items()):
                for bpos, (f, b) in enumerate(rt.bound_functions(v)):
                    self._read.setdefault(f, []).append((ci, pos, bpos, (t.addr, name, b)))
        # every word an entry may hold its function in: the value itself, and the fields of the
        # wrappers (a value that is no wrapper gives words that are checked and dropped below)
        P = ip.P
        offsets = {P.staticmethod.callable, P.classmethod.callable, P.property.fget, P.property.fset,
                   P.property.fdel, P.method.im_func}  # fmt: skip
        words = [values] + [gather_u64(ip.space, values + np.uint64(off))[0] for off in sorted(offsets)]
        ptrs = np.concatenate(words)
        entry = np.tile(self.entry_ids, len(words))
        keep = ptrs != 0
        order = np.argsort(ptrs[keep], kind="stable")
        self._ptrs, self._entry = ptrs[keep][order], entry[keep][order]
        # searched once per function as a list (a numpy search per call cost more than the search)
        self._ptrs_l: list[int] = self._ptrs.tolist()
        self._memo: dict[int, list[Holder]] = {}  # the closure asks for a function's holders, its record again

    def holders(self, f: int) -> list[Holder]:
        got = self._memo.get(f)
        if got is None:
            got = self._memo[f] = self._holders(f)
        return list(got)

    def _holders(self, f: int) -> list[Holder]:
        rt, table = self.rt, self.table
        found: list[tuple[int, int, int, Holder]] = list(self._read.get(f, ()))
        if not 0 <= f < (1 << 64) - 1:  # not an address (damaged evidence)
            return []
        lo, hi = bisect_left(self._ptrs_l, f), bisect_left(self._ptrs_l, f + 1)
        if hi > lo:
            for e in sorted(set(self._entry[lo:hi].tolist())):
                v, k = int(table.values[e]), int(table.keys[e])
                if rt.kind(k) != "str":
                    continue  # not in the namespace (or the namespace is empty: checked next)
                try:
                    name = rt.ip.str(k)
                except ZenError:  # an unreadable name empties the namespace
                    continue
                for ci in self.classes_of[int(table.owner[e])]:
                    t = self.classes[ci]
                    if rt.namespace(t.dict_addr).get(name) != v:
                        continue
                    for bpos, (g, b) in enumerate(rt.bound_functions(v)):
                        if g == f:
                            found.append((ci, e, bpos, (t.addr, name, b)))
        found.sort(key=lambda x: x[:3])
        return [h for *_, h in found]
