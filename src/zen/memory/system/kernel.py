"""The Linux kernel of a whole-machine image, found through Volatility 3.

Volatility 3 is the engine here: its physical layers (LiME, ELF, AVML), its Intel page-table
layers, its symbol tables and its Linux object extensions (task list, maple-tree VMAs, dentry
paths). zen drives it programmatically instead of through its automagic, for three reasons:

- speed: automagic validates every ISF against the JSON schema and scans every known banner on
  each run (minutes on a first run). zen picks the one ISF whose banner the image holds (an index
  lookup) and validates an ISF once per file hash, not once per run;
- bounds: zen parses the container headers itself first (`formats`), so a hostile file fails
  with a clear sentence before Volatility walks it;
- clarity: every failure (no banner, no matching ISF, 5-level paging, no init_task) becomes one
  `ZenError` that names what was found and what to bring.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from zen import native
from zen.memory.system.formats import PhysicalImage
from zen.memory.system.kernel_memory import KernelMemory, Unsupported
from zen.runtime.errors import ImageError, KernelSymbolsError

# Where `linux_banner` (and /proc/version) text starts; the kernel adds "\n" and a NUL.
BANNER_PREFIX = b"Linux version "
_BANNER_RE = re.compile(rb"Linux version [0-9][\x20-\x7e]{8,400}\n?\x00")
MAX_BANNER_HITS = 4096
# init_task's comm is "swapper/0" (SMP) or "swapper": the same signature Volatility scans for.
_SWAPPER_RE = re.compile(rb"swapper(/0|\x00\x00)\x00\x00\x00\x00\x00\x00")
SWAPPER_SIGNATURES = (b"swapper/0" + b"\x00" * 6, b"swapper" + b"\x00" * 8)  # its two spellings, as byte strings
SWAPPER_LEN = 15  # bytes of either: the windows of a scan overlap by this much
MAX_SWAPPER_HITS = 4096
KERNEL_MAP_BASE = 0xFFFFFFFF80000000  # x86_64 __START_KERNEL_map


def quiet_volatility() -> None:
    """Volatility logs warnings for things zen reports itself; keep stderr to zen's own lines.

    Also imports the Linux object extensions Volatility's symbol classes look up by attribute
    (its own CLI imports every plugin for that; zen needs only these)."""
    logging.getLogger("volatility3").setLevel(logging.ERROR)
    import volatility3.framework.symbols.linux.extensions.bash  # noqa: F401
    import volatility3.framework.symbols.linux.extensions.elf  # noqa: F401
    import volatility3.framework.symbols.linux.extensions.network  # noqa: F401


@dataclass
class KernelFacts:
    """What the manifest and `zen ps` say about the kernel and how it was found."""

    banner: str
    isf: str
    isf_sha256: str
    isf_source: str
    dtb: int
    kaslr_shift: int  # physical
    aslr_shift: int  # virtual
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "banner": self.banner,
            "symbols": {"file": self.isf, "sha256": self.isf_sha256, "source": self.isf_source},
            "dtb": f"{self.dtb:#x}",
            "kaslr_physical_shift": f"{self.kaslr_shift:#x}",
            "kaslr_virtual_shift": f"{self.aslr_shift:#x}",
        }


def data_extents(fd: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the file ranges [lo, hi) that hold data: holes of a sparse file (a 1 TiB `truncate`d file, an
    image whose headers claim far more than was written) are skipped with SEEK_DATA/SEEK_HOLE, so a scan's work is
    bounded by the bytes present, not by the sizes claimed. Filesystems without hole support report one extent."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        pos = lo
        while pos < hi:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
                end = os.lseek(fd, start, os.SEEK_HOLE)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after pos
                    break
                out.append((pos, hi))  # SEEK_DATA unsupported: scan it all
                break
            if start >= hi:
                break
            out.append((start, min(end, hi)))
            pos = end
    return out


def file_ranges(phys: PhysicalImage) -> list[tuple[int, int]]:
    """The file ranges the image's physical segments occupy, merged (nothing past the last segment)."""
    spans = sorted((s.file_offset, s.file_offset + s.length) for s in phys.segments if s.file_offset is not None)
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def scan_image(mm: mmap.mmap, extents: list[tuple[int, int]] | None = None) -> tuple[list[bytes], list[int]]:
    """The image's kernel banners (text of `linux_banner`, NUL-terminated; distinct, most frequent first) and the file
    offsets of init_task's comm signature (`_SWAPPER_RE`, at most MAX_SWAPPER_HITS, ascending).

    The running kernel's banner appears several times (its .rodata, the log buffer, page cache copies of
    /proc/version readers); another kernel's (a kexec'd one, a VM image file in the page cache) may appear too, which
    is why the ISF lookup tries each. One pass: each window of the file is faulted in and searched for both while it
    is resident (two passes cost a second 1.5 GiB of page faults). A window of nothing but near-misses ("swapper"
    alone) costs no Python per near-miss: the signature's two spellings are searched as they are."""
    counts: dict[bytes, int] = {}
    swappers: list[int] = []
    seen: set[int] = set()
    banner_hits = 0
    for lo, hi in _windows(mm, SWAPPER_LEN, extents):
        room = MAX_SWAPPER_HITS + 1 - len(swappers)
        # a banner's prefix must end within the window plus its own length, as a window of that overlap would have it;
        # the window's first `room` new signatures (one of each spelling's may be the last window's)
        banners, *sigs = _find_each(mm, (BANNER_PREFIX, *SWAPPER_SIGNATURES), lo,
                                    (min(hi, lo + SCAN_WINDOW + len(BANNER_PREFIX)), hi, hi),
                                    (MAX_BANNER_HITS - banner_hits, *(room + 1 if room > 0 else 0,) * 2))  # fmt: skip
        for i in banners:
            banner_hits += 1
            m = _BANNER_RE.match(mm, i)
            if m:
                text = m.group(0).rstrip(b"\x00")
                counts[text] = counts.get(text, 0) + 1
        if room > 0:
            found = {i for hits in sigs for i in hits}
            hits = sorted(found - seen)[:room]  # windows overlap by a few bytes
            swappers += hits
            seen.update(hits)
    return sorted(counts, key=lambda b: (-counts[b], b)), swappers[:MAX_SWAPPER_HITS]


def _find_all(mm, needle: bytes, lo: int, hi: int, most: int) -> list[int]:
    """Offsets of `needle` within [lo, hi) of `mm`, ascending, at most `most` (`native/find.c`: sixteen positions at a
    time without the GIL; this loop of bytes.find is its reference)."""
    if native.core is not None:
        return native.core.find_all(mm, needle, lo, hi, most)
    out: list[int] = []
    while len(out) < most:
        i = mm.find(needle, lo, hi)
        if i < 0:
            break
        out.append(i)
        lo = i + 1
    return out


def _find_each(mm, needles: tuple[bytes, ...], lo: int, ends: tuple[int, ...], mosts: tuple[int, ...]) -> list[list[int]]:
    """`_find_all` of each needle (with its own end and cap) in one pass over [lo, ...) where the compiled core has
    `find_many` (one read of each window for the banner and both signatures, not three); one `_find_all` each where it
    has not (pure, or a core built before it)."""
    many = getattr(native.core, "find_many", None)
    if many is not None:
        return list(many(mm, needles, lo, ends, mosts))
    return [_find_all(mm, n, lo, e, m) for n, e, m in zip(needles, ends, mosts)]


SCAN_WINDOW = 128 << 20


def _windows(mm: mmap.mmap, overlap: int, extents: list[tuple[int, int]] | None = None):
    """[lo, hi) windows over an mmap for a pattern of `overlap` bytes, each window's pages dropped
    from zen's resident set once scanned: a pass over a multi-GB image must not make zen's RSS the
    size of the image (file pages read through a mapping count as resident). Only `extents` (the
    file's data within its segments, `data_extents`) are visited when given."""
    size = len(mm)
    for elo, ehi in extents if extents is not None else [(0, size)]:
        ehi = min(ehi, size)
        for lo in range(elo, ehi, SCAN_WINDOW):
            hi = min(ehi, lo + SCAN_WINDOW + overlap)
            yield lo, hi
            page = lo & ~(mmap.PAGESIZE - 1)
            try:
                mm.madvise(mmap.MADV_DONTNEED, page, min(lo + SCAN_WINDOW, ehi) - page)
            except (OSError, ValueError):
                pass


class Kernel:
    """A Volatility context over one physical image, with the kernel's layer and symbols."""

    def __init__(self, phys: PhysicalImage, symbols: list[Path] | None = None) -> None:
        quiet_volatility()
        from volatility3.framework import contexts
        from volatility3.framework.layers import physical

        self.phys = phys
        self._fh = open(phys.path, "rb")
        self.mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if phys.mmappable else None
        self.ctx = contexts.Context()
        self.ctx.config["zen.file.location"] = phys.path.resolve().as_uri()
        self.ctx.add_layer(physical.FileLayer(self.ctx, "zen.file", "file"))
        self.phys_layer = self._physical_layer()
        self.extents = data_extents(self._fh.fileno(), file_ranges(phys)) if self.mm is not None else None
        self._swappers: list[int] = []  # file offsets of init_task's comm signature (`scan_image`)
        if self.mm is not None:
            banners, self._swappers = scan_image(self.mm, self.extents)
        else:
            banners = self._scan_banners()
        if not banners:
            raise ImageError(
                f"no Linux kernel banner ('Linux version ...') in {phys.path}",
                "is this a memory image of a Linux machine? zen reads LiME, AVML, raw and ELF physical dumps of Linux",
            )
        from zen.memory.system.symbols.lookup import find_isf

        isf = find_isf(banners, symbols or [])
        self.banner = isf.banner
        self.facts = self._stack(isf)

    # -- layers ------------------------------------------------------------------------------
    def _physical_layer(self) -> str:
        """Volatility's layer over the container (Volatility's own parser, checked against ours)."""
        from volatility3.framework.layers import avml, elf, lime

        fmt = self.phys.format
        if fmt == "raw":
            return "file"
        stacker = {"lime": lime.LimeStacker, "elf": elf.Elf64Stacker, "avml": avml.AVMLStacker}[fmt]
        try:
            layer = stacker.stack(self.ctx, "file")
        except Exception as exc:  # Volatility raises its own exception types for bad files
            raise ImageError(f"Volatility cannot open {self.phys.path} as {fmt}: {exc}") from None
        if layer is None:
            hint = "compressed AVML needs the snappy C library (Debian: libsnappy1v5)" if fmt == "avml" else None
            raise ImageError(f"Volatility does not recognise {self.phys.path} as a {fmt} image", hint)
        self.ctx.add_layer(layer)
        return layer.name

    def _scan_banners(self) -> list[bytes]:
        """Banner search through Volatility's layer, for containers that are not file-contiguous."""
        from volatility3.framework.layers import scanners

        layer = self.ctx.layers[self.phys_layer]
        found: dict[bytes, int] = {}
        for n, offset in enumerate(layer.scan(self.ctx, scanners.BytesScanner(BANNER_PREFIX))):
            if n >= MAX_BANNER_HITS:
                break
            data = layer.read(offset, 420, pad=True)
            m = _BANNER_RE.match(data)
            if m:
                text = m.group(0).rstrip(b"\x00")
                found[text] = found.get(text, 0) + 1
        return sorted(found, key=lambda b: (-found[b], b))

    def _stack(self, isf) -> KernelFacts:
        from volatility3.framework.layers import intel

        from zen.memory.system.symbols.layout import isf_layout

        self._isf = isf
        self._table_name: str | None = None
        self._module_name: str | None = None
        self.module = None  # Volatility's kernel module, with the table (`table_name`)
        self.layout = isf_layout(isf)  # what the direct reads need; Volatility's full table only on first use
        symbols, types = self.layout.get("symbols") or {}, self.layout.get("user_types") or {}
        for need in ("init_task", "init_files", "init_mm", "task_struct"):
            if not isinstance((types if need.endswith("_struct") else symbols).get(need), dict):
                raise KernelSymbolsError(
                    f"symbol file {isf.path} lacks {need}: it is not a complete Linux kernel ISF",
                    "build one with `zen symbols --kernel VMLINUZ` (see `zen symbols --help`)",
                )
        kaslr, aslr = self._find_aslr(isf)
        self.memory: KernelMemory | None = None
        self._check_la57(kaslr)
        dtb_symbol = next((n for n in ("init_top_pgt", "init_level4_pgt") if _address(symbols, n) is not None), None)
        if dtb_symbol is None:
            raise KernelSymbolsError(
                f"symbol file {isf.path} has neither init_top_pgt nor init_level4_pgt: not an x86_64 kernel?",
                "zen reads x86_64 Linux images",
            )
        dtb = _address(symbols, dtb_symbol) + kaslr - KERNEL_MAP_BASE
        cfg = "zen.kernel_layer"
        self.ctx.config[f"{cfg}.memory_layer"] = self.phys_layer
        self.ctx.config[f"{cfg}.page_map_offset"] = dtb
        self.ctx.config[f"{cfg}.kernel_banner"] = self.banner.decode("latin-1")
        layer = intel.LinuxIntel32e(self.ctx, config_path=cfg, name="kernel", metadata={"os": "Linux"})
        layer.config["kernel_virtual_offset"] = aslr
        self.ctx.add_layer(layer)
        self.layer_name = layer.name
        self._aslr = aslr
        if self.mm is not None or self.phys.avml is not None:
            self.memory = KernelMemory(self.layout, self.read_physical, dtb, aslr)
        return KernelFacts(
            banner=self.banner.decode("latin-1").strip(),
            isf=str(isf.path),
            isf_sha256=isf.sha256,
            isf_source=isf.source,
            dtb=dtb,
            kaslr_shift=kaslr,
            aslr_shift=aslr,
        )

    @property
    def table_name(self) -> str:
        """Volatility's symbol table of the kernel (the whole ISF), loaded on first use: the direct reads need only
        the layout, so a recovery that never falls back to Volatility's objects never pays for it."""
        if self._table_name is None:
            self._load_volatility_symbols()
        return self._table_name

    @property
    def module_name(self) -> str:
        if self._module_name is None:
            self._load_volatility_symbols()
        return self._module_name

    def _load_volatility_symbols(self) -> None:
        from volatility3.framework import contexts
        from volatility3.framework.symbols import linux

        isf = self._isf
        table_name = self.ctx.symbol_space.free_table_name("kernel")
        try:
            table = linux.LinuxKernelIntermedSymbols(
                self.ctx, "zen.kernel_symbols", name=table_name, isf_url=isf.path.resolve().as_uri(), validate=False
            )
        except Exception as exc:
            raise KernelSymbolsError(f"symbol file {isf.path} cannot be loaded: {exc}", "rebuild it with `zen symbols`") from None
        self.ctx.symbol_space.append(table)
        module = contexts.Module.create(
            self.ctx, module_name="kernel", layer_name=self.layer_name, offset=self._aslr, symbol_table_name=table_name
        )
        if module.name not in self.ctx.modules:
            self.ctx.modules.add_module(module)
        self._table_name, self._module_name, self.module = table_name, module.name, module

    def _find_aslr(self, isf) -> tuple[int, int]:
        """(physical, virtual) KASLR shifts from the one `init_task` that validates.

        The signature scan runs over the mmap'ed file (`scan_image`) rather than through Volatility's layer scanner;
        each hit is then checked as Volatility's Linux stacker checks it (pid 0, `files` pointing at `init_files`
        once shifted), reading pid and files at the offsets the layout gives.
        """
        symbols = self.layout["symbols"]
        init_task_sym = _address(symbols, "init_task")
        init_files = _address(symbols, "init_files")
        layout = KernelMemory(self.layout, self.read_physical, 0, 0)
        try:
            comm, pid_at, files_at = (layout.offset("task_struct", m) for m in ("comm", "pid", "files"))
        except Unsupported:
            raise KernelSymbolsError(
                f"symbol file {isf.path}: its task_struct lacks comm, pid or files", "rebuild it with `zen symbols`"
            ) from None
        for paddr in self._swapper_hits():
            task_addr = paddr - comm
            pid, files = self.read_physical(task_addr + pid_at, 4), self.read_physical(task_addr + files_at, 8)
            if pid is None or files is None or int.from_bytes(pid, "little") != 0:
                continue
            files = int.from_bytes(files, "little")
            aslr = files - init_files
            kaslr = task_addr - (init_task_sym - KERNEL_MAP_BASE)
            if aslr & 0xFFF or kaslr & 0xFFF or not -(1 << 32) < aslr < (1 << 32):
                continue
            return kaslr, aslr
        raise KernelSymbolsError(
            f"the kernel's init_task was not found with symbol file {isf.path}: the symbols do not describe the kernel "
            f"in this image (banner {self.banner.decode('latin-1').strip()!r})",
            "build the ISF from this exact kernel's vmlinuz/BTF and kallsyms (`zen symbols --help`)",
        )

    def read_physical(self, paddr: int, size: int) -> bytes | None:
        """`size` bytes at a physical address from the image (across adjacent ranges), or None where it holds none."""
        if paddr < 0 or size <= 0:
            return None
        img, out, pos, end = self.phys, [], paddr, paddr + size
        while pos < end:
            if self.mm is not None:
                hit = img.file_offset(pos, end - pos)
                if hit is None:
                    return None
                out.append(self.mm[hit[0] : hit[0] + hit[1]])
                pos += hit[1]
            elif img.avml is not None:
                hit = img.physical_run(pos, end - pos)
                if hit is None:
                    return None
                try:
                    out.append(img.avml.read(pos, hit[1]))
                except ImageError:  # a corrupt frame: this structure is unreadable, the rest may not be
                    return None
                pos += hit[1]
            else:  # a container zen does not map: Volatility's physical layer reads it
                try:
                    return self.ctx.layers.read(self.phys_layer, paddr, size)
                except Exception:  # noqa: BLE001 - Volatility's InvalidAddressException and kin
                    return None
        return out[0] if len(out) == 1 else b"".join(out)

    def _swapper_hits(self):
        if self.mm is not None:
            by_file = sorted(((s.file_offset, s) for s in self.phys.segments if s.file_offset is not None), key=lambda t: t[0])
            for off in self._swappers:  # at most MAX_SWAPPER_HITS (`scan_image`)
                for foff, seg in by_file:  # few segments: a linear pass is fine
                    if foff <= off < foff + seg.length:
                        yield seg.start + (off - foff)
                        break
            return
        from volatility3.framework.layers import scanners

        layer = self.ctx.layers[self.phys_layer]
        for n, off in enumerate(layer.scan(self.ctx, scanners.RegExScanner(_SWAPPER_RE.pattern))):
            if n >= MAX_SWAPPER_HITS:
                return
            yield off

    def _check_la57(self, kaslr: int) -> None:
        """Refuse 5-level paging clearly: Volatility 3 walks 4-level tables only, and with LA57 it
        silently lists nothing (QEMU `-cpu max` guests and Ice Lake+ hosts with CONFIG_X86_5LEVEL)."""
        symbols = self.layout["symbols"]
        name = next((n for n in ("__pgtable_l5_enabled", "pgtable_l5_enabled") if _address(symbols, n) is not None), None)
        if name is None:
            return
        raw = self.read_physical(_address(symbols, name) - KERNEL_MAP_BASE + kaslr, 4)
        if raw is None:
            return
        value = int.from_bytes(raw, "little")
        if value:
            raise ImageError(
                "the imaged kernel uses 5-level page tables (LA57), which Volatility 3 cannot translate",
                "re-image a machine booted with the kernel option `no5lvl` (for QEMU guests: `-cpu ...,la57=off`)",
            )

    def close(self) -> None:
        avml = getattr(self.phys, "avml", None)
        if avml is not None:
            avml.close()
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass
        self._fh.close()


def _address(symbols: dict, name: str) -> int | None:
    """A symbol's address as the ISF gives it (KASLR not applied), or None."""
    s = symbols.get(name)
    a = s.get("address") if isinstance(s, dict) else None
    return a if isinstance(a, int) else None
