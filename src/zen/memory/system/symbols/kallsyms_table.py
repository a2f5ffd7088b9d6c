"""The kernel's own compressed symbol table (kallsyms), read from a vmlinux's `.rodata`.

Distributions ship a placeholder `System.map` (Debian's is 83 bytes: "ffffffffffffffff B The real
System.map is in the linux-image-<version>-dbg package"), and /proc/kallsyms of the imaged
machine may be unavailable. But a kernel built with CONFIG_KALLSYMS (every distro kernel) embeds
all its symbols, written by scripts/kallsyms.c as a handful of tables in `.rodata`:

- `kallsyms_num_syms`: u32 N
- `kallsyms_names`: per symbol a length (one byte, or two when >= 0x80: `(b0 & 0x7f) | b1 << 7`,
  since 6.1) and that many token indices; the first expanded character is the nm type letter
- `kallsyms_markers`: u32 offset into the names of every 256th symbol
- `kallsyms_token_table`: 256 NUL-terminated tokens; `kallsyms_token_index`: 256 u16 offsets
- `kallsyms_offsets`: N s32, and `kallsyms_relative_base`: u64 (CONFIG_KALLSYMS_BASE_RELATIVE);
  with CONFIG_KALLSYMS_ABSOLUTE_PERCPU a non-negative offset is an absolute (per-CPU) value and a
  negative one means `relative_base - 1 - offset`
- from 6.2 (and backported to some 6.1 stable kernels) `kallsyms_seqs_of_names`.

Up to 6.1 the offsets come first (offsets, relative_base, num_syms, names, markers, tokens); from
6.2 they follow the token index. No symbol marks where these tables are, so they are found from
their content: the token table always holds the digits "0".."9" as single-character tokens at
codes 0x30-0x39 (digits occur in symbol names, so their codes are never reused for a token),
and each candidate is accepted only if every table around it is self-consistent and the result
names `_text`, `init_task` and `linux_banner` at plausible, sorted addresses.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from zen.memory.system.symbols.kernelfile import Vmlinux
from zen.runtime.errors import ZenError

DIGITS = b"0\x001\x002\x003\x004\x005\x006\x007\x008\x009\x00"
MAX_SYMS = 2_000_000
MAX_CANDIDATES = 16
MARKER_WINDOW = 32 << 20
REQUIRED = ("init_task", "linux_banner")


class KallsymsTableError(ZenError):
    """No valid kallsyms table in the kernel image."""


@dataclass
class KernelSymbol:
    name: str
    type: str  # nm letter (T, t, D, d, B, b, R, r, A, ...)
    address: int  # link-time


@dataclass
class KallsymsTable:
    """The kernel's symbols, and where the kallsyms tables themselves are: they are left out of
    the table (scripts/kallsyms.c skips its own symbols), but Volatility's `linux.kallsyms`
    reads them, so the ISF gets them as `kallsyms_names`, `kallsyms_offsets`, ..."""

    symbols: list[KernelSymbol]
    tables: list[KernelSymbol]


def _tokens_at(ro: bytes, digit0: int) -> tuple[int, list[bytes]] | None:
    """Walk back 0x30 tokens from the token "0" to the table start, then read all 256."""
    p = digit0
    for _ in range(0x30):
        if p < 2 or ro[p - 1] != 0:
            return None
        q = ro.rfind(b"\x00", max(0, p - 256), p - 1)
        if q < 0 or p - 1 - q < 1:
            return None
        p = q + 1
    start = p
    toks: list[bytes] = []
    pos = start
    for _ in range(256):
        e = ro.find(b"\x00", pos, pos + 256)
        if e <= pos:
            return None
        toks.append(ro[pos:e])
        pos = e + 1
    if any(toks[0x30 + i] != bytes([0x30 + i]) for i in range(10)):
        return None
    return start, toks


def _token_index_after(ro: bytes, table_start: int, toks: list[bytes]) -> int | None:
    """Offset of `kallsyms_token_index` (256 u16 offsets of each token), right after the table."""
    end = table_start + sum(len(t) + 1 for t in toks)
    expect = []
    acc = 0
    for t in toks:
        expect.append(acc)
        acc += len(t) + 1
    want = struct.pack("<256H", *expect) if acc < 65536 else None
    if want is None:
        return None
    for pad in range(0, 16):
        if ro[end + pad : end + pad + 512] == want:
            return end + pad
    return None


def _marker_runs(ro: bytes, limit: int) -> list[tuple[int, list[int]]]:
    """Candidate `kallsyms_markers` arrays in ro[:limit]: u32 runs starting at 0 whose steps
    (the compressed size of 256 names) are plausible, longest first."""
    lo = max(0, limit - MARKER_WINDOW)
    lo -= lo % 4
    a = np.frombuffer(ro, dtype="<u4", count=(limit - lo) // 4, offset=lo).astype(np.int64)
    if len(a) < 4:
        return []
    d = np.diff(a)
    good = (d >= 256 * 2) & (d <= 256 * 64)
    starts = np.nonzero((a[:-1] == 0) & good)[0]
    runs: list[tuple[int, list[int]]] = []
    for s in starts[:10_000].tolist():
        e = s
        while e < len(good) and good[e] and e - s < MAX_SYMS // 256:
            e += 1
        if e - s >= 3:
            runs.append((lo + 4 * s, a[s : e + 1].tolist()))
    runs.sort(key=lambda r: (-len(r[1]), r[0]))
    return runs[:MAX_CANDIDATES]


def _parse_names(ro: bytes, start: int, end: int, n: int, markers: list[int]) -> list[tuple[int, int]] | None:
    """(offset, length) of each compressed name, checked against the markers; None if inconsistent."""
    out: list[tuple[int, int]] = []
    pos = start
    for i in range(n):
        if i % 256 == 0 and (i // 256 >= len(markers) or markers[i // 256] != pos - start):
            return None
        if pos >= end:
            return None
        ln = ro[pos]
        if ln & 0x80:
            ln = (ln & 0x7F) | (ro[pos + 1] << 7)
            pos += 2
        else:
            pos += 1
        if ln == 0 or pos + ln > end:
            return None
        out.append((pos, ln))
        pos += ln
    if any(ro[pos:end]):  # only alignment padding may follow the last name
        return None
    return out


def _find_names(ro: bytes, markers_start: int, markers: list[int]) -> tuple[int, list[tuple[int, int]]] | None:
    """Locate `kallsyms_num_syms` + `kallsyms_names` before the markers: N must need exactly
    len(markers) markers, and N names parsed from just after it must end at the markers.
    Returns the offset of `kallsyms_num_syms` and the names."""
    m = len(markers)
    lo, hi = (m - 1) * 256 + 1, m * 256
    top = markers_start - markers[-1] - 4  # names start at or before markers_start - markers[-1]
    top -= top % 4
    for a in range(top, max(0, top - 256 * 512), -4):
        (n,) = struct.unpack_from("<I", ro, a)
        if not lo <= n <= hi:
            continue
        for start in (a + 4, a + 8):
            names = _parse_names(ro, start, markers_start, n, markers)
            if names is not None:
                return a, names
    return None


def _offsets(ro: bytes, pos: int, n: int) -> tuple[np.ndarray, int, int] | None:
    """`kallsyms_offsets` at `pos`, the `kallsyms_relative_base` after it (8-aligned) and its offset."""
    if pos < 0 or pos % 4:
        return None
    rb_pos = pos + 4 * n
    rb_pos += (-rb_pos) % 8
    if rb_pos + 8 > len(ro):
        return None
    offs = np.frombuffer(ro, dtype="<i4", count=n, offset=pos).astype(np.int64)
    (rb,) = struct.unpack_from("<Q", ro, rb_pos)
    return offs, rb, rb_pos


def _addresses(offs: np.ndarray, rb: int) -> np.ndarray | None:
    """Absolute link-time addresses (uint64), or None unless they come out sorted as kallsyms.c
    writes them."""
    if rb < 1 << 63:  # relative_base is the kernel's lowest text address, in the top half
        return None
    neg = offs < 0
    if neg.any():
        # CONFIG_KALLSYMS_ABSOLUTE_PERCPU: negative = relative to base, non-negative = absolute
        rel = np.uint64(rb - 1) - offs.astype(np.uint64)
        addrs = np.where(neg, rel, offs.astype(np.uint64))
    else:
        addrs = np.uint64(rb) + offs.astype(np.uint64)
    if len(addrs) > 1 and not bool(np.all(addrs[1:] >= addrs[:-1])):
        return None
    return addrs


def _candidate(ro: bytes, digit0: int) -> tuple[list[KernelSymbol], dict[str, int]] | None:
    """The symbols of the kallsyms tables around the token table holding the digits at `digit0`,
    and the .rodata offsets of those tables."""
    got = _tokens_at(ro, digit0)
    if got is None:
        return None
    table_start, toks = got
    tindex = _token_index_after(ro, table_start, toks)
    if tindex is None:
        return None
    for markers_start, markers in _marker_runs(ro, table_start):
        nm = _find_names(ro, markers_start, markers)
        if nm is None:
            continue
        num_pos, names = nm
        n = len(names)
        # up to 6.1: offsets, relative_base, then num_syms (all 8-aligned); from 6.2: after the
        # token index
        before = num_pos - 8 - 4 * n
        before -= before % 8
        after = tindex + 512
        after += (-after) % 8
        addrs = None
        where: dict[str, int] = {}
        for pos, need_rb_at in ((before, num_pos - 8), (after, None)):
            o = _offsets(ro, pos, n)
            if o is None or (need_rb_at is not None and o[2] != need_rb_at):
                continue
            addrs = _addresses(o[0], o[1])
            if addrs is not None:
                where = {"kallsyms_offsets": pos, "kallsyms_relative_base": o[2]}
                break
        if addrs is None:
            continue
        where.update(
            kallsyms_num_syms=num_pos,
            kallsyms_names=names[0][0] - (2 if names[0][1] >= 0x80 else 1),
            kallsyms_markers=markers_start,
            kallsyms_token_table=table_start,
            kallsyms_token_index=tindex,
        )
        seqs = markers_start + 4 * len(markers)
        seqs += (-seqs) % 8
        if table_start - seqs >= 3 * n:  # 6.2+ (and some 6.1 stable kernels): names sorted by name
            where["kallsyms_seqs_of_names"] = seqs
        syms: list[KernelSymbol] = []
        for (p, ln), addr in zip(names, addrs.tolist()):
            text = b"".join(toks[b] for b in ro[p : p + ln]).decode("latin-1")
            if len(text) < 2:
                break
            syms.append(KernelSymbol(text[1:], text[0], int(addr)))
        else:
            return syms, where
    return None


def exported_symbols(vm: Vmlinux, limit: int = 200_000) -> dict[str, int]:
    """{name: address} of the kernel's exported symbols (`__ksymtab`, `__ksymtab_gpl`): an
    independent record of some 10k addresses to check the kallsyms table against. Entries are
    `struct kernel_symbol {int value_offset, name_offset, namespace_offset}`, each offset relative
    to its own field (CONFIG_HAVE_ARCH_PREL32_RELOCATIONS, x86_64 since 4.19); empty if the
    sections are missing or laid out otherwise."""
    strs = vm.sections.get("__ksymtab_strings")
    sraw = vm.section_bytes("__ksymtab_strings")
    out: dict[str, int] = {}
    if strs is None or sraw is None:
        return out
    mask = (1 << 64) - 1
    for sec_name in ("__ksymtab", "__ksymtab_gpl"):
        sec, raw = vm.sections.get(sec_name), vm.section_bytes(sec_name)
        if sec is None or raw is None:
            continue
        for i in range(0, min(len(raw) - 11, 12 * limit), 12):
            value_off, name_off, _ns = struct.unpack_from("<iii", raw, i)
            o = ((sec.addr + i + 4 + name_off) & mask) - strs.addr
            if not 0 <= o < len(sraw):
                return {}  # not PREL32 entries: no check possible
            end = sraw.find(b"\x00", o, o + 512)
            if end < 0:
                return {}
            out[sraw[o:end].decode("latin-1")] = (sec.addr + i + value_off) & mask
    return out


def _validate(vm: Vmlinux, syms: list[KernelSymbol]) -> str | None:
    """Why this table is not the kernel's, or None if it is."""
    by = {s.name: s.address for s in syms}
    start = by.get("_text", by.get("_stext"))
    if start is None:
        return "no _text/_stext symbol"
    text = vm.text_address
    if text is not None and start != text:
        return f"_text at {start:#x}, but the ELF's .text starts at {text:#x}"
    for name in REQUIRED:
        if name not in by:
            return f"no {name} symbol"
    if vm.vaddr_bytes(by["linux_banner"], 14) != b"Linux version ":
        return "linux_banner does not point at the banner text"
    exported = exported_symbols(vm)
    if exported:
        addrs: dict[str, set[int]] = {}
        for s in syms:
            addrs.setdefault(s.name, set()).add(s.address)
        wrong = [n for n, a in exported.items() if a not in addrs.get(n, ())]
        if wrong:
            return f"{len(wrong)} of {len(exported)} exported symbols (__ksymtab) disagree, e.g. {wrong[0]}"
    return None


def read_kallsyms_table(vm: Vmlinux) -> KallsymsTable:
    """All symbols of the kernel's embedded kallsyms table (link-time addresses, table order),
    and the locations of the tables."""
    ro = vm.section_bytes(".rodata")
    sec = vm.sections.get(".rodata")
    if ro is None or sec is None:
        raise KallsymsTableError("the kernel ELF has no .rodata section", "give --system-map or --kallsyms")
    reasons: list[str] = []
    pos = 0
    for _ in range(MAX_CANDIDATES):
        i = ro.find(DIGITS, pos)
        if i < 0:
            break
        pos = i + 1
        got = _candidate(ro, i)
        if got is None:
            continue
        syms, where = got
        why = _validate(vm, syms)
        if why is None:
            tables = [KernelSymbol(name, "R", sec.addr + off) for name, off in sorted(where.items(), key=lambda kv: kv[1])]
            return KallsymsTable(syms, tables)
        reasons.append(why)
    raise KallsymsTableError(
        "no kallsyms table found in the kernel image" + (f" (candidates rejected: {'; '.join(reasons[:3])})" if reasons else ""),
        "the kernel may lack CONFIG_KALLSYMS_ALL / KALLSYMS_BASE_RELATIVE: give --system-map or --kallsyms "
        "(/proc/kallsyms of the imaged machine, read as root)",
    )
