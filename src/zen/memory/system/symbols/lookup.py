"""Finding the kernel symbol file (ISF) that describes the kernel of an image.

An image names its kernel by its banner (`Linux version 6.1.0-50-amd64 (...) #1 SMP ...`), and an
ISF for Linux carries the same text as the constant data of its `linux_banner` symbol. Matching
the two is how Volatility picks symbols too; zen does it with an index instead of opening every
file on every run: the banner, size, mtime and sha256 of each ISF seen are kept in
`~/.cache/zen/symbols/index.json`, so a lookup reads a few small files, and an ISF that is not
zen's own is schema-validated once per content hash, not once per run.
"""

from __future__ import annotations

import base64
import json
import lzma
import os
import re
from dataclasses import dataclass
from pathlib import Path

from zen.evidence.digest_cache import file_sha256  # noqa: F401 - lookup.file_sha256 for the symbol cache
from zen.runtime.errors import KernelSymbolsError

ISF_SUFFIXES = (".json", ".json.xz", ".json.gz", ".json.bz2")
NOT_ISF = {"index.json"}  # zen's own bookkeeping next to the ISFs in the cache
MAX_ISF_BYTES = 1 << 31  # decompressed; real kernel ISFs are 20-100 MB
MAX_FILES = 10_000


@dataclass(frozen=True)
class IsfMatch:
    """The ISF chosen for an image, and how."""

    path: Path
    banner: bytes  # the image banner it matched (NUL-less)
    sha256: str
    source: str  # "given (--symbols)", "zen symbol cache", ...


def symbol_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "zen" / "symbols"


def normalise_banner(banner: bytes) -> bytes:
    return banner.rstrip(b"\x00").rstrip(b"\n").strip()


def isf_files(paths: list[Path]) -> list[Path]:
    """ISF files named directly or found (recursively, bounded) in directories."""
    out: list[Path] = []
    for p in paths:
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            for root, _dirs, files in os.walk(p):
                for f in sorted(files):
                    if f.endswith(ISF_SUFFIXES) and f not in NOT_ISF:
                        out.append(Path(root) / f)
                        if len(out) >= MAX_FILES:
                            return out
        else:
            raise KernelSymbolsError(f"--symbols {p}: no such file or directory", "give an ISF file or a directory of them")
    return out


def _open_text(path: Path):
    """An ISF opened by its compression suffix (the same rule `zen symbols` writes by)."""
    from zen.memory.system.symbols.build import _open_isf

    return _open_isf(path)


def load_isf_json(path: Path) -> dict:
    """The whole ISF document (bounded in size), with a clear error for broken files."""
    try:
        with _open_text(path) as fh:
            data = fh.read(MAX_ISF_BYTES + 1)
        if len(data) > MAX_ISF_BYTES:
            raise KernelSymbolsError(f"symbol file {path} is larger than {MAX_ISF_BYTES >> 20} MiB decompressed")
        doc = json.loads(data)
    except KernelSymbolsError:
        raise
    except (OSError, EOFError, lzma.LZMAError, ValueError, UnicodeDecodeError) as exc:
        raise KernelSymbolsError(f"symbol file {path} is not a readable ISF: {exc}", "rebuild it with `zen symbols`") from None
    if not isinstance(doc, dict) or "metadata" not in doc or "symbols" not in doc:
        raise KernelSymbolsError(f"{path} is not an ISF (no metadata/symbols)", "give a Volatility 3 symbol file")
    return doc


def isf_banner(doc: dict) -> bytes | None:
    sym = doc.get("symbols", {}).get("linux_banner")
    data = sym.get("constant_data") if isinstance(sym, dict) else None
    if not isinstance(data, str):
        return None
    try:
        return normalise_banner(base64.b64decode(data))
    except ValueError:
        return None


class _Index:
    """banner/sha256/validity of ISF files keyed by (path, size, mtime)."""

    def __init__(self) -> None:
        self.path = symbol_cache_dir() / "index.json"
        try:
            self.data = json.loads(self.path.read_text())
            if not isinstance(self.data, dict):
                self.data = {}
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    def entry(self, isf: Path) -> dict:
        st = isf.stat()
        key = str(isf.resolve())
        e = self.data.get(key)
        if isinstance(e, dict) and e.get("size") == st.st_size and e.get("mtime") == st.st_mtime_ns:
            return e
        from zen.memory.system.symbols.build import read_isf_banner

        # zen's ISFs name their banner in the metadata at the start: no full parse needed
        with _open_text(isf) as fh:
            head = fh.read(1 << 16)
        zen_made = re.search(rb'"producer":\s*\{[^{}]*"name":\s*"zen"', head) is not None
        if not zen_made:
            load_isf_json(isf)  # a clear error for a file that is not an ISF at all
        banner = read_isf_banner(isf)
        e = {
            "size": st.st_size,
            "mtime": st.st_mtime_ns,
            "sha256": file_sha256(isf),
            "banner": normalise_banner(banner).decode("latin-1") if banner is not None else None,
            "producer": "zen" if zen_made else None,
            "valid": None,
        }
        self.data[key] = e
        self.dirty = True
        return e

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass  # the index is only a cache


def _validate_once(index: _Index, isf: Path, e: dict) -> None:
    """Schema-validate an ISF that zen did not write, once per content hash."""
    if e.get("producer") == "zen" or e.get("valid") is True:
        return
    import jsonschema  # a dependency of zen: without it Volatility reports every ISF as valid
    from volatility3 import schemas

    try:
        ok = schemas.validate(load_isf_json(isf), use_cache=False)
    except jsonschema.exceptions.ValidationError as exc:  # Volatility lets these escape
        raise KernelSymbolsError(
            f"symbol file {isf} does not pass Volatility's ISF schema validation: {exc.message[:200]}",
            "rebuild it with `zen symbols`",
        ) from None
    e["valid"] = bool(ok)
    index.dirty = True
    if not ok:
        raise KernelSymbolsError(
            f"symbol file {isf} does not pass Volatility's ISF schema validation", "rebuild it with `zen symbols`"
        )


def find_isf(banners: list[bytes], given: list[Path]) -> IsfMatch:
    """The ISF for one of the image's banners: given files first, then zen's symbol cache."""
    wanted = [normalise_banner(b) for b in banners]
    index = _Index()
    try:
        given_files = isf_files(given)
        # Symbols given on the command line are the only candidates: silently taking another
        # file from the cache would hide that the investigator's symbols are for another kernel.
        cache = symbol_cache_dir()
        cached = isf_files([cache]) if cache.is_dir() and not given else []
        unbannered: list[tuple[Path, dict]] = []
        seen_banners: list[str] = []
        for files, source in ((given_files, "given (--symbols)"), (cached, "zen symbol cache")):
            for f in files:
                try:
                    e = index.entry(f)
                except (KernelSymbolsError, OSError, EOFError, lzma.LZMAError):
                    if source.startswith("given") and f in given:
                        raise
                    continue  # a broken or foreign file in a directory is not a reason to stop
                if e["banner"] is None:
                    if source.startswith("given"):
                        unbannered.append((f, e))
                    continue
                b = e["banner"].encode("latin-1")
                if b in wanted:
                    _validate_once(index, f, e)
                    return IsfMatch(f, b, e["sha256"], source)
                if source.startswith("given"):
                    seen_banners.append(f"{f.name}: {e['banner']!r}")
        if len(unbannered) == 1 and not seen_banners:
            f, e = unbannered[0]
            _validate_once(index, f, e)
            return IsfMatch(f, wanted[0], e["sha256"], "given (--symbols; it has no banner, so the match is not checked)")
        running = wanted[0].decode("latin-1")
        release = running.split()[2] if len(running.split()) > 2 else "?"
        if seen_banners:
            raise KernelSymbolsError(
                f"the symbols given describe another kernel: the image runs {running!r}, but " + "; ".join(seen_banners[:4]),
                f"give the ISF of kernel {release}, or build it with `zen symbols` from that kernel's vmlinuz/BTF",
            )
        raise KernelSymbolsError(
            f"no kernel symbols (ISF) for the image's kernel: {running!r}",
            f"build them with `zen symbols --deb linux-image-{release}-unsigned.deb` (Debian/Ubuntu package of that "
            f"kernel), or `zen symbols --kernel vmlinuz-{release} --kallsyms kallsyms.txt` with files from the imaged "
            "machine (/boot/vmlinuz-*, /sys/kernel/btf/vmlinux, /proc/kallsyms as root); then pass --symbols or rely on "
            "zen's symbol cache",
        )
    finally:
        index.save()
