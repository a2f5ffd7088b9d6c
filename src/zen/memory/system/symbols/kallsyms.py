"""Symbol address files: `System.map` and copies of `/proc/kallsyms`.

Both are lines of `address type name [module]`. They differ in one way that matters: System.map
holds link-time addresses, while /proc/kallsyms of a running kernel holds the addresses after
KASLR moved the kernel. An ISF must hold link-time addresses (Volatility finds the shift itself,
from `init_task` in the image), so a randomised file is shifted back by `_text(file) -
_text(link time)`. Per-CPU symbols are not moved by KASLR: with CONFIG_KALLSYMS_ABSOLUTE_PERCPU
they are listed as type `A` with small absolute values (offsets into the per-CPU area), and they
keep those values.

A file read without privilege shows every address as 0 (kptr_restrict); that is detected and
refused with the way to read it properly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zen.memory.system.symbols.isf import Symbol
from zen.runtime.errors import KernelSymbolsError

MAX_LINES = 5_000_000
MAX_FILE = 256 << 20
KERNEL_MAP_BASE = 0xFFFFFFFF80000000  # x86_64 __START_KERNEL_map: kernel text/data live above
DEFAULT_LINK_TEXT = 0xFFFFFFFF81000000  # _text of x86_64 kernels with the default PHYSICAL_START
KASLR_ALIGN = 0x200000  # x86_64 randomises the kernel in CONFIG_PHYSICAL_ALIGN (2 MiB) steps


class SymbolFileError(KernelSymbolsError):
    """A System.map / kallsyms file is unusable."""


@dataclass
class SymbolFile:
    """Kernel symbols of a System.map or kallsyms copy, already at link-time addresses."""

    symbols: list[Symbol]
    kaslr_shift: int  # what was subtracted (0 for System.map or an unrandomised kallsyms)
    module_symbols: int  # lines skipped because they belong to modules
    text: int  # link-time _text


def parse_symbol_lines(text: str, source: str) -> tuple[list[Symbol], int]:
    """(kernel symbols in file order, number of module symbols skipped)."""
    syms: list[Symbol] = []
    modules = 0
    bad = 0
    for i, line in enumerate(text.splitlines()):
        if i >= MAX_LINES:
            raise SymbolFileError(f"{source}: more than {MAX_LINES} lines: not a symbol file")
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 3 or len(parts[1]) != 1:
            bad += 1
            if bad > 10 and bad > len(syms):
                raise SymbolFileError(
                    f"{source} is not a System.map/kallsyms file (line {i + 1}: {line[:80]!r})",
                    "give /proc/kallsyms (read as root) or the kernel's System.map",
                )
            continue
        if len(parts) >= 4 and parts[3].startswith("["):
            modules += 1
            continue
        try:
            addr = int(parts[0], 16)
        except ValueError:
            bad += 1
            continue
        if addr >> 64:
            bad += 1
            continue
        syms.append(Symbol(parts[2], addr, parts[1]))
    return syms, modules


def _is_placeholder(syms: list[Symbol]) -> bool:
    """Debian's /boot/System.map: one line `ffffffffffffffff B The real System.map is in ...`."""
    return len(syms) < 16 and not any(s.name in ("_text", "_stext") for s in syms)


def load_symbol_file(path: Path, link_text: int | None) -> SymbolFile:
    """Read a System.map or kallsyms copy and bring it to link-time addresses.

    `link_text` is the link-time `_text` (from the vmlinux when there is one); without it the
    x86_64 default is assumed."""
    from zen.memory.system.symbols.kernelfile import read_limited

    raw = read_limited(path, MAX_FILE, "a symbol file", SymbolFileError)
    syms, modules = parse_symbol_lines(raw.decode("latin-1"), str(path))
    if not syms or _is_placeholder(syms):
        raise SymbolFileError(
            f"{path} holds no kernel symbols" + (" (a distribution placeholder System.map?)" if syms else ""),
            "give /proc/kallsyms of the imaged machine (read as root), or only --kernel: zen reads the "
            "symbol table embedded in the kernel image",
        )
    if all(s.address == 0 for s in syms):
        raise SymbolFileError(
            f"every address in {path} is 0: it was read without privilege (kernel.kptr_restrict)",
            "read it as root with `sysctl kernel.kptr_restrict=0` (or 1 as root): "
            "sudo sh -c 'sysctl -w kernel.kptr_restrict=0; cat /proc/kallsyms' > kallsyms.txt",
        )
    by = {}
    for s in syms:
        by.setdefault(s.name, s.address)
    text = by.get("_text", by.get("_stext"))
    if text is None or text < KERNEL_MAP_BASE:
        raise SymbolFileError(
            f"{path} has no kernel `_text` symbol in the kernel address range",
            "is it the kallsyms of an x86_64 Linux kernel?",
        )
    want = link_text if link_text is not None else DEFAULT_LINK_TEXT
    shift = text - want
    if shift % 0x1000:
        raise SymbolFileError(
            f"{path}: _text is {text:#x}, not page-aligned against the link-time {want:#x}",
            "the file and the kernel image do not belong together",
        )
    if shift:
        for s in syms:
            if s.type not in "Aa" and s.address >= KERNEL_MAP_BASE:
                s.address -= shift
    return SymbolFile(syms, shift, modules, want)


def check_same_kernel(given: list[Symbol], embedded: list[Symbol], source: str) -> None:
    """A kallsyms/System.map given with a kernel image must describe that image: compare the
    link-time addresses of a few symbols every kernel has."""
    a = {s.name: s.address for s in given}
    b = {s.name: s.address for s in embedded}
    diffs = [n for n in ("_text", "init_task", "linux_banner", "_etext", "init_top_pgt") if n in a and n in b and a[n] != b[n]]
    if diffs:
        n = diffs[0]
        raise SymbolFileError(
            f"{source} is from another kernel build than the kernel image: {n} at {a[n]:#x} there, {b[n]:#x} in the image",
            "give the kallsyms/System.map of the same kernel, or leave it out (zen reads the image's own table)",
        )
