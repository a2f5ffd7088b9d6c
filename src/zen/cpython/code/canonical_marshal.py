"""Marshal bytes that depend only on the values written, never on the writing process.

CPython's `marshal.dumps` decides two things from the state of the process that calls it:
- which objects get a back-reference slot (FLAG_REF): those whose reference count is above one,
  so a cache, a memo or a debugger holding one more reference changes the bytes;
- whether a string is written "interned": whether that very object is interned in the writing
  process, which depends on everything the process imported or interned before.
Before 3.13 it also writes a frozenset's items in hash order, which string hash randomisation
changes from run to run. So `code.marshal` of the same image differed between `python -m zen`
and `python -c`, with the cyclic GC on or off, or with a read cache: equal code objects, other
bytes, other case-file hashes. A court comparing case files needs the bytes to follow from the
evidence alone (DESIGN.md: "the same image must give byte-identical outputs").

`dumps(obj)` therefore lets the running interpreter's marshal encode the objects (it alone knows
every field of its own code objects, e.g. the locals' kind bytes of 3.11+) and rewrites its
output in one canonical form, with these rules:
- sharing: equal immutable objects (equal as encoded bytes: same type, same value, same fields)
  are written once; an object that occurs more than once gets FLAG_REF at its first occurrence
  and every later occurrence is a TYPE_REF to it. Reference slots are numbered in the order the
  loader meets them (pre-order). None/True/False/Ellipsis/StopIteration are never shared (the
  format gives them no slot); dicts, lists and sets (only at the top: the code table) never are.
- interning: a string is written interned iff it consists only of ASCII letters, digits and
  underscores, wherever it occurs. That is the rule CPython's code constructor applies to string
  constants (`all_name_chars`, 3.8-3.14); the names and local names it interns anyway on load.
- frozensets: items in the order of their canonical encodings (as 3.13+ marshal does, with
  `marshal.dumps` as the key).
- sizes: the shortest form of the format version written (short ASCII strings, small tuples).
`marshal.loads` of the result gives objects equal to those of `marshal.dumps` (same code objects,
constants, names, tables). Standard library only, and syntax every supported target interpreter
(3.8-3.14) accepts: `codebuild_child` runs it inside the image's own Python.
"""

from __future__ import annotations

import marshal
import struct
import sys

FLAG_REF = 0x80
MAX_DEPTH = 200  # levels of nesting; each costs Python frames (real code objects nest < 100)
EXPANDED_BUDGET = 1 << 24  # bytes of set items' expanded encodings per rewrite, beyond 4 per input byte
_NAME_CHARS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
_SINGLETONS = frozenset(b"NFT.S")
_I32 = struct.Struct("<i")
_I32_AT = _I32.unpack_from
# Code objects: 'L' a 4-byte int field, 'O' an object field, in the order marshal writes them.
_CODE_38 = "LLLLLLOOOOOOOOLO"  # argcount posonly kwonly nlocals stacksize flags code consts names
#                                varnames freevars cellvars filename name firstlineno lnotab/linetable
_CODE_311 = "LLLLLOOOOOOOOLOO"  # argcount posonly kwonly stacksize flags code consts names localsplusnames
#                                localspluskinds filename name qualname firstlineno linetable exceptiontable


class MarshalFormatError(ValueError):
    """Bytes that are not marshal data this module can rewrite."""


def dumps(obj: object) -> bytes:
    """`marshal.dumps(obj)` in canonical form (see the module docstring)."""
    return canonical(marshal.dumps(obj), sys.version_info[:2])


def canonical(data: bytes, python: tuple = (3, 11)) -> bytes:
    """Rewrite marshal `data` written by CPython `python` (major, minor) in canonical form.

    Inside zen, the same rewrite compiled (`zen.native`) runs first; what it does not take (anything malformed,
    too deep, past the expansion budget) is left to `_canonical_pure`, the reference, which answers or refuses."""
    if tuple(python) < (3, 8):
        raise MarshalFormatError(f"Python {python[0]}.{python[1]} code objects are not supported (3.8 and later)")
    layout = _layout(python)
    core = _compiled()
    if core is not None and type(data) is bytes:
        got = core.canonical(data, layout, EXPANDED_BUDGET + 4 * len(data), MAX_DEPTH)
        if got is not None:
            return got
    return _canonical_pure(data, layout)


def _layout(python: tuple) -> str:
    return _CODE_311 if tuple(python) >= (3, 11) else _CODE_38


_core: list = []


def _compiled():
    """zen's compiled core, or None: not built, ZEN_PURE=1, or this module running in an image's own Python
    (`codebuild_child`: the standard library and this file, no extension built for that interpreter)."""
    if not _core:
        try:
            from zen import native
        except ImportError:
            _core.append(None)
        else:
            _core.append(native.core)
    return _core[0]


def _canonical_pure(data: bytes, layout: str) -> bytes:
    """`canonical` in Python: the reference the compiled rewrite is tested against."""
    r = _Rewriter(data, layout)
    try:
        root = r.parse(0)
    except (IndexError, struct.error, RecursionError, UnicodeDecodeError) as exc:
        raise MarshalFormatError(f"truncated or malformed marshal data at byte {r.pos}: {exc}") from None
    if r.pos != len(data):
        raise MarshalFormatError(f"{len(data) - r.pos} bytes after the marshalled object")
    r.counts[root] += 1
    return r.emit(root)


class _Rewriter:
    """Parse marshal data into hash-consed nodes (equal encodings -> one node), then emit.

    A node is `bytes` (a scalar: type byte and payload, interned flag by the rule) or a tuple
    (a container: header bytes, then child node ids and, for code objects, raw int fields)."""

    def __init__(self, data: bytes, layout: str) -> None:
        self.data, self.layout, self.pos = data, layout, 0
        self.nodes: list = []  # node id -> its key (bytes or tuple)
        self.ids: dict = {}  # key -> node id
        self.counts: list[int] = []  # node id -> occurrences in the written stream
        self.heights: list[int] = []  # node id -> levels of nodes below it (emit and _expanded recurse that deep)
        self.raw_refs: list = []  # the input's reference slots -> node id (None while being read)
        self.mutable = 0
        self.expanded: dict[int, bytes] = {}  # node id -> its encoding without references (set items' sort keys)
        self.budget = EXPANDED_BUDGET + 4 * len(data)  # bytes of such encodings still allowed

    def _node(self, key, children: bool) -> int:
        n = self.ids.get(key)
        if n is None:
            n = self.ids[key] = len(self.nodes)
            self.nodes.append(key)
            self.counts.append(0)
            self.heights.append(0)
            if children:
                self._children(n, key)
        return n

    def _children(self, n: int, key: tuple) -> None:
        """Count a new container's children, and bound its height. Parsing bounds nesting in the input, but a
        back-reference nests a node as deep as it was built: 3,000 items of a set, each holding the one before it,
        sort in reverse and emit as a chain 3,000 deep (a RecursionError, a traceback, before this bound)."""
        counts, heights, h = self.counts, self.heights, -1
        for c in key[1:]:
            if c.__class__ is int:
                counts[c] += 1
                h = max(h, heights[c])
        if h + 1 > MAX_DEPTH:
            raise MarshalFormatError("marshal data nested too deeply (through back-references)")
        heights[n] = h + 1

    def _scalar(self, t: int, payload: bytes, slot: int | None) -> int:
        n = self._node(bytes((t,)) + payload, False)
        if slot is not None:
            self.raw_refs[slot] = n
        return n

    def parse(self, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise MarshalFormatError("marshal data nested too deeply")
        data, p = self.data, self.pos
        code = data[p]
        t, flag = code & 0x7F, code & FLAG_REF
        p += 1
        slot = None
        if flag:
            slot = len(self.raw_refs)
            self.raw_refs.append(None)
        if t in _SINGLETONS:
            self.pos = p
            return self._node(bytes((t,)), False)
        if t == 0x72:  # 'r' reference
            (i,) = _I32_AT(data, p)
            self.pos = p + 4
            if not 0 <= i < len(self.raw_refs) or self.raw_refs[i] is None:
                raise MarshalFormatError(f"bad or cyclic back-reference {i} at byte {p - 1}")
            return self.raw_refs[i]
        if t in (0x7A, 0x5A):  # 'z' 'Z' short ASCII
            size = data[p]
            return self._string(self._take(p + 1, p + 1 + size), p + 1 + size, slot)
        if t in (0x61, 0x41):  # 'a' 'A' ASCII
            (size,) = _I32_AT(data, p)
            return self._string(self._take(p + 4, p + 4 + size), p + 4 + size, slot)
        if t in (0x75, 0x74):  # 'u' 't' UTF-8
            (size,) = _I32_AT(data, p)
            raw = self._take(p + 4, p + 4 + size)
            raw.decode("utf-8", "surrogatepass")  # validity only
            if raw.isascii():
                return self._string(raw, p + 4 + size, slot)
            self.pos = p + 4 + size
            return self._scalar(0x75, data[p : p + 4 + size], slot)
        if t == 0x69:  # 'i' int32
            self.pos = p + 4
            return self._scalar(t, self._take(p, p + 4), slot)
        if t == 0x6C:  # 'l' long: signed digit count, 15-bit digits
            (n,) = _I32_AT(data, p)
            end = p + 4 + 2 * abs(n)
            self.pos = end
            return self._scalar(t, self._take(p, end), slot)
        if t == 0x67:  # 'g' binary float
            self.pos = p + 8
            return self._scalar(t, self._take(p, p + 8), slot)
        if t == 0x79:  # 'y' binary complex
            self.pos = p + 16
            return self._scalar(t, self._take(p, p + 16), slot)
        if t == 0x73:  # 's' bytes
            (size,) = _I32_AT(data, p)
            self.pos = p + 4 + size
            return self._scalar(t, self._take(p, p + 4 + size), slot)
        if t in (0x28, 0x29):  # '(' ')' tuple
            if t == 0x29:
                size, self.pos = data[p], p + 1
            else:
                (size,) = _I32_AT(data, p)
                self.pos = p + 4
            items = [self.parse(depth + 1) for _ in range(self._count(size))]
            head = b")" + bytes((size,)) if size < 256 else b"(" + _I32.pack(size)
            return self._container((head, *items), slot)
        if t == 0x3E:  # '>' frozenset: items in the order of their canonical encodings
            (size,) = _I32_AT(data, p)
            self.pos = p + 4
            items = [self.parse(depth + 1) for _ in range(self._count(size))]
            items.sort(key=self._expanded)
            return self._container((b">" + _I32.pack(size), *items), slot)
        if t == 0x63:  # 'c' code
            self.pos = p
            key: list = [b"c"]
            for field in self.layout:
                if field == "L":
                    key.append(self._take(self.pos, self.pos + 4))
                    self.pos += 4
                else:
                    key.append(self.parse(depth + 1))
            return self._container(tuple(key), slot)
        if t == 0x3A:  # ':' slice (3.14, marshal version 5): start, stop, step
            self.pos = p
            return self._container((b":", *(self.parse(depth + 1) for _ in range(3))), slot)
        if t in (0x5B, 0x3C):  # '[' list, '<' set: mutable, never shared
            (size,) = _I32_AT(data, p)
            self.pos = p + 4
            items = [self.parse(depth + 1) for _ in range(self._count(size))]
            if t == 0x3C:
                items.sort(key=self._expanded)
            return self._mutable((bytes((t,)) + _I32.pack(size), *items), slot)
        if t == 0x7B:  # '{' dict: key, value pairs up to a '0' (kept in their order)
            self.pos = p
            items = []
            while data[self.pos] != 0x30:
                items.append(self.parse(depth + 1))
                items.append(self.parse(depth + 1))
            self.pos += 1
            return self._mutable((b"{", *items, b"0"), slot)
        raise MarshalFormatError(f"marshal type {chr(t)!r} at byte {p - 1} is not one code objects hold")

    def _take(self, a: int, b: int) -> bytes:
        if not a <= b <= len(self.data):
            raise MarshalFormatError("marshal data ends inside an object (or gives a negative size)")
        return self.data[a:b]

    def _count(self, size: int) -> int:
        if size < 0 or size > len(self.data) - self.pos:  # every item takes at least one byte
            raise MarshalFormatError(f"container size {size} does not fit the data")
        return size

    def _string(self, raw: bytes, end: int, slot: int | None) -> int:
        self.pos = end
        interned = not raw.translate(None, _NAME_CHARS)
        if len(raw) < 256:
            return self._scalar(0x5A if interned else 0x7A, bytes((len(raw),)) + raw, slot)
        return self._scalar(0x41 if interned else 0x61, _I32.pack(len(raw)) + raw, slot)

    def _container(self, key: tuple, slot: int | None) -> int:
        n = self._node(key, True)
        if slot is not None:
            self.raw_refs[slot] = n
        return n

    def _mutable(self, parts: tuple, slot: int | None) -> int:
        self.mutable += 1
        n = self._node(("mutable", self.mutable, *parts), False)  # unique: never shared
        self.nodes[n] = parts
        self._children(n, parts)
        if slot is not None:
            self.raw_refs[slot] = n
        return n

    def _expanded(self, n: int) -> bytes:
        """A node's encoding without references: the context-free sort key of set items.

        Back-references make the data a graph: 190 bytes of tuples each holding its child twice expand to 2^26
        copies (44 s and gigabytes in `zen diff` of a crafted snapshot). Each node is expanded once, and all of
        them together may take `budget` bytes (real set items are a few short constants)."""
        got = self.expanded.get(n)
        if got is not None:
            return got
        key = self.nodes[n]
        if key.__class__ is bytes:
            return key
        parts = [k if k.__class__ is bytes else self._expanded(k) for k in key]
        self.budget -= sum(map(len, parts))
        if self.budget < 0:
            raise MarshalFormatError("set items expand past the bound: shared structure nested far deeper than code holds")
        got = self.expanded[n] = b"".join(parts)
        return got

    def emit(self, root: int) -> bytes:
        nodes, counts, out = self.nodes, self.counts, []
        refs: dict[int, int] = {}
        put = out.append

        def emit(n: int) -> None:
            r = refs.get(n)
            if r is not None:
                put(b"r" + _I32.pack(r))
                return
            key = nodes[n]
            shared = counts[n] > 1 and (key.__class__ is not bytes or key[0] not in _SINGLETONS)
            if shared and key.__class__ is tuple and key[0][0] in (0x5B, 0x3C, 0x7B):
                shared = False  # mutable containers are never shared
            if shared:
                refs[n] = len(refs)
            if key.__class__ is bytes:
                put(bytes((key[0] | FLAG_REF,)) + key[1:] if shared else key)
                return
            head = key[0]
            put(bytes((head[0] | FLAG_REF,)) + head[1:] if shared else head)
            for k in key[1:]:
                if k.__class__ is int:
                    emit(k)
                else:
                    put(k)

        try:
            emit(root)
        finally:
            emit = None  # it refers to itself: no cycle (holding every node) left for the collector
        return b"".join(out)
