"""The interpreter of one image: address space + discovered addresses + layout profile + readers.

Every reader takes an `Interpreter` and an address. The interpreter owns what all readers share:
validated object headers, the cache of type objects (there are a few thousand, read constantly),
the cache of strings (names repeat millions of times across code objects), and the limits that
keep every traversal of untrusted memory bounded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from zen.cpython.discover import InterpreterInfo, discover
from zen.cpython.layout.profile import Profile, load_profile
from zen.cpython.wellknown import WellKnown, resolve
from zen.memory.space import AddressSpace
from zen.runtime.errors import InterpreterNotFound, MemoryReadError, ObjectError, TruncatedImage

_HDR = struct.Struct("<qQ")
_to_python = None  # zen.cpython.readers.values.to_python, bound on first use (the readers import this module)


@dataclass(frozen=True)
class Limits:
    """Bounds on what a reader accepts from an image (corrupt sizes must not exhaust memory)."""

    max_items: int = 1 << 24  # elements of one container
    max_str: int = 1 << 26  # characters of one string
    max_bytes: int = 1 << 30  # bytes of one bytes/bytearray
    max_depth: int = 64  # nesting when converting to Python values
    max_refcnt: int = 1 << 40  # larger refcounts mean the header is not an object header
    max_mro: int = 256  # classes in one MRO / bases tuple
    # code units (16-bit) of one code object: 2 MB of bytecode, beyond any compiled function seen in
    # real code; a corrupt size must not cost seconds of de-specialisation per object
    max_code_units: int = 1 << 20


def _checked_against_image(space: AddressSpace, info: InterpreterInfo, prof: Profile) -> Profile:
    """3.13+: cross-check the profile with the image's `_Py_DebugOffsets`; the image wins."""
    from zen.cpython.layout import debug_offsets as dbg

    if info.runtime is None:
        return prof
    table = dbg.read_debug_offsets(space, info.runtime, info.minor)
    if table is None:
        if info.minor in dbg.supported_minors():
            info.warnings.append("no _Py_DebugOffsets table at _PyRuntime: the profile could not be cross-checked")
        return prof
    record: dict = {"address": table.address, "version": table.hexversion, "free_threaded": table.free_threaded}
    info.debug_offsets = record
    if table.problems:
        record["problems"] = table.problems
        info.warnings.append("_Py_DebugOffsets table ignored: " + "; ".join(table.problems))
        return prof
    if table.free_threaded:
        info.warnings.append("free-threaded interpreter: its object layout is not supported, results are unreliable")
    check = dbg.cross_check(table, prof)
    record.update(check.to_json())
    if check.mismatches:
        fields = ", ".join(f"{m['field']} {m['profile']}->{m['image']}" for m in check.mismatches[:6])
        info.warnings.append(
            f"layout profile {prof.source} disagrees with the image's _Py_DebugOffsets on {len(check.mismatches)} of "
            f"{len(check.checked)} fields ({fields}); the image's values are used"
        )
        record["applied"] = True
        return dbg.apply(prof, table, check)
    return prof


def _compiled_reader(ip: Interpreter):
    """The compiled core's reader of small objects (native/objects.c) over this image and sharing
    `ip`'s caches, or None (no core, ZEN_PURE, a space without buffers: a live process; a space whose
    class rewrites `read`: zen.memory.overlay is how to corrupt an image for every reader).

    It answers kind/str/read_within and the tuple and bytes readers for the plain cases in one call
    each and None for everything else, so the Python below stays the reference for every error and
    every unusual object; tests/test_native_objects.py holds the two to the same answers."""
    from zen.native import core

    table = getattr(ip.space, "chunk_table", None)
    cls = type(ip.space)
    if core is None or table is None or cls.read is not AddressSpace.read or cls.view is not AddressSpace.view:
        return None  # a space that rewrites what it reads: its chunk table's buffers are not its bytes
    starts, ends, ids, offs, buffers = table()
    U, c, lim = ip.P.unicode, ip.P.constants, ip.limits
    if not len(ids) or not (ids >= 0).any() or U.length + 8 > U.state + 4:  # read_str reads the length in the head
        return None
    params = (ip.refcnt_mask, lim.max_refcnt, lim.max_str, lim.max_items, lim.max_bytes, ip.P.varobject.ob_size,
              ip.P.tuple.ob_item, ip.P.bytes.ob_sval, U.length, U.state, U.ascii_data, U.compact_data,
              c["UNICODE_KIND_SHIFT"], c["UNICODE_COMPACT_BIT"], c["UNICODE_ASCII_BIT"])  # fmt: skip
    caches = (ip._obj_kind, ip._obj_type, ip._kind_cache, ip._str_cache)
    return core.Objects(starts, ends, ids, offs, list(buffers), caches, params)


class Interpreter:
    """Readers' shared context for one imaged CPython process."""

    def __init__(self, space: AddressSpace, info: InterpreterInfo, profile: Profile, limits: Limits | None = None) -> None:
        self.space = space
        self.info = info
        self.P = profile
        self.limits = limits or Limits()
        self.wk: WellKnown = resolve(space, info, profile)
        self._type_cache: dict[int, object] = {}
        self._str_cache: dict[int, str] = {}
        self._kind_cache: dict[int, str] = {}  # type address -> reader kind
        self._obj_kind: dict[int, str] = {}  # object address -> reader kind (images do not change)
        self._obj_type: dict[int, int] = {}  # object address -> validated type address
        # census results (all types, sys.modules, writable chunks, MRO names): a Heap is cheap to
        # make and many callers make their own, but these cost a pass over memory or thousands of
        # reads, and an image does not change, so they are computed once per interpreter
        self.census_memo: dict[str, object] = {}
        self.tflags_type_subclass = profile.c("TPFLAGS_TYPE_SUBCLASS")
        self._tp_flags = profile.type.tp_flags
        self._ob_type = profile.object.ob_type
        # 3.14 keeps flags above a 32-bit count in the refcount word
        self.refcnt_mask = 0xFFFFFFFF if profile.object.fields()["ob_refcnt"][1] == "u32" else (1 << 64) - 1
        self.fast = _compiled_reader(self)

    @classmethod
    def open(cls, space: AddressSpace, *, file_root: str | None = None, profile: Profile | None = None,
             limits: Limits | None = None) -> Interpreter:  # fmt: skip
        """Discover the interpreter in `space` and load the matching layout profile."""
        try:
            info = discover(space, file_root)
        except InterpreterNotFound as exc:
            cut = space.truncation()
            if cut is None:
                raise
            raise TruncatedImage(f"{cut}; the interpreter's state lies in the missing part ({exc.message}): nothing "
                                 "could be recovered", "acquire the image again, or find a complete copy") from None  # fmt: skip
        prof = profile or load_profile(info.minor, info.version)
        return cls(space, info, _checked_against_image(space, info, prof), limits)

    # -- raw helpers ----------------------------------------------------------------------
    def ptr(self, addr: int) -> int:
        return self.space.u64(addr)

    def read_within(self, addr: int, size: int, owner: int, what: str) -> bytes:
        """Read `size` bytes that must lie inside one mapping (objects never span mappings).

        This bounds the work a corrupt length field can cause to the size of one region. In a
        process core a mapping is one chunk; in a whole-machine image its resident pages are
        many chunks (one per run of physically contiguous pages), so the check is on the region
        and the read may span chunks.
        """
        if self.fast is not None:
            got = self.fast.read(addr, size)
            if got is not None:
                return got
        c = self.space.chunk_of(addr)
        if c is not None and 0 <= size and addr + size <= c.end:
            return c.read(addr - c.start, size)
        r = self.space.region_of(addr)
        if r is None or addr + size > r.end or size < 0:
            raise ObjectError(owner, f"{what} ({size:,} bytes at {addr:#x}) not inside one captured mapping")
        try:
            return self.space.read(addr, size)
        except MemoryReadError as exc:
            raise ObjectError(owner, f"{what} ({size:,} bytes at {addr:#x}): {exc.reason}") from None

    def header(self, addr: int) -> tuple[int, int]:
        """(refcount, type address) of the object at `addr`, validated for plausibility."""
        if addr <= 0 or addr & 7:
            raise ObjectError(addr, "not an aligned object address")
        try:
            rc, tp = _HDR.unpack(self.space.read(addr, 16))
        except MemoryReadError:
            raise ObjectError(addr, "object header not in the image") from None
        rc &= self.refcnt_mask
        if rc <= 0 or rc > self.limits.max_refcnt:
            raise ObjectError(addr, f"implausible reference count {rc}")
        if tp == 0 or tp & 7:
            raise ObjectError(addr, f"implausible type pointer {tp:#x}")
        return rc, tp

    def type_of(self, addr: int) -> int:
        """Type address of a validated object (cached per address: images do not change)."""
        tp = self._obj_type.get(addr)
        if tp is None:
            tp = self.header(addr)[1]
            self.check_type(tp)
            self._obj_type[addr] = tp
        return tp

    def check_type(self, taddr: int) -> None:
        """Raise unless `taddr` is a type object (its type is `type` or a metaclass)."""
        if taddr in self._kind_cache or taddr in self._type_cache:
            return
        meta = taddr
        for _ in range(4):
            try:
                _, mt = _HDR.unpack(self.space.read(meta, 16))
            except MemoryReadError:
                raise ObjectError(taddr, "type object not in the image") from None
            if mt == self.wk.types["type"]:
                return
            try:
                flags = self.space.u64(mt + self._tp_flags)
            except MemoryReadError:
                raise ObjectError(taddr, "metatype not in the image") from None
            if not flags & self.tflags_type_subclass:
                raise ObjectError(taddr, "ob_type does not point to a type object")
            meta = mt
        raise ObjectError(taddr, "metaclass chain too deep")

    # -- kinds ----------------------------------------------------------------------------------
    def kind_of_type(self, taddr: int) -> str:
        """Reader kind for instances of `taddr`: a builtin kind, or 'instance'."""
        kind = self._kind_cache.get(taddr)
        if kind is not None:
            return kind
        kind = self.wk.kind_by_type.get(taddr)
        if kind is None:
            from zen.cpython.readers.types import read_type

            t = read_type(self, taddr)
            kind = "instance"
            for base in t.mro_addrs[1:]:
                k = self.wk.kind_by_type.get(base)
                if k is not None and k != "object":
                    kind = "type" if k == "type" else k
                    break
        self._kind_cache[taddr] = kind
        return kind

    def kind(self, addr: int) -> str:
        """Reader kind of the object at `addr` (validated header; cached per address)."""
        k = self._obj_kind.get(addr)
        if k is None and self.fast is not None:  # a plain header of a type whose kind is known: in one call
            k = self.fast.kind(addr)
        if k is None:
            k = self.kind_of_type(self.type_of(addr))
            self._obj_kind[addr] = k
        return k

    def is_none(self, addr: int) -> bool:
        return addr == self.wk.singletons.get("None")

    # -- convenience wrappers around the readers (imported lazily to keep layers clean) ----
    def str(self, addr: int) -> str:
        s = self._str_cache.get(addr)
        if s is None and self.fast is not None:  # a compact str, read and cached in one call
            s = self.fast.str(addr)
        if s is None:
            from zen.cpython.readers.text import read_str

            s = read_str(self, addr)
            self._str_cache[addr] = s
        return s

    def opt_str(self, addr: int) -> str | None:
        """A str, or None for NULL/None pointers."""
        if addr == 0 or self.is_none(addr):
            return None
        return self.str(addr)

    def value(self, addr: int, depth: int | None = None):
        global _to_python
        if _to_python is None:  # bound once: an import statement per call was ~0.65 µs (50,000 calls a recovery)
            from zen.cpython.readers.values import to_python as _to_python
        return _to_python(self, addr, self.limits.max_depth if depth is None else depth)

    def type_info(self, taddr: int):
        t = self._type_cache.get(taddr)  # read_type's own first step, without its import here (110,000 calls)
        if t is not None:
            return t
        from zen.cpython.readers.types import read_type

        return read_type(self, taddr)

    def type_name(self, addr: int) -> str:
        """Full name (module.qualname) of the type of the object at `addr`."""
        return self.type_info(self.type_of(addr)).full_name

    def clear_caches(self) -> None:
        self._type_cache.clear()
        self._str_cache.clear()
        self._kind_cache.clear()
        self._obj_kind.clear()
        self._obj_type.clear()
        self.census_memo.clear()
