"""Build LiME's ``lime.ko`` for a guest kernel from Debian packages (part of the guest's kernel assets).

The module is built against Debian's own headers for the exact guest kernel (vermagic and symbol CRCs must match),
unpacked into a private root: the headers' Makefile ``include``s the common headers by an absolute /usr/src path,
which is rewritten; the kbuild symlinks are relative and resolve inside the private root unchanged.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .cache import GuestError, apt_download_extract, apt_versions, cache_root, run


def build_lime(version: str, package_version: str) -> Path:
    """Build (once) ``<cache>/<version>/lime/lime.ko``; caller holds the cache lock."""
    final = cache_root() / version / "lime" / "lime.ko"
    if final.exists():
        return final
    abi = version.removesuffix("-amd64")
    kbuild = [v for v in apt_versions("linux-kbuild-6.1") if v == package_version]
    kbuild_spec = f"linux-kbuild-6.1={kbuild[0]}" if kbuild else "linux-kbuild-6.1"
    with tempfile.TemporaryDirectory(dir=cache_root() / version) as tmp:
        root = Path(tmp) / "root"
        for spec in (
            f"linux-headers-{version}={package_version}",
            f"linux-headers-{abi}-common={package_version}",
            kbuild_spec,
            "lime-forensics-dkms",
        ):
            apt_download_extract(spec, root)
        hdr = root / "usr" / "src" / f"linux-headers-{version}"
        mk = hdr / "Makefile"
        mk.write_text(mk.read_text().replace("/usr/src/", f"{root}/usr/src/"))
        srcs = sorted((root / "usr" / "src").glob("lime-forensics-*"))
        if not srcs:
            raise GuestError("lime-forensics-dkms has no source under /usr/src")
        src = Path(tmp) / "lime"
        shutil.copytree(srcs[-1], src)
        run(["make", "-C", str(hdr), f"M={src}", "modules"], timeout=900)
        run(["strip", "--strip-unneeded", str(src / "lime.ko")])
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / "lime.ko", final.with_suffix(".tmp"))
        os.replace(final.with_suffix(".tmp"), final)
    return final
