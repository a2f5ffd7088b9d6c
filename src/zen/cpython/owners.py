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

from typing import TYPE_CHECKING

import numpy as np

from zen.cpython import bulk
from zen.errors import ZenError
from zen.memory.scan import gather_u64

if TYPE_CHECKING:
    from zen.cpython.runtime import Runtime

Holder = tuple[int, str, str]  # (class address, attribute name, binding)


class OwnerIndex:
    """`holders(f)` for every function f: (class, attribute name, binding), classes in address
    order, attributes in dict order, a property's fget, fset, fdel in that order."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        ip = rt.ip
        self.classes = [t for t in map(rt.type, rt.type_addrs) if t is not None and t.is_heap and t.dict_addr]
        dicts = [t.dict_addr for t in self.classes]
        got = bulk.dict_entries(ip, dicts)
        self.owner, self.keys, self.values = got.owner, got.keys, got.values
        # dicts the vectorised reader left alone: read class by class, as before
        self._read: dict[int, list[tuple[int, int, int, Holder]]] = {}
        for ci in np.flatnonzero(~got.ok).tolist():
            t = self.classes[ci]
            for pos, (name, v) in enumerate(rt.namespace(t.dict_addr).items()):
                for bpos, (f, b) in enumerate(rt.bound_functions(v)):
                    self._read.setdefault(f, []).append((ci, pos, bpos, (t.addr, name, b)))
        # every word an entry may hold its function in: the value itself, and the fields of the
        # wrappers (a value that is no wrapper gives words that are checked and dropped below)
        P = ip.P
        offsets = {P.staticmethod.callable, P.classmethod.callable, P.property.fget, P.property.fset,
                   P.property.fdel, P.method.im_func}  # fmt: skip
        words = [self.values] + [gather_u64(ip.space, self.values + np.uint64(off))[0] for off in sorted(offsets)]
        ptrs = np.concatenate(words)
        entry = np.tile(np.arange(len(self.values), dtype=np.int64), len(words))
        keep = ptrs != 0
        order = np.argsort(ptrs[keep], kind="stable")
        self._ptrs, self._entry = ptrs[keep][order], entry[keep][order]

    def holders(self, f: int) -> list[Holder]:
        rt = self.rt
        found: list[tuple[int, int, int, Holder]] = list(self._read.get(f, ()))
        lo, hi = np.searchsorted(self._ptrs, [f, f + 1]).tolist()
        if hi > lo:
            for e in sorted(set(self._entry[lo:hi].tolist())):
                ci = int(self.owner[e])
                t = self.classes[ci]
                v, k = int(self.values[e]), int(self.keys[e])
                if rt.kind(k) != "str":
                    continue  # not in the namespace (or the namespace is empty: checked next)
                ns = rt.namespace(t.dict_addr)
                try:
                    name = rt.ip.str(k)
                except ZenError:  # an unreadable name empties the namespace
                    continue
                if ns.get(name) != v:
                    continue
                for bpos, (g, b) in enumerate(rt.bound_functions(v)):
                    if g == f:
                        found.append((ci, e, bpos, (t.addr, name, b)))
        found.sort(key=lambda x: x[:3])
        return [h for *_, h in found]
