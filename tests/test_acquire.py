"""Acquisition: zen's ELF cores against the live process they were taken from, and gdb."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import zen

from zen.acquire.process import acquire
from zen.memory import open_space
from zen.memory.live import process_state, read_maps, thread_ids
from zen.runtime.errors import ProcessError, ZenError


@pytest.fixture(scope="module")
def full_image(light_target, workdir):
    path = workdir / "light-all.core"
    maps = read_maps(light_target.pid)
    res = zen("acquire", "--pid", light_target.pid, "-o", path)
    yield path, maps, res
    path.unlink(missing_ok=True)


def test_regions_match_proc_maps(full_image, light_target):
    path, maps, _ = full_image
    with open_space(path) as space:
        got = [(r.start, r.end, r.perms[:3], r.path) for r in space.regions]
        want = [(r.start, r.end, r.perms[:3], r.path) for r in maps]
        assert got == want
        assert space.info.producer == "zen"
        assert space.info.acquisition["pid"] == light_target.pid
        assert len(space.info.threads) == len(thread_ids(light_target.pid))
        files = {(f.start, f.end, f.offset, f.path) for f in space.info.files}
        assert files == {(r.start, r.end, r.offset, r.path) for r in maps if r.file_backed}
        # bytes of a writable mapping equal the live process's (it is idle, waiting on stdin)
        heap = next(r for r in maps if r.path == "[heap]")
        with open_space(pid=light_target.pid) as live:
            assert space.read(heap.start, 4096) == live.read(heap.start, 4096)


def test_process_resumed(full_image, light_target):
    assert process_state(light_target.pid) != "T"


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
def test_gdb_opens_core(full_image):
    path, maps, _ = full_image
    res = subprocess.run(
        ["gdb", "-batch", "-nx", "-ex", "info proc mappings", sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "Start Addr" in res.stdout
    lib = next(r for r in maps if r.file_backed)
    assert f"{lib.start:#x}" in res.stdout


def test_lean_is_smaller_and_complete_after_fill(light_target, workdir, full_image):
    lean = workdir / "light-lean.core"
    zen("acquire", "--pid", light_target.pid, "-o", lean, "--lean")
    try:
        assert lean.stat().st_size < full_image[0].stat().st_size
        with open_space(lean) as space, open_space(full_image[0]) as full:
            assert not space.problems
            assert space.notes and "read from the mapped files" in space.notes[0]
            for r in full.regions:
                if r.file_backed and not r.writable and full.is_readable(r.start, r.size):
                    assert space.read(r.start, min(r.size, 1 << 16)) == full.read(r.start, min(r.size, 1 << 16)), r.path
    finally:
        lean.unlink(missing_ok=True)


def test_interrupted_acquire_resumes_target(light_target, workdir):
    out = workdir / "interrupted.core"

    def boom(done, total):
        assert process_state(light_target.pid) == "T"  # stopped while being read
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        acquire(light_target.pid, out, progress=boom)
    assert process_state(light_target.pid) != "T"
    out.unlink(missing_ok=True)


def test_acquire_errors(tmp_path):
    with pytest.raises(ProcessError, match="no process"):
        acquire(2**22 + 12345, tmp_path / "x.core")
    with pytest.raises(ProcessError, match="own process"):
        acquire(os.getpid(), tmp_path / "x.core")
    with pytest.raises(ZenError, match="does not exist"):
        acquire(os.getppid(), tmp_path / "missing-dir" / "x.core")


def test_interrupted_acquire_leaves_nothing_and_says_so(tmp_path):
    """Issue 51: Ctrl-C during `zen acquire` exited 130 with nothing printed and left a partial image at the output
    path, which a later reader took for evidence. Now the image is written as OUTPUT.partial and renamed when whole:
    interrupted, nothing is left at either name, and one line says what was interrupted and what was left."""
    import signal
    import subprocess
    import sys
    import time

    target = subprocess.Popen([sys.executable, "-c", "x = bytearray(3 << 30)\nfor i in range(0, len(x), 4096): x[i] = 1\n"
                               "print('READY', flush=True)\ninput()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert target.stdout.readline().strip() == "READY"
        out = tmp_path / "big.core"
        zen_proc = subprocess.Popen([sys.executable, "-m", "zen", "acquire", "--pid", str(target.pid), "-o", str(out)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        deadline = time.monotonic() + 60
        partial = tmp_path / "big.core.partial"
        while not partial.exists() and time.monotonic() < deadline and zen_proc.poll() is None:
            time.sleep(0.02)
        assert partial.exists(), "the image was not being written under its temporary name"
        time.sleep(0.3)
        zen_proc.send_signal(signal.SIGINT)
        _, err = zen_proc.communicate(timeout=120)
        assert zen_proc.returncode == 130 and "interrupted: zen acquire" in err and "Traceback" not in err, err[-1000:]
        assert not out.exists() and not partial.exists()
    finally:
        target.kill()


def test_an_existing_image_is_not_replaced_without_force(light_target, tmp_path):
    """Issue 51: an image already written is evidence (someone may have hashed and cited it): `zen acquire` refuses
    to write over it (exit 2, file unchanged, one line naming it) unless --force."""
    img = tmp_path / "x.core"
    img.write_bytes(b"evidence")
    res = zen("acquire", "--pid", light_target.pid, "-o", img, "--lean", check=False)
    assert res.returncode == 2 and "already exists" in res.stderr and "--force" in res.stderr, res.stderr
    assert img.read_bytes() == b"evidence" and "Traceback" not in res.stderr
    zen("acquire", "--pid", light_target.pid, "-o", img, "--lean", "--force")
    assert img.read_bytes()[:4] == b"\x7fELF"
