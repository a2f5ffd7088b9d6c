"""The guest-VM fixture tooling (tools/guestvm) without booting anything: its cpio writer, LiME
header walk and /proc-walk parser, which the real-guest tests rely on to build and read images."""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from guestvm.guest import parse_proc_walk  # noqa: E402
from guestvm.initramfs import Cpio  # noqa: E402
from guestvm.lime import HEADER, LIME_MAGIC, expected_length, lime_ranges  # noqa: E402


@pytest.mark.skipif(shutil.which("busybox") is None, reason="needs busybox's cpio to cross-check")
def test_cpio_newc_is_readable_by_cpio(tmp_path: Path) -> None:
    c = Cpio()
    c.dir("bin")
    c.file("bin/busybox", b"\x7fELF" + b"x" * 1001, 0o755)
    c.symlink("bin/sh", "busybox")
    c.file("init", b"#!/bin/sh\necho hi\n", 0o755)
    arc = tmp_path / "a.cpio"
    arc.write_bytes(c.finish())
    listing = subprocess.run(["busybox", "cpio", "-t"], stdin=open(arc, "rb"), capture_output=True, text=True)
    assert listing.stdout.split() == ["bin", "bin/busybox", "bin/sh", "init"]
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["busybox", "cpio", "-id"], stdin=open(arc, "rb"), cwd=out, check=True, capture_output=True)
    assert (out / "init").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert (out / "bin" / "sh").readlink() == Path("busybox")
    assert len(gzip.compress(arc.read_bytes())) > 0


def test_lime_header_walk_stops_at_first_non_header(tmp_path: Path) -> None:
    ranges = [(0x1000, 0x9FFFF), (0x100000, 0x12FFFF)]
    blob = b""
    for s, e in ranges:
        blob += HEADER.pack(LIME_MAGIC, 1, s, e, b"\0" * 8) + bytes([s & 0xFF]) * (e - s + 1)
    p = tmp_path / "disk"
    p.write_bytes(blob + b"\0" * 4096 + struct.pack("<I", LIME_MAGIC))  # disk tail: old bytes
    found, end = lime_ranges(p)
    assert [(s, e) for s, e, _ in found] == ranges
    assert end == len(blob) == expected_length("lime", ranges)
    assert expected_length("padded", ranges) == 0x130000
    assert expected_length("raw", ranges) == 0x9F000 + 0x30000


def test_proc_walk_parser_keeps_full_argv() -> None:
    text = (
        "@@PID 1\nName:\tinit\nState:\tS (sleeping)\nTgid:\t1\nPPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n"
        "CMDLINE 2f696e697400\n"
        "@@PID 2\nName:\tkthreadd\nState:\tS (sleeping)\nPPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nCMDLINE \n"
        "@@PID 113\nName:\tpython\nState:\tS (sleeping)\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\nGid:\t5\t5\t5\t5\n"
        "CMDLINE " + b"python\0a b\0\xff\0".hex() + "\n"
        "@@PID 9\n"  # exited between ls and read: no status lines
    )
    procs = parse_proc_walk(text)
    assert [p["pid"] for p in procs] == [1, 2, 113]
    assert procs[0]["cmdline"] == ["/init"] and procs[1]["cmdline"] == []
    assert procs[2] == {
        "pid": 113,
        "comm": "python",
        "state": "S",
        "ppid": 1,
        "uid": 1000,
        "gid": 5,
        "cmdline": ["python", "a b", "\ufffd"],
    }
