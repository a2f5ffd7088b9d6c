"""``build_kernel_assets``: the cached, ready-to-boot files for one kernel version.

Cache layout (``~/.cache/zen/guest/``)::

    debs/                       downloaded .deb files (a rebuild needs no network)
    accel.json                  KVM/TCG verdict per host kernel + guest kernel
    6.1.0-50-amd64/
        kernel/boot/            vmlinuz-*, config-*, System.map-* (vmlinuz carries the BTF)
        kernel/modules/*.ko     only the modules the guest loads
        kernel/kernel.json      version, package version, module load order
        initramfs.img           gzip'd newc cpio (busybox, modules, /init)
        lime/lime.ko            LiME built against this kernel's headers (on request)
        assets.json             marker written last: the assets are complete
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_root, choose_kernel, locked
from .initramfs import INIT, build_initramfs
from .kernel import fetch_kernel


@dataclass(frozen=True)
class KernelAssets:
    """Paths of one kernel's guest assets (all under the cache)."""

    version: str  # 6.1.0-50-amd64 (``uname -r`` in the guest)
    package_version: str  # 6.1.176-1 (Debian's version, part of the kernel banner)
    root: Path
    vmlinuz: Path
    config: Path
    system_map: Path
    initrd: Path
    modules: tuple[str, ...]
    lime_ko: Path | None = None


def _init_digest() -> str:
    """Fingerprint of the /init script and the busybox used: a changed init rebuilds the image."""
    h = hashlib.sha256(INIT.encode())
    h.update(str(Path("/bin/busybox").stat().st_size).encode())
    return h.hexdigest()[:16]


def build_kernel_assets(version: str | None = None, lime: bool = False) -> KernelAssets:
    """Download/build (once, under the cache lock) and return a kernel's guest assets.

    ``version``: ``6.1.0-50-amd64``, ``6.1.0-50`` or ``50``; None picks ``$ZEN_GUEST_KERNEL``,
    else the newest cached, else the newest apt offers.  ``lime=True`` also builds lime.ko
    (downloads the kernel headers and kbuild, ~1 min)."""
    ver = choose_kernel(version)
    root = cache_root() / ver
    with locked():
        meta = fetch_kernel(ver)
        initrd = root / "initramfs.img"
        stamp = root / "initramfs.stamp"
        digest = _init_digest()
        if not initrd.exists() or not stamp.exists() or stamp.read_text() != digest:
            build_initramfs(root / "kernel", meta["modules"], initrd)
            stamp.write_text(digest)
        lime_ko = None
        if lime:
            from .lime_build import build_lime

            lime_ko = build_lime(ver, meta["package_version"])
        elif (root / "lime" / "lime.ko").exists():
            lime_ko = root / "lime" / "lime.ko"
        (root / "assets.json").write_text(json.dumps({"version": ver, **meta}, indent=1))
    k = root / "kernel"
    return KernelAssets(
        version=ver,
        package_version=meta["package_version"],
        root=root,
        vmlinuz=k / meta["vmlinuz"],
        config=k / meta["config"],
        system_map=k / meta["system_map"],
        initrd=initrd,
        modules=tuple(meta["modules"]),
        lime_ko=lime_ko,
    )
