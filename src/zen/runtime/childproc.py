"""Child Python processes started by zen, isolated from the directory they are started in.

Investigators run zen where the evidence lies, and evidence is hostile: a `depyf.py`, `numpy.py`
or `sitecustomize.py` planted in the working directory must never be imported. A child started as
`python -m mod` or `python -c code` puts the working directory first on `sys.path`, and `PYTHONPATH`
or `PYTHONSTARTUP` may name it too. So every child interpreter zen starts (depyf, TVM probing, the
Keras verifier, the demo's and recipes' model processes, calibrators) goes through this module:

- `-I` (isolated mode): no working directory or script directory on `sys.path`, no `PYTHON*`
  environment variables, no user site-packages; supported by every CPython zen reads (3.8+);
- a small boot line puts back only what the child needs, as absolute paths: zen's own source root
  (so a foreign interpreter, such as the TensorFlow or TVM environment's, finds zen's modules) and
  the entries of the caller's `PYTHONPATH` (where a base model's code or a source-built TVM lives),
  never an empty entry (the working directory);
- the child's working directory is a fresh empty directory zen made, removed afterwards.

Stdlib only: calibrators and verifiers import this from interpreters without zen's dependencies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

# argv[1]: sys.path additions (os.pathsep-joined); argv[2]: "m" (module), "c" (code) or "f" (file);
# argv[3]: the module name, code or file path; the rest becomes the child's sys.argv[1:]. Code and
# files run in the real __main__ module's namespace, as `python -c`/`python FILE` would run them.
_BOOT = (
    "def _zen_boot():\n"
    "    import sys\n"
    "    g = sys.modules['__main__'].__dict__\n"
    "    del g['_zen_boot']\n"
    f"    path = [q for q in sys.argv[1].split({os.pathsep!r}) if q]\n"
    "    sys.path[0:0] = [q for q in path if q not in sys.path]\n"
    "    kind, what = sys.argv[2], sys.argv[3]\n"
    "    sys.argv = ['-c' if kind == 'c' else what] + sys.argv[4:]\n"
    "    if kind == 'm':\n"
    "        import runpy\n"
    "        runpy.run_module(what, run_name='__main__', alter_sys=True)\n"
    "        return compile('', '<zen child>', 'exec')\n"
    "    if kind == 'f':\n"
    "        g['__file__'] = what\n"
    "        with open(what, 'rb') as f:\n"
    "            return compile(f.read(), what, 'exec')\n"
    "    return compile(what, '<string>', 'exec')\n"
    "exec(_zen_boot(), __import__('sys').modules['__main__'].__dict__)\n"
)


def zen_root() -> str:
    """The directory holding the `zen` package this process runs (a source tree or site-packages)."""
    return str(Path(__file__).resolve().parents[2])


def forwarded_pythonpath(env: dict[str, str] | None = None) -> list[str]:
    """The caller's PYTHONPATH entries as absolute paths; empty entries (= the working directory) dropped.

    A relative entry is the user's explicit choice and is kept, resolved once here, so the child's
    own working directory never matters."""
    raw = (os.environ if env is None else env).get("PYTHONPATH", "")
    return [str(Path(p).resolve()) for p in raw.split(os.pathsep) if p.strip()]


def child_path(extra: Sequence[str | os.PathLike] = (), with_pythonpath: bool = True) -> list[str]:
    """sys.path entries a child gets in front of its own: `extra`, zen's root, then PYTHONPATH's."""
    paths = [str(Path(p).resolve()) for p in extra] + [zen_root()]
    if with_pythonpath:
        paths += forwarded_pythonpath()
    seen: list[str] = []
    for p in paths:
        if p not in seen:
            seen.append(p)
    return seen


def module_argv(module: str, args: Sequence[str] = (), *, python: str | None = None,
                extra_path: Sequence[str | os.PathLike] = (), with_pythonpath: bool = True) -> list[str]:  # fmt: skip
    """argv running `python -m module args...` in isolated mode with zen (and PYTHONPATH) importable."""
    return _argv("m", module, args, python, extra_path, with_pythonpath)


def code_argv(code: str, args: Sequence[str] = (), *, python: str | None = None,
              extra_path: Sequence[str | os.PathLike] = (), with_pythonpath: bool = True) -> list[str]:  # fmt: skip
    """argv running `python -c code args...` in isolated mode (sys.argv[1:] of the code is `args`)."""
    return _argv("c", code, args, python, extra_path, with_pythonpath)


def script_argv(script: str | os.PathLike, args: Sequence[str] = (), *, python: str | None = None,
                extra_path: Sequence[str | os.PathLike] = (), with_pythonpath: bool = True) -> list[str]:  # fmt: skip
    """argv running a script file in isolated mode (its own directory is *not* put on sys.path)."""
    return _argv("f", str(Path(script).resolve()), args, python, extra_path, with_pythonpath)


def _argv(kind: str, what: str, args: Sequence[str], python: str | None, extra_path: Sequence[str | os.PathLike],
          with_pythonpath: bool) -> list[str]:  # fmt: skip
    path = os.pathsep.join(child_path(extra_path, with_pythonpath))
    return [python or sys.executable, "-I", "-c", _BOOT, path, kind, what, *map(str, args)]


@contextlib.contextmanager
def scratch_cwd() -> Iterator[str]:
    """A fresh, empty, private directory for a child's working directory; removed afterwards."""
    d = tempfile.mkdtemp(prefix="zen-child-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in a scratch working directory (unless the caller names one zen controls). Text output is
    decoded leniently: a child's error message may quote bytes of the evidence (TVM's, on a damaged library,
    did), and a strict decode turned that message into an internal error."""
    if (kwargs.get("text") or kwargs.get("universal_newlines")) and "errors" not in kwargs:
        kwargs["errors"] = "backslashreplace"
    if kwargs.get("cwd") is not None:
        return subprocess.run(argv, **kwargs)
    with scratch_cwd() as cwd:
        return subprocess.run(argv, cwd=cwd, **kwargs)


class Started:
    """A child started now and answered later (`run`'s result, from `finish`): the caller does its own work while
    the child starts Python and does its part, on another core. Its scratch working directory lives until then."""

    def __init__(self, argv: list[str], **kwargs) -> None:
        if (kwargs.get("text") or kwargs.get("universal_newlines")) and "errors" not in kwargs:
            kwargs["errors"] = "backslashreplace"
        self._cwd = tempfile.mkdtemp(prefix="zen-child-")
        try:
            self.proc = subprocess.Popen(argv, cwd=self._cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
        except BaseException:
            shutil.rmtree(self._cwd, ignore_errors=True)
            raise

    def finish(self, timeout: float) -> subprocess.CompletedProcess:
        """Its output and exit status, as `run` gives them; subprocess.TimeoutExpired (the child killed) after
        `timeout` seconds."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except BaseException:
            self.cancel()
            raise
        self._clean()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def cancel(self) -> None:
        """Kill the child (its answer is not wanted) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError, ValueError):
            self.proc.communicate()
        self._clean()

    def _clean(self) -> None:
        shutil.rmtree(self._cwd, ignore_errors=True)


def stop_process(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """End a process zen started and serves through its stdin (a deployed model waiting for EOF): close its stdin,
    give it `grace` seconds to leave, then kill it; its pipes are closed either way."""
    if proc.poll() is None:
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(grace)
        except (subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
