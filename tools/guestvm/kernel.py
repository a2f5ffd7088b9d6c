"""Fetch a stock Debian kernel and pick out the few modules a 9p-rooted guest needs.

A stock distribution kernel (not a custom build) is the point: the images zen must read in the
field come from such kernels, with KASLR, BTF and modules.  Debian's package ships no
``modules.dep`` (depmod runs at install time), so load order is computed here from each module's
own ``.modinfo`` ``depends=`` field.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path

from .cache import GuestError, apt_download_extract, cache_root, deb_version, replace_dir

# What the guest loads: virtio PCI transport, the block device (LiME's output disk), the 9p client
# (host root and share), and virtio-net (LiME over TCP).  Dependencies are added automatically.
WANTED = ["virtio_pci", "virtio_blk", "9pnet_virtio", "9p", "virtio_net"]


def modinfo(ko: Path) -> dict[str, list[str]]:
    """The key=value strings of a module's ``.modinfo`` ELF section (keys may repeat)."""
    data = ko.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise GuestError(f"{ko} is not a 64-bit ELF module")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def sect(i: int) -> tuple[int, int, int]:
        name, _t, _f, _a, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size

    _, stroff, _ = sect(shstrndx)
    info: dict[str, list[str]] = {}
    for i in range(shnum):
        name, off, size = sect(i)
        if data[stroff + name : data.index(b"\0", stroff + name)] == b".modinfo":
            for item in data[off : off + size].split(b"\0"):
                if b"=" in item:
                    k, _, v = item.decode(errors="replace").partition("=")
                    info.setdefault(k, []).append(v)
    return info


def module_index(modroot: Path) -> dict[str, Path]:
    """Module name (``-`` folded to ``_``, as the kernel does) -> its .ko file."""
    return {p.name[:-3].replace("-", "_"): p for p in modroot.rglob("*.ko")}


def load_order(modroot: Path, wanted: list[str]) -> list[str]:
    """``wanted`` and all their dependencies, dependencies first (a topological order)."""
    index = module_index(modroot)
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in seen:
            return
        if name in stack:
            raise GuestError(f"module dependency cycle: {' -> '.join(stack + (name,))}")
        if name not in index:
            raise GuestError(f"module {name} is not in {modroot} (built in, or another flavour?)")
        deps = ",".join(modinfo(index[name]).get("depends", [""])).split(",")
        for d in filter(None, deps):
            visit(d.replace("-", "_"), stack + (name,))
        seen.add(name)
        order.append(name)

    for w in wanted:
        visit(w, ())
    return order


def fetch_kernel(version: str) -> dict:
    """Download ``linux-image-<version>-unsigned`` into ``<cache>/<version>/kernel`` and keep only
    ``boot/`` (vmlinuz, config, System.map) and the modules in ``load_order``.

    Returns the kernel part of assets.json.  Caller holds the cache lock."""
    base = cache_root() / version
    final = base / "kernel"
    meta_file = final / "kernel.json"
    if meta_file.exists():
        return json.loads(meta_file.read_text())
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        raw = Path(tmp) / "raw"
        deb = apt_download_extract(f"linux-image-{version}-unsigned", raw)
        modroot = raw / "lib" / "modules" / version
        order = load_order(modroot, WANTED)
        index = module_index(modroot)
        out = Path(tmp) / "kernel"
        (out / "boot").mkdir(parents=True)
        (out / "modules").mkdir()
        for f in (raw / "boot").iterdir():
            shutil.copy2(f, out / "boot" / f.name)
        for name in order:
            shutil.copy2(index[name], out / "modules" / f"{name}.ko")
        meta = {
            "version": version,
            "package_version": deb_version(deb),
            "vmlinuz": f"boot/vmlinuz-{version}",
            "config": f"boot/config-{version}",
            "system_map": f"boot/System.map-{version}",
            "modules": order,
        }
        (out / "kernel.json").write_text(json.dumps(meta, indent=1))
        replace_dir(out, final)
    return meta


def config_has(kernel_dir: Path, version: str, option: str) -> str | None:
    """The value of a CONFIG_ option in the kernel's config (``y``, ``m``, a string), or None."""
    for line in (kernel_dir / "boot" / f"config-{version}").read_text().splitlines():
        if line.startswith(option + "="):
            return line.split("=", 1)[1]
    return None
