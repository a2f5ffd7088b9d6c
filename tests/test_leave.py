"""`zen.runtime.leave`: the command exits without freeing its objects, and nothing else about the exit changes.

Each case runs in its own interpreter, as the `zen` command does: the exit status, output still in the
buffers, atexit handlers, a non-daemon thread still working, and a forked child still running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "cmd.py"
    script.write_text("import atexit, os, sys, threading, time\nfrom zen.runtime.leave import run_and_leave\n" + body)
    return subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("exit_with", "status", "stderr"), [("None", 0, ""), ("0", 0, ""), ("5", 5, ""), ("70", 70, ""),
                                                             ("'bad thing'", 1, "bad thing\n")])  # fmt: skip
def test_exit_status_is_what_sys_exit_gives(exit_with, status, stderr, tmp_path):
    res = _run(f"def cmd():\n    raise SystemExit({exit_with})\nrun_and_leave(cmd)\n", tmp_path)
    assert res.returncode == status and res.stderr == stderr


def test_output_atexit_and_threads_are_finished_before_leaving(tmp_path):
    """A megabyte of buffered output arrives whole, atexit handlers run, a non-daemon thread still
    sleeping finishes its work first, and a command that returns exits 0."""
    body = (
        "out = sys.argv[1]\n"
        "atexit.register(lambda: open(os.path.join(out, 'atexit'), 'w').write('ran'))\n"
        "def late():\n    time.sleep(0.5)\n    open(os.path.join(out, 'thread'), 'w').write('done')\n"
        "def cmd():\n"
        "    threading.Thread(target=late).start()\n"
        "    sys.stdout.write('x' * 1_000_000)\n"
        "run_and_leave(cmd)\n"
    )
    res = _run(body, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "x" * 1_000_000
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"


def test_forked_children_still_running_are_stopped(tmp_path):
    """A `Forked` job whose result nobody asked for (an error path) does not outlive the command."""
    body = (
        "from zen.runtime.forking import Forked\n"
        "def slow():\n    time.sleep(60)\n    return b''\n"
        "job = Forked(slow, fork=True)\n"
        "open(os.path.join(sys.argv[1], 'pid'), 'w').write(str(job.pid))\n"
        "def cmd():\n    raise SystemExit(2)\n"
        "run_and_leave(cmd)\n"
    )
    res = _run(body, tmp_path)
    assert res.returncode == 2, res.stderr
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie left to init


def test_zen_command_output_and_status_unchanged(tmp_path):
    """Through the real entry point: a usage error, --help and a refused input keep their status and text."""
    zen = [sys.executable, "-m", "zen"]
    assert subprocess.run([*zen, "--help"], capture_output=True, text=True, timeout=120).returncode == 0
    res = subprocess.run([*zen, "show", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "error:" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*zen, "recover", "--bogus"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "No such option" in res.stderr


def test_json_output_is_the_text_rich_writes():
    """`--json` into a file or pipe is written without rich's highlighting pass: the same text rich writes, for
    strings that rich or JSON treat specially (markup, emoji codes, escapes, line separators, combining and
    zero-width characters, lone surrogates, non-finite numbers); a capture still goes through rich."""
    import io
    import json

    from rich.console import Console

    from zen.runtime.console import SafeConsole

    odd = {"markup": "[bold]x[/bold] :smile:", "escapes": "\t\r\n\x1b[31m\x7f\x85", "seps": "a\u2028b\u2029",
           "marks": "e\u0301\u200b漢字😀", "surrogate": "\ud800", "numbers": [1.5, -0.0, 1e300, float("nan"), float("inf")],
           "nested": {"empty": {}, "list": [], "none": None, "long": "x" * 500 + "   "}}  # fmt: skip
    for doc in (odd, [odd, odd], "plain", 3):
        text = json.dumps(doc)
        ours, theirs = io.StringIO(), io.StringIO()
        SafeConsole(highlight=False, file=ours).print_json(text)
        Console(highlight=False, file=theirs).print_json(text)
        assert ours.getvalue() == theirs.getvalue()
        c = SafeConsole(highlight=False, file=io.StringIO())
        with c.capture() as cap:
            c.print_json(text)
        assert cap.get() == theirs.getvalue()


def test_abandoned_object_is_held_frozen_and_replaced_only_in_the_command(tmp_path):
    """`abandon`: outside the command (a library caller) nothing is held; inside, the last object abandoned is
    held (never freed: its finalizer does not run) and out of the collector's sight, the one before it freed, and
    a cycle made after the freeze is still collected."""
    body = (
        "import gc, weakref\n"
        "from zen.runtime import leave\n"
        "out = sys.argv[1]\n"
        "class Big:\n    pass\n"
        "lib = Big()\n"
        "assert leave.abandon(lib) is False and leave._abandoned == []\n"
        "def cmd():\n"
        "    first, second = Big(), Big()\n"
        "    gone = weakref.ref(first)\n"
        "    fin = weakref.finalize(second, lambda: open(os.path.join(out, 'freed'), 'w').write('second'))\n"
        "    fin.atexit = False  # only if it is freed, not because the process ends\n"
        "    assert leave.abandon(first) is True and gc.get_freeze_count() > 0\n"
        "    assert leave.abandon(second) is True\n"
        "    del first, second\n"
        "    assert gone() is None, 'the object abandoned before the last is freed'\n"
        "    c = Big()\n"
        "    c.me = c\n"
        "    cyc = weakref.ref(c)\n"
        "    del c\n"
        "    gc.collect()\n"
        "    assert cyc() is None, 'garbage made after the freeze is collected'\n"
        "    open(os.path.join(out, 'ok'), 'w').write('ok')\n"
        "run_and_leave(cmd)\n"
    )
    res = _run(body, tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ok").exists() and not (tmp_path / "freed").exists()
