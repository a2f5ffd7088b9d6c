"""Kernel files as shipped by a distribution: bzImage (`vmlinuz`), `vmlinux` ELF, raw BTF.

A distribution's kernel package is often the only thing an investigator can get for a seized
machine's kernel (the debug package with DWARF is gigabytes, or gone from the mirrors). Its
`vmlinuz` is a bzImage: a real-mode setup block, then a small decompressor, then the compressed
`vmlinux` ELF as the "payload". That ELF keeps its sections (only symbols and DWARF are
stripped), so it carries the `.BTF` types, the `linux_banner` text in `.rodata`, and the kernel's
own compressed symbol table (kallsyms, read by `kallsyms_table`).

Everything here reads untrusted bytes: lengths are bounded, decompression stops at a size limit,
and failures are `KernelFileError` with a hint.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from zen.runtime.errors import ZenError

MAX_KERNEL_FILE = 512 << 20  # a vmlinuz is ~10 MB, a stripped vmlinux ~60 MB, with DWARF ~1 GB
MAX_VMLINUX = 1 << 30  # decompressed bound
ELF_MAGIC = b"\x7fELF"
BTF_MAGIC_LE = b"\x9f\xeb\x01"
_BANNER_RE = re.compile(rb"Linux version [0-9][\x20-\x7e]{8,400}\n?\x00")
# The magic numbers scripts/extract-vmlinux scans for, with the decompressor for each.
_PAYLOAD_MAGICS: list[tuple[str, bytes]] = [
    ("xz", b"\xfd7zXZ\x00"),
    ("zstd", b"\x28\xb5\x2f\xfd"),
    ("gzip", b"\x1f\x8b\x08"),
    ("lzma", b"\x5d\x00\x00"),
    ("bzip2", b"BZh"),
    ("lz4", b"\x02\x21\x4c\x18"),
    ("lzo", b"\x89LZO"),
]


class KernelFileError(ZenError):
    """A kernel image, vmlinux or BTF file cannot be used."""


@dataclass
class Section:
    name: str
    addr: int
    offset: int
    size: int
    alloc: bool


@dataclass
class Vmlinux:
    """The parts of a vmlinux ELF that symbol building needs."""

    data: bytes
    sections: dict[str, Section] = field(default_factory=dict)
    symtab: dict[str, int] = field(default_factory=dict)  # only when the ELF was not stripped
    compression: str | None = None  # how the bzImage payload was packed, if it came from one

    def section_bytes(self, name: str) -> bytes | None:
        s = self.sections.get(name)
        if s is None or s.offset + s.size > len(self.data):
            return None
        return self.data[s.offset : s.offset + s.size]

    @property
    def text_address(self) -> int | None:
        """Link-time address of `_text`: the start of the `.text` output section on x86_64."""
        if "_text" in self.symtab:
            return self.symtab["_text"]
        s = self.sections.get(".text")
        return s.addr if s else None

    def vaddr_bytes(self, addr: int, size: int) -> bytes | None:
        """`size` bytes at link-time virtual address `addr`, from whichever PROGBITS section holds it."""
        for s in self.sections.values():
            if s.alloc and s.addr <= addr and addr + size <= s.addr + s.size and s.offset + s.size <= len(self.data):
                off = s.offset + addr - s.addr
                return self.data[off : off + size]
        return None

    def banner(self) -> bytes:
        """A `linux_banner`-like text ("Linux version ... \\n"), NUL excluded, from `.rodata`, for
        when the symbol's address is unknown. Since 6.1 .rodata holds two: init/version.c's, built
        before the build number is known ("#  SMP"), and the real one ("#1 SMP"): prefer a number."""
        for sec in (".rodata", ".init.rodata", ".data"):
            raw = self.section_bytes(sec)
            if raw is None:
                continue
            found = [m.group(0)[:-1] for _, m in zip(range(16), _BANNER_RE.finditer(raw))]
            if found:
                return next((b for b in found if re.search(rb"#\d", b)), found[0])
        raise KernelFileError("no `Linux version ...` banner in the kernel's .rodata", "is this really a Linux kernel image?")


def read_limited(path: Path, limit: int = MAX_KERNEL_FILE, what: str = "a kernel file", error: type = KernelFileError) -> bytes:
    """A whole input file, refused (as `error`) when unreadable or larger than `limit`."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{path} is larger than {limit >> 20} MiB: not {what}")
    return data


def _decompress(kind: str, blob: bytes, limit: int = MAX_VMLINUX) -> bytes:
    """Decompress one payload candidate, stopping at `limit` bytes; trailing bytes are ignored
    (the kernel appends the uncompressed size after the stream)."""
    try:
        if kind == "xz":
            return lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(blob, limit)
        if kind == "lzma":
            return lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(blob, limit)
        if kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(blob, limit)
        if kind == "bzip2":
            return bz2.BZ2Decompressor().decompress(blob, limit)
        if kind == "zstd":
            return _zstd(blob, limit)
        if kind == "lz4":
            return _lz4_legacy(blob, limit)
    except (lzma.LZMAError, zlib.error, OSError, EOFError, ValueError, gzip.BadGzipFile):
        return b""
    return b""


def _tool(argv: list[str], blob: bytes, limit: int) -> bytes:
    """Decompress with a command-line tool (lz4, zstd) when the Python module is missing."""
    import shutil
    import subprocess

    if shutil.which(argv[0]) is None:
        raise KernelFileError(
            f"this kernel image is {argv[0]}-compressed, and neither the `{argv[0]}` command nor its Python module is installed",
            f"install one (apt-get install {argv[0]}, or pip install {'lz4' if argv[0] == 'lz4' else 'zstandard'}), "
            "or give the vmlinux / BTF instead",
        )
    import tempfile

    with tempfile.TemporaryFile() as src:
        src.write(blob)
        src.seek(0)
        try:
            proc = subprocess.Popen(argv, stdin=src, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return b""
        try:
            assert proc.stdout is not None
            out = proc.stdout.read(limit)  # bounded: a decompression bomb stops here
        finally:
            proc.kill()
            proc.wait()
    return out


def _zstd(blob: bytes, limit: int) -> bytes:
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return _tool(["zstd", "-dcq"], blob, limit)
    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(blob) as r:
            while len(out) < limit:
                chunk = r.read(min(1 << 24, limit - len(out)))
                if not chunk:
                    break
                out += chunk
    except zstandard.ZstdError:
        pass  # trailing bytes after the frame: keep what was decompressed
    return bytes(out)


def _lz4_legacy(blob: bytes, limit: int) -> bytes:
    """The kernel packs with lz4's *legacy* format (magic 0x184c2102, then blocks of
    `u32 size + data`, each at most 8 MiB decompressed), which `lz4.frame` does not read."""
    try:
        import lz4.block  # type: ignore[import-not-found]
    except ImportError:
        return _tool(["lz4", "-dcq"], blob, limit)
    out: list[bytes] = []
    total, pos = 0, 4
    while pos + 4 <= len(blob) and total < limit:
        (size,) = struct.unpack_from("<I", blob, pos)
        if size == 0 or pos + 4 + size > len(blob):
            break  # the kernel's trailing uncompressed-size word, or the end
        try:
            chunk = lz4.block.decompress(blob[pos + 4 : pos + 4 + size], uncompressed_size=8 << 20)
        except lz4.block.LZ4BlockError:
            break
        out.append(chunk)
        total += len(chunk)
        pos += 4 + size
    return b"".join(out)[:limit]


def _payload_candidates(img: bytes) -> list[int]:
    """Offsets to try: the bzImage header's payload_offset first, then every magic hit."""
    out: list[int] = []
    if len(img) > 0x250 and img[0x202:0x206] == b"HdrS":
        setup_sects = img[0x1F1] or 4
        (version,) = struct.unpack_from("<H", img, 0x206)
        if version >= 0x208:
            payload_offset, _payload_length = struct.unpack_from("<II", img, 0x248)
            out.append((setup_sects + 1) * 512 + payload_offset)
    return out


def decompress_bzimage(img: bytes) -> tuple[bytes, str]:
    """The vmlinux ELF inside a bzImage, and the compression it used."""
    tried = 0
    for off in _payload_candidates(img):
        for kind, magic in _PAYLOAD_MAGICS:
            if img[off : off + len(magic)] == magic:
                out = _decompress(kind, img[off:])
                if out[:4] == ELF_MAGIC:
                    return out, kind
    for kind, magic in _PAYLOAD_MAGICS:
        pos = 0
        while tried < 64:
            i = img.find(magic, pos)
            if i < 0:
                break
            pos = i + 1
            tried += 1
            out = _decompress(kind, img[i:])
            if out[:4] == ELF_MAGIC:
                return out, kind
    raise KernelFileError(
        "no compressed vmlinux found in the kernel image (not a bzImage, or an unknown compression)",
        "give the vmlinux ELF or /sys/kernel/btf/vmlinux instead",
    )


def parse_vmlinux(data: bytes) -> Vmlinux:
    """Sections (and symbols, if any) of a vmlinux ELF."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    vm = Vmlinux(data)
    try:
        elf = ELFFile(io.BytesIO(data))
        if elf.elfclass != 64 or elf["e_machine"] != "EM_X86_64":
            raise KernelFileError(f"the kernel ELF is {elf['e_machine']} ELF{elf.elfclass}: zen reads x86_64 kernels only")
        for i, sec in enumerate(elf.iter_sections()):
            if i > 10_000:
                break
            name = sec.name
            if not name or name in vm.sections:
                continue
            vm.sections[name] = Section(
                name,
                sec["sh_addr"],
                sec["sh_offset"],
                sec["sh_size"] if sec["sh_type"] != "SHT_NOBITS" else 0,
                bool(sec["sh_flags"] & 2),
            )
            if isinstance(sec, SymbolTableSection) and name == ".symtab":
                for sym in sec.iter_symbols():
                    if sym.name and sym["st_shndx"] != "SHN_UNDEF":
                        vm.symtab.setdefault(sym.name, sym["st_value"])
    except KernelFileError:
        raise
    except (ELFError, struct.error, ValueError, KeyError, IndexError) as exc:
        raise KernelFileError(f"the vmlinux ELF is malformed: {exc}") from None
    return vm


@dataclass
class KernelInputs:
    """What a kernel file yielded: BTF bytes, and the vmlinux when there was one."""

    btf: bytes
    vmlinux: Vmlinux | None
    kind: str  # "bzImage (xz)", "vmlinux ELF", "raw BTF"


def load_kernel_file(path: Path) -> KernelInputs:
    """BTF (and vmlinux) from a vmlinuz, a vmlinux or a raw BTF file, told apart by content."""
    return load_kernel_bytes(read_limited(path), str(path))


def load_kernel_bytes(data: bytes, name: str = "the kernel file") -> KernelInputs:
    """`load_kernel_file` for bytes already read (e.g. taken out of a .deb)."""
    if data[:3] == BTF_MAGIC_LE or data[:2] == b"\xeb\x9f":
        return KernelInputs(data, None, "raw BTF")
    kind = "vmlinux ELF"
    comp = None
    if data[:4] != ELF_MAGIC:
        data, comp = decompress_bzimage(data)
        kind = f"bzImage ({comp})"
    vm = parse_vmlinux(data)
    vm.compression = comp
    btf = vm.section_bytes(".BTF")
    if not btf:
        raise KernelFileError(
            f"{name} has no .BTF section: the kernel was built without CONFIG_DEBUG_INFO_BTF",
            "use dwarf2json with the kernel's debug package (vmlinux with DWARF) instead",
        )
    return KernelInputs(btf, vm, kind)
