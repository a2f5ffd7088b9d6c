"""LiME: acquire images with ``lime.ko`` (built by lime_build.py) and read LiME's range headers.

LiME is what investigators actually run on a live Linux box, so zen must read its output as
produced, not a synthetic imitation.  The module is built against Debian's own headers for the
exact guest kernel (vermagic and symbol CRCs must match), unpacked into a private root: the headers'
Makefile ``include``s the common headers by an absolute /usr/src path, which is rewritten; the
kbuild symlinks are relative and resolve inside the private root unchanged.

Acquisition methods (``Guest(lime=...)``): "disk" writes to a virtio raw disk (/dev/vda) that the
host then truncates to LiME's length; "tcp" serves the image on guest port 4444, forwarded to a
loopback-only host port; "share" writes a file straight into the 9p share.  ``timeout=0`` is always
passed: LiME's default (1000 ms) silently zero-fills the rest of a range when one page write is
slow, which happens under TCG.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import time
from pathlib import Path
from typing import Any

from .cache import GuestError

Guest = Any  # a running guest (guest.Guest, which calls `acquire`): not imported, guest.py depends on this module
LIME_MAGIC = 0x4C694D45
HEADER = struct.Struct("<IIQQ8s")  # magic, version, s_addr, e_addr (inclusive), reserved
FORMATS = ("lime", "padded", "raw")


def lime_ranges(path: Path) -> tuple[list[tuple[int, int, int]], int]:
    """Walk a LiME-format file: ([(s_addr, e_addr, header offset)...], end of the last range's
    data).  Stops at the first non-header, so a disk holding an image plus old bytes is fine."""
    ranges = []
    with open(path, "rb") as f:
        off = 0
        while True:
            f.seek(off)
            raw = f.read(HEADER.size)
            if len(raw) < HEADER.size:
                break
            magic, ver, s, e, _ = HEADER.unpack(raw)
            if magic != LIME_MAGIC or ver != 1 or e < s:
                break
            ranges.append((s, e, off))
            off += HEADER.size + (e - s + 1)
    return ranges, off


def system_ram(guest: Guest) -> list[tuple[int, int]]:
    """The guest's top-level "System RAM" ranges from /proc/iomem (what LiME walks)."""
    out = []
    for line in guest.run("cat /proc/iomem").splitlines():
        if not line.startswith(" ") and line.rstrip().endswith(": System RAM"):
            lo, hi = line.split(":")[0].strip().split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def expected_length(fmt: str, ram: list[tuple[int, int]]) -> int:
    """Bytes LiME writes for ``fmt`` over these ranges (for the formats without headers)."""
    if fmt == "raw":
        return sum(e - s + 1 for s, e in ram)
    if fmt == "padded":
        return max(e for _, e in ram) + 1
    return sum(e - s + 1 + HEADER.size for s, e in ram)


def _truncate_copy(src: Path, dst: Path, length: int) -> None:
    with open(src, "rb") as i, open(dst, "wb") as o:
        left = length
        while left:
            chunk = i.read(min(left, 16 << 20))
            if not chunk:
                raise GuestError(f"{src} is shorter than LiME's {length} bytes")
            o.write(chunk)
            left -= len(chunk)


def acquire(guest: Guest, dest: Path, fmt: str = "lime", timeout: float = 3600) -> None:
    """Run LiME in the guest with the method chosen at boot, leave the image at ``dest``."""
    if fmt not in FORMATS:
        raise GuestError(f"LiME format must be one of {FORMATS}")
    ko = guest.assets.lime_ko
    if ko is None:
        raise GuestError("no lime.ko: build_kernel_assets(..., lime=True)")
    method = guest.lime or "share"
    shutil.copy2(ko, guest.ctl / "lime.ko")
    ram = system_ram(guest)
    dest = Path(dest)
    dest.unlink(missing_ok=True)
    mod = '"$CTL/lime.ko"'
    opts = f"format={fmt} timeout=0"
    if method == "disk":
        if guest.disk is None:
            raise GuestError("Guest was not booted with lime='disk'")
        guest.run(f'insmod {mod} "path=/dev/vda {opts}" && sync && rmmod lime', timeout=timeout)
        length = lime_ranges(guest.disk)[1] if fmt == "lime" else expected_length(fmt, ram)
        _truncate_copy(guest.disk, dest, length)
    elif method == "share":
        out = guest.share / "lime.out"
        out.unlink(missing_ok=True)
        guest.run(f'insmod {mod} "path=$R$SHARE/lime.out {opts}" && rmmod lime', timeout=timeout)
        os.replace(out, dest)
    elif method == "tcp":
        if guest.port is None:
            raise GuestError("Guest was not booted with lime='tcp'")
        guest.run("ip link set lo up; ip addr add 10.0.2.15/24 dev eth0 2>/dev/null; ip link set eth0 up")
        # insmod blocks until the transfer ends: start it in the background, then connect
        guest.run(f'(insmod {mod} "path=tcp:4444 {opts}"; echo $? > "$CTL/lime.rc"; rmmod lime) > "$CTL/lime.log" 2>&1 &')
        _receive(guest, dest, timeout)
        guest.wait_for(guest.ctl / "lime.rc", 120)
    else:
        raise GuestError(f"unknown LiME method {method!r}")
    dest.chmod(0o644)  # LiME creates its file 0444
    want = expected_length(fmt, ram)
    got = dest.stat().st_size
    if got != want:
        raise GuestError(f"LiME {method}/{fmt} image has {got} bytes, expected {want} (iomem {ram})")


def _receive(guest: Guest, dest: Path, timeout: float) -> None:
    """Connect to the forwarded port until LiME listens (slirp accepts and then drops early
    connections), then stream to EOF."""
    deadline = time.monotonic() + timeout
    assert guest.port is not None
    while True:
        guest._vm().check()
        if time.monotonic() > deadline:
            raise GuestError(f"LiME over TCP did not complete in {timeout}s")
        try:
            with socket.create_connection(("127.0.0.1", guest.port), timeout=30) as s, open(dest, "wb") as out:
                s.settimeout(600)  # TCG can stall; a short timeout would drop a live transfer
                got = 0
                while True:
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    got += len(chunk)
            if got:
                return
        except (ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(1)
