"""`zen symbols`: a Volatility ISF for a Linux kernel from what a distribution ships.

Inputs, any of (at least a BTF source):
- `kernel`: a vmlinuz (bzImage) or vmlinux; gives BTF, the banner, the link-time `_text` and the
  kernel's embedded kallsyms table, so it is enough on its own;
- `btf`: a raw BTF blob (a copy of /sys/kernel/btf/vmlinux) when there is no kernel file;
- `system_map` / `kallsyms`: symbol addresses (System.map, or /proc/kallsyms read as root);
  randomised (KASLR) addresses are brought back to link time;
- `deb`: a linux-image .deb, from which the vmlinuz is taken;
- `banner`: the banner text (a copy of /proc/version) when no kernel file gives it.

Results are cached in zen's symbol cache (`~/.cache/zen/symbols/`, where `zen ps` and friends look
for ISFs) under a key made of the inputs' hashes, so a repeated call costs one hash of the inputs.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from zen import __version__
from zen.memory.system.symbols import isf as isfmod
from zen.memory.system.symbols.btfparse import parse_btf
from zen.memory.system.symbols.kallsyms import DEFAULT_LINK_TEXT, check_same_kernel, load_symbol_file
from zen.memory.system.symbols.kallsyms_table import read_kallsyms_table
from zen.memory.system.symbols.kernelfile import Vmlinux, load_kernel_bytes, read_limited
from zen.runtime.errors import KernelSymbolsError

BUILD_VERSION = 1  # bump when the ISF zen writes changes for the same inputs
BUILDS_INDEX = "builds.idx"  # not *.json: the ISF lookup treats *.json files in the cache as ISFs
MAX_DEB_MEMBER = 512 << 20
HEAD_BYTES = 1 << 16
# Volatility's Linux layer finds KASLR from init_task, the page tables from init_top_pgt
# (swapper_pg_dir before 4.13), and matches images by linux_banner.
NEEDED_SYMBOLS = ("_text", "init_task", "linux_banner")


@dataclass
class IsfInfo:
    """What `build_isf` made (or found in the cache)."""

    path: Path
    banner: bytes | None  # NUL-terminated banner, as in constant_data
    sha256: str  # of the ISF file
    size: int
    counts: dict[str, int]
    sources: dict[str, str]
    kaslr_shift: int = 0
    cached: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "zen" / "symbols"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _release(banner: bytes | None) -> str:
    parts = (banner or b"").split()
    rel = parts[2].decode("latin-1") if len(parts) > 2 else "unknown"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", rel)[:100]


# -- .deb ------------------------------------------------------------------------------------------


def kernel_from_deb(deb: Path) -> tuple[bytes, str]:
    """(vmlinuz bytes, member name) from a linux-image .deb: an ar archive whose data.tar.*
    holds ./boot/vmlinuz-<release>. Read with the standard library (xz, gz, bz2 data members);
    zstd members (newer Ubuntu) need the `zstandard` module."""
    data = read_limited(deb, 1 << 30)
    if data[:8] != b"!<arch>\n":
        raise KernelSymbolsError(f"{deb} is not a .deb (no ar header)", "give a linux-image-*.deb package")
    pos = 8
    member = None
    for _ in range(64):
        if pos + 60 > len(data):
            break
        hdr = data[pos : pos + 60]
        name = hdr[:16].decode("latin-1").strip().rstrip("/")
        try:
            size = int(hdr[48:58].decode("latin-1").strip())
        except ValueError:
            raise KernelSymbolsError(f"{deb}: corrupt ar member header at offset {pos}") from None
        body = data[pos + 60 : pos + 60 + size]
        if name.startswith("data.tar"):
            member = (name, body)
            break
        pos += 60 + size + (size & 1)
    if member is None:
        raise KernelSymbolsError(f"{deb} has no data.tar member", "give a linux-image-*.deb package")
    name, body = member
    import io

    raw: io.BytesIO
    if name.endswith(".zst"):
        try:
            import zstandard  # type: ignore[import-not-found]
        except ImportError:
            raise KernelSymbolsError(
                f"{deb}: its {name} is zstd-compressed and the `zstandard` module is not installed",
                "pip install zstandard, or unpack it with `dpkg-deb -x` and pass --kernel boot/vmlinuz-*",
            ) from None
        raw = io.BytesIO(zstandard.ZstdDecompressor().decompressobj().decompress(body))
    else:
        raw = io.BytesIO(body)
    try:
        with tarfile.open(fileobj=raw, mode="r:*") as tf:
            for ti in tf:
                base = ti.name.lstrip("./")
                if re.fullmatch(r"boot/vmlinu[xz]-[^/]+", base) and ti.isfile():
                    if ti.size > MAX_DEB_MEMBER:
                        raise KernelSymbolsError(f"{deb}: {ti.name} is implausibly large ({ti.size} bytes)")
                    fh = tf.extractfile(ti)
                    if fh is not None:
                        return fh.read(), ti.name
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
        raise KernelSymbolsError(f"{deb}: cannot read its {name}: {exc}") from None
    raise KernelSymbolsError(f"{deb} holds no boot/vmlinuz-*", "give the linux-image-<release> package (not -headers/-modules)")


# -- reading ISF heads -----------------------------------------------------------------------------


def _open_isf(path: Path):
    import bz2
    import gzip

    n = path.name
    if n.endswith(".xz"):
        return lzma.open(path, "rb")
    if n.endswith(".gz"):
        return gzip.open(path, "rb")
    if n.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def read_isf_banner(path: Path) -> bytes | None:
    """The banner an ISF describes (NUL-less, as in constant_data minus the NUL).

    zen's ISFs start with their metadata, whose producer names the banner: read 64 KiB. Other
    ISFs (dwarf2json) need the whole document, parsed once."""
    import base64

    try:
        with _open_isf(path) as fh:
            head = fh.read(HEAD_BYTES)
        m = re.match(rb'\{"metadata":(\{.*?\}),\n"', head, re.S)
        if m:
            meta = json.loads(m.group(1))
            b = meta.get("producer", {}).get("banner")
            if meta.get("producer", {}).get("name") == "zen" and isinstance(b, str):
                return b.encode("latin-1").rstrip(b"\x00")
        with _open_isf(path) as fh:
            doc = json.loads(fh.read(1 << 31))
        data = doc.get("symbols", {}).get("linux_banner", {}).get("constant_data")
        return base64.b64decode(data).rstrip(b"\x00") if isinstance(data, str) else None
    except (OSError, EOFError, lzma.LZMAError, ValueError, AttributeError):
        return None


def find_isf_for_banner(banner: bytes, search: list[Path]) -> Path | None:
    """The first ISF (files, or directories searched recursively, bounded) describing `banner`."""
    want = banner.rstrip(b"\x00").strip()
    seen = 0
    for p in search:
        if p.is_file():
            files = [p]
        elif p.is_dir():
            files = sorted(q for q in p.rglob("*") if q.name.endswith(isfmod.ISF_SUFFIXES) and q.is_file())
        else:
            continue
        for f in files:
            seen += 1
            if seen > 10_000:
                return None
            b = read_isf_banner(f)
            if b is not None and b.strip() == want:
                return f
    return None


# -- building --------------------------------------------------------------------------------------


def _code_digest() -> str:
    """Hash of the code that shapes an ISF: a cached ISF made by other code is rebuilt."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in ("btfparse.py", "globals_table.py", "isf.py", "kallsyms.py", "kallsyms_table.py", "kernelfile.py", "build.py"):
        try:
            h.update((here / name).read_bytes())
        except OSError:
            h.update(name.encode())
    return h.hexdigest()


def _cache_key(parts: dict[str, bytes | None]) -> str:
    h = hashlib.sha256(f"zen-isf {BUILD_VERSION} {isfmod.ISF_FORMAT} {_code_digest()}".encode())
    for k in sorted(parts):
        v = parts[k]
        h.update(f"\n{k}:".encode() + (_sha256(v).encode() if v is not None else b"-"))
    return h.hexdigest()


def _load_builds(cdir: Path) -> dict:
    try:
        d = json.loads((cdir / BUILDS_INDEX).read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_builds(cdir: Path, builds: dict) -> None:
    try:
        tmp = cdir / f"{BUILDS_INDEX}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(builds, indent=1, sort_keys=True))
        os.replace(tmp, cdir / BUILDS_INDEX)
    except OSError:
        pass  # only a cache


def _banner_of(vm: Vmlinux, linux_banner_addr: int | None) -> bytes:
    """The banner bytes incl. the trailing NUL: at `linux_banner` when known (.rodata may hold
    another, differently formatted copy), else the first in .rodata."""
    if linux_banner_addr is not None:
        raw = vm.vaddr_bytes(linux_banner_addr, 512) or b""
        end = raw.find(b"\x00")
        if raw.startswith(b"Linux version ") and end > 0:
            return raw[: end + 1]
    return vm.banner() + b"\x00"


def build_isf(
    kernel: Path | None = None,
    btf: Path | None = None,
    system_map: Path | None = None,
    kallsyms: Path | None = None,
    out: Path | None = None,
    *,
    deb: Path | None = None,
    banner: bytes | None = None,
    use_cache: bool = True,
) -> IsfInfo:
    """Build (or take from the cache) the ISF for one kernel; see the module docstring."""
    t0 = time.perf_counter()
    secs: dict[str, float] = {}
    notes: list[str] = []
    sources: dict[str, str] = {}
    kernel_bytes = None
    if deb is not None:
        kernel_bytes, member = kernel_from_deb(deb)
        sources["kernel"] = f"{deb.name}:{member}"
    elif kernel is not None:
        kernel_bytes = read_limited(kernel)
        sources["kernel"] = kernel.name
    btf_bytes = read_limited(btf) if btf is not None else None
    sym_path = kallsyms or system_map
    sym_bytes = read_limited(sym_path) if sym_path is not None else None
    if kernel_bytes is None and btf_bytes is None:
        raise KernelSymbolsError("no type information given", "give --kernel (vmlinuz/vmlinux), --deb or --btf")
    if kernel_bytes is None and sym_bytes is None:
        raise KernelSymbolsError(
            "no symbol addresses given: a raw BTF has types only",
            "add --kallsyms (/proc/kallsyms of the imaged machine, read as root) or --system-map, or give --kernel",
        )
    key = _cache_key({"kernel": kernel_bytes, "btf": btf_bytes, "syms": sym_bytes, "banner": banner})
    cdir = cache_dir()
    if use_cache:
        hit = _load_builds(cdir).get(key)
        cached = cdir / hit["file"] if isinstance(hit, dict) and isinstance(hit.get("file"), str) else None
        if cached is not None and cached.is_file() and cached.stat().st_size == hit.get("size"):
            path = cached
            if out is not None and out.resolve() != cached.resolve():
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(cached, out)
                path = out
            secs["total"] = time.perf_counter() - t0
            return IsfInfo(
                path,
                hit["banner"].encode("latin-1") if hit.get("banner") else None,
                hit["sha256"],
                hit["size"],
                hit["counts"],
                hit["sources"],
                hit.get("kaslr_shift", 0),
                True,
                secs,
                hit.get("notes", []),
            )

    vm = None
    if kernel_bytes is not None:
        inputs = load_kernel_bytes(kernel_bytes, sources["kernel"])
        vm = inputs.vmlinux
        sources["kernel"] += f" ({inputs.kind})"
        blob = btf_bytes if btf_bytes is not None else inputs.btf
    else:
        assert btf_bytes is not None and btf is not None
        blob = btf_bytes
    if btf is not None:
        sources["btf"] = btf.name
    secs["kernel"] = time.perf_counter() - t0
    t = time.perf_counter()
    types = parse_btf(blob)
    secs["btf"] = time.perf_counter() - t

    t = time.perf_counter()
    embedded = None
    if vm is not None:
        try:
            embedded = read_kallsyms_table(vm)
        except KernelSymbolsError:
            if sym_bytes is None:
                raise
            notes.append("the kernel image's own kallsyms table was not found; used the symbol file alone")
    shift = 0
    if sym_path is not None:
        link_text = vm.text_address if vm is not None else None
        if link_text is None:
            notes.append(f"link-time _text assumed {DEFAULT_LINK_TEXT:#x} (no vmlinux given)")
        sf = load_symbol_file(sym_path, link_text)
        if embedded is not None:
            check_same_kernel(sf.symbols, [isfmod.Symbol(s.name, s.address, s.type) for s in embedded.symbols], str(sym_path))
        symbols = sf.symbols
        shift = sf.kaslr_shift
        sources["symbols"] = f"{sym_path.name} ({len(symbols)} kernel symbols, {sf.module_symbols} module symbols skipped)"
        if shift:
            notes.append(f"KASLR shift {shift:#x} removed from {sym_path.name}")
    else:
        assert embedded is not None
        symbols = [isfmod.Symbol(s.name, s.address, s.type) for s in embedded.symbols]
        sources["symbols"] = f"kallsyms table embedded in the kernel image ({len(symbols)} symbols)"
    if embedded is not None:  # the tables themselves, which no symbol file lists
        have = {s.name for s in symbols}
        symbols += [isfmod.Symbol(s.name, s.address, s.type) for s in embedded.tables if s.name not in have]
    secs["symbols"] = time.perf_counter() - t
    have = {s.name for s in symbols}
    lacking = [n for n in NEEDED_SYMBOLS if n not in have]
    if lacking:
        raise KernelSymbolsError(
            f"the kernel symbols lack {', '.join(lacking)}, which Volatility needs to find the kernel's tasks",
            "the kernel was probably built without CONFIG_KALLSYMS_ALL (its kallsyms lists functions only): "
            "give --kernel (the vmlinuz) or a full System.map from the kernel's debug package",
        )

    addr = next((s.address for s in symbols if s.name == "linux_banner"), None)
    if vm is not None:
        the_banner = _banner_of(vm, addr)
        if banner is not None and banner.rstrip(b"\x00").strip() != the_banner.rstrip(b"\x00").strip():
            notes.append("--banner differs from the kernel image's banner; the image's is used")
    elif banner is not None:
        the_banner = banner.rstrip(b"\x00").rstrip(b"\n") + b"\n\x00"
    else:
        the_banner = None
        notes.append(
            "no banner (give --kernel or --banner /proc/version copy): Volatility cannot match this ISF to an image by itself"
        )

    t = time.perf_counter()
    meta_linux = {
        "symbols": [
            {
                "kind": "system-map" if sym_path else "symtab",
                "name": sources["symbols"].split(" (")[0],
                "hash_type": "sha256",
                "hash_value": _sha256(sym_bytes if sym_bytes is not None else kernel_bytes or b""),
            }
        ],
        "types": [
            {
                "kind": "dwarf",
                "name": "btf " + sources.get("btf", sources.get("kernel", "")).split(" (")[0],
                "hash_type": "sha256",
                "hash_value": _sha256(blob),
            }
        ],
    }
    producer: dict = {"name": "zen", "version": __version__, "source": "btf+kallsyms"}
    if the_banner is not None:
        producer["banner"] = the_banner.rstrip(b"\x00").decode("latin-1")
    meta = {"format": isfmod.ISF_FORMAT, "linux": meta_linux, "producer": producer}
    doc = isfmod.isf_document(types, symbols, the_banner, meta, vm.vaddr_bytes if vm is not None else None)
    secs["isf"] = time.perf_counter() - t
    t = time.perf_counter()
    data = lzma.compress(isfmod.dump_isf(doc), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=1)
    secs["write"] = time.perf_counter() - t
    counts = {k: len(doc[k]) for k in ("base_types", "user_types", "enums", "symbols")}
    counts["typed_symbols"] = sum(1 for v in doc["symbols"].values() if "type" in v)

    digest = _sha256(data)
    cname = f"linux-{_release(the_banner)}-{digest[:12]}.json.xz"
    targets = []
    if use_cache:
        targets.append(cdir / cname)
    if out is not None:
        targets.append(out)
    for p in targets:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, p)
    path = out if out is not None else cdir / cname
    info = IsfInfo(path, the_banner, digest, len(data), counts, sources, shift, False, secs, notes)
    if use_cache:
        builds = _load_builds(cdir)
        banner_text = the_banner.decode("latin-1") if the_banner else None
        for k, e in list(builds.items()):  # an older build for this kernel: one ISF per banner
            if isinstance(e, dict) and e.get("banner") == banner_text and banner_text and e.get("file") != cname:
                del builds[k]
                if isinstance(e.get("file"), str) and "/" not in e["file"]:
                    (cdir / e["file"]).unlink(missing_ok=True)
        builds[key] = {
            "file": cname,
            "size": len(data),
            "sha256": digest,
            "counts": counts,
            "sources": sources,
            "banner": banner_text,
            "kaslr_shift": shift,
            "notes": notes,
        }
        _save_builds(cdir, builds)
    secs["total"] = time.perf_counter() - t0
    return info
