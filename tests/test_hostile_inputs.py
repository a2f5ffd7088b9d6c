"""Hostile evidence (issue 20): special files given as images, and a core without Python; each must
fail clearly, before anything is written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import zen


@pytest.mark.parametrize("kind", ["fifo", "chardev", "socket", "dir"])
def test_special_files_are_refused(kind, tmp_path):
    import socket

    path = tmp_path / "image"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "chardev":
        path = Path("/dev/zero")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
    else:
        path.mkdir()
    for cmd in (["info", path], ["recover", path, "-o", tmp_path / "case"], ["ps", path], ["objects", path, "--type", "dict"]):
        # a command blocked on the FIFO never returns: the subprocess timeout catches it (no wall-clock
        # assertion beside it: on a loaded machine zen's start alone can take seconds)
        res = zen(*cmd, check=False, timeout=120)
        assert res.returncode == 2, (cmd, res.stderr)
        assert "not a regular file" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "case").exists()


def test_failed_recovery_leaves_no_half_written_case(tmp_path):
    core = tmp_path / "not-python.core"
    # a real core of a process without Python: recovery fails (exit 3) after the case dir exists
    proc = subprocess.Popen(["sleep", "60"])
    try:
        zen("acquire", "--pid", proc.pid, "-o", core)
    finally:
        proc.kill()
        proc.wait()
    res = zen("recover", core, "-o", tmp_path / "case", check=False)
    assert res.returncode == 3, res.stderr
    assert not (tmp_path / "case").exists()
    assert stat.S_ISREG(core.stat().st_mode) and sys.executable
