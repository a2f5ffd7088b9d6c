"""The on-disk cache for guest assets, its lock, and the apt helpers that fill it.

Everything a guest needs (a Debian kernel, its modules, an initramfs, LiME) is expensive to fetch
and build, and identical for every test run, so it lives under ``~/.cache/zen/guest/`` keyed by the
kernel's ABI version (``6.1.0-50-amd64``).  Two test processes may ask for the same assets at once,
so every build step holds an exclusive ``flock`` on ``<cache>/.lock`` (cheap: a build is
needed once per machine) and publishes its results by atomic rename, so a reader never sees a half
written file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

KERNEL_ENV = "ZEN_GUEST_KERNEL"
CACHE_ENV = "ZEN_GUEST_CACHE"


class GuestError(RuntimeError):
    """Anything that stops a guest from being built, booted or read; the message says what to do."""


def cache_root() -> Path:
    """The cache directory (``$ZEN_GUEST_CACHE`` or ``~/.cache/zen/guest``), created on demand."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "zen" / "guest")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def locked(name: str = ".lock") -> Iterator[None]:
    """Hold the cache's exclusive lock: builds are serialised across processes, not just threads."""
    path = cache_root() / name
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 1800) -> str:
    """Run a host tool, returning stdout; failures raise GuestError with the tool's stderr."""
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise GuestError(f"{cmd[0]} is not installed: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise GuestError(f"{' '.join(cmd)} timed out after {timeout}s") from e
    if p.returncode:
        raise GuestError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


_UPDATED = False


def _apt_knows(pkg: str) -> bool:
    out = subprocess.run(["apt-cache", "policy", pkg], capture_output=True, text=True).stdout
    return "Candidate:" in out and "Candidate: (none)" not in out


def apt_ensure_index(pkg: str) -> None:
    """Run ``apt-get update`` once per process when apt's index does not know ``pkg`` (fresh image)."""
    global _UPDATED
    if _apt_knows(pkg) or _UPDATED:
        return
    _UPDATED = True
    run(["apt-get", "update", "-q"], timeout=900)
    if not _apt_knows(pkg):
        raise GuestError(f"apt knows no package {pkg} even after apt-get update")


def apt_versions(pkg: str) -> list[str]:
    """Versions of ``pkg`` apt can download, best first (``apt-cache madison`` order)."""
    apt_ensure_index(pkg)
    out = run(["apt-cache", "madison", pkg])
    return [line.split("|")[1].strip() for line in out.splitlines() if line.count("|") >= 2]


def apt_download_extract(pkg_spec: str, dest: Path) -> Path:
    """``apt-get download`` one package (``name`` or ``name=version``) and ``dpkg-deb -x`` it into dest.

    Returns the .deb's path (kept in ``<cache>/debs`` so a rebuild needs no network)."""
    debs = cache_root() / "debs"
    debs.mkdir(exist_ok=True)
    name, _, version = pkg_spec.partition("=")
    ver_glob = version.replace(":", "%3a") if version else "*"
    found = sorted(debs.glob(f"{name}_{ver_glob}_*.deb"))
    if not found:
        apt_ensure_index(name)
        with tempfile.TemporaryDirectory(dir=debs) as tmp:
            run(["apt-get", "download", "-q", pkg_spec], cwd=Path(tmp), timeout=1800)
            for f in Path(tmp).glob("*.deb"):
                os.replace(f, debs / f.name)
        found = sorted(debs.glob(f"{name}_{ver_glob}_*.deb"))
        if not found:
            raise GuestError(f"apt-get download {pkg_spec} produced no .deb")
    dest.mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", str(found[-1]), str(dest)])
    return found[-1]


def deb_version(deb: Path) -> str:
    """The Version field of a .deb."""
    return run(["dpkg-deb", "-f", str(deb), "Version"]).strip()


_ABI = re.compile(r"^linux-image-(6\.1\.0-(\d+)-amd64)-unsigned$")


def available_kernels() -> list[str]:
    """Generic-flavour Debian 6.1 kernels apt offers (``6.1.0-NN-amd64``), newest ABI first.

    The cloud flavour is excluded on purpose: it is built without 9p, which the guest needs."""
    apt_ensure_index("linux-image-6.1.0-50-amd64-unsigned")
    out = run(["apt-cache", "search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$"])
    found = []
    for line in out.splitlines():
        m = _ABI.match(line.split(" - ")[0].strip())
        if m:
            found.append((int(m.group(2)), m.group(1)))
    return [v for _, v in sorted(found, reverse=True)]


def cached_kernels() -> list[str]:
    """Kernel versions whose assets are complete in the cache, newest ABI first."""
    root = cache_root()
    vers = [p.name for p in root.glob("6.1.0-*-amd64") if (p / "assets.json").exists()]
    return sorted(vers, key=lambda v: int(v.split("-")[1]), reverse=True)


def normalise_version(version: str) -> str:
    """Accept ``50``, ``6.1.0-50`` or ``6.1.0-50-amd64`` and return ``6.1.0-50-amd64``."""
    v = version.strip()
    if v.isdigit():
        v = f"6.1.0-{v}"
    if not v.endswith("-amd64"):
        v += "-amd64"
    if not re.fullmatch(r"6\.1\.0-\d+-amd64", v):
        raise GuestError(f"unsupported kernel version {version!r} (want e.g. 6.1.0-50-amd64)")
    return v


def choose_kernel(version: str | None) -> str:
    """The kernel to use: an explicit pin, else ``$ZEN_GUEST_KERNEL``, else the newest already
    cached (so a new Debian upload does not force a rebuild mid-project), else the newest apt has."""
    if version:
        return normalise_version(version)
    if os.environ.get(KERNEL_ENV):
        return normalise_version(os.environ[KERNEL_ENV])
    cached = cached_kernels()
    if cached:
        return cached[0]
    avail = available_kernels()
    if not avail:
        raise GuestError("apt offers no linux-image-6.1.0-*-amd64-unsigned package")
    return avail[0]


def replace_dir(tmp: Path, final: Path) -> None:
    """Publish a finished build directory in place of any older one."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
