"""Bad inputs give one clear error line, a non-zero exit code and never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import find_python, zen


def check_clean_failure(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr
    first = res.stderr.strip().splitlines()[0] if res.stderr.strip() else ""
    assert first.startswith("error:"), res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


def test_missing_file(tmp_path):
    check_clean_failure(zen("info", tmp_path / "nope.core", check=False), "image not found")


def test_directory(tmp_path):
    check_clean_failure(zen("info", tmp_path, check=False), "directory")


def test_not_elf(tmp_path):
    p = tmp_path / "text.core"
    p.write_text("hello, this is not a core file\n" * 10)
    check_clean_failure(zen("info", p, check=False), "not an ELF core file")


def test_random_bytes(tmp_path):
    p = tmp_path / "random.core"
    p.write_bytes(os.urandom(1 << 16))
    check_clean_failure(zen("info", p, check=False), "not an ELF")


def test_elf_but_not_core():
    check_clean_failure(zen("info", sys.executable, check=False), "not a core dump")


def test_corrupt_headers(tmp_path):
    p = tmp_path / "corrupt.core"
    data = bytearray(open(sys.executable, "rb").read(4096))
    data[16] = 4  # e_type = ET_CORE, but the program headers are an executable's
    data[32:40] = (10**9).to_bytes(8, "little")  # e_phoff far beyond the end
    p.write_bytes(bytes(data))
    check_clean_failure(zen("info", p, check=False), "truncated")


def test_truncated_core(light_target, tmp_path):
    full = tmp_path / "t.core"
    zen("acquire", "--pid", light_target.pid, "-o", full, "--lean")
    cut = tmp_path / "cut.core"
    with open(full, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(full.stat().st_size // 3))
    full.unlink()
    res = zen("info", cut, "--no-census", check=False)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert "truncated" in res.stderr


def test_non_python_process(tmp_path):
    proc = subprocess.Popen(["sleep", "300"])
    try:
        time.sleep(0.2)
        img = tmp_path / "sleep.core"
        zen("acquire", "--pid", proc.pid, "-o", img, "--lean")
        check_clean_failure(zen("info", img, check=False), "no CPython interpreter found")
        assert zen("info", img, check=False).returncode == 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_unknown_pid():
    check_clean_failure(zen("info", "--pid", "4194000", check=False), "no process with PID")


def test_no_arguments():
    res = zen("info", check=False)
    check_clean_failure(res, "give an image file or --pid")


@pytest.mark.skipif(find_python("3.7") is None, reason="no CPython 3.7 interpreter on this machine")
def test_unsupported_python_names_version_and_what_is_supported(tmp_path):
    """zen has no profile for 3.7 (code objects without positional-only arguments, other frame and
    thread-state layouts): refused with exit 4, naming the version and what is supported, even with
    no profiles at all."""
    exe = find_python("3.7")
    proc = subprocess.Popen([exe, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.5)
        img = tmp_path / "py37.core"
        zen("acquire", "--pid", proc.pid, "-o", img, "--lean")
        env_dir = tmp_path / "noprofiles"
        env_dir.mkdir()
        res = subprocess.run(
            [sys.executable, "-m", "zen", "info", str(img)],
            capture_output=True,
            text=True,
            env={**os.environ, "ZEN_PROFILE_DIR": str(env_dir), "COLUMNS": "200"},
        )
        # the exact release, from the sys.version banner in the interpreter's data
        check_clean_failure(res, "is not supported: zen reads images of CPython 3.8 to 3.14", "version table")
        assert "CPython 3.7." in res.stderr
        assert res.returncode == 4
    finally:
        proc.kill()
        proc.wait()


def test_outputs_never_create_missing_directories(tmp_path):
    """Every command that writes checks its output's parent first (issue 37: `zen report -o /nonexistent-dir/r.html`
    made a directory at the filesystem root)."""
    missing = tmp_path / "no-such-dir"
    img = tmp_path / "x.core"
    img.write_bytes(b"\x7fELF" + b"\0" * 60)
    case = tmp_path / "case"
    case.mkdir()
    for args in (["report", case, "-o", missing / "r.html"], ["recover", img, "-o", missing / "case"],
                 ["reuse", case, "-o", missing / "pkg"], ["diff", case, "--base", "b", "-o", missing / "p.json"],
                 ["decompile", img, "-o", missing / "pkg"], ["acquire", "--pid", os.getpid(), "-o", missing / "i.core"],
                 ["symbols", "--btf", img, "-o", missing / "s.json.xz"], ["keygen", "-o", missing / "key"],
                 ["library", "export", "-o", missing / "l.json"], ["drift", case, case, "-o", missing / "d"],
                 ["profile", "python", "-o", missing / "p.json"]):  # fmt: skip
        res = zen(*args, check=False)
        check_clean_failure(res, "does not exist", "mkdir -p")
        assert res.returncode == 2, (args[0], res.returncode)
        assert not missing.exists(), args[0]
        assert not res.stderr.startswith("\n"), args[0]  # no blank line before the error (progress bars are off)


def test_demo_refuses_a_directory_that_is_not_a_previous_demo(tmp_path):
    (tmp_path / "mine.txt").write_text("not a demo")
    res = zen("demo", "--dir", tmp_path, check=False)
    check_clean_failure(res, "not a previous demo's directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_attribute_reports_a_bad_case_before_the_library(tmp_path):
    """`zen attribute` names what is wrong with the case first, whatever the library (a missing file, an
    unreachable server, a real one), as it did before the library was opened ahead of the check."""
    for lib in (tmp_path / "none.sqlite", "http://127.0.0.1:9"):
        r = zen("attribute", tmp_path, "--library", lib, check=False, timeout=120)
        assert r.returncode == 2 and "is not a zen case" in r.stderr and "Traceback" not in r.stderr, r.stderr
