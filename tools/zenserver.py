"""A real `zen serve` in a child process, for tests and benchmarks.

    with ZenServer(library_spec, "--public-read") as srv:   # started on a free loopback port
        httpx.get(srv.url + "/health")
    # stopped (SIGTERM, then SIGKILL if it lingers)

The child is started through zen.runtime.childproc (isolated mode, scratch working directory), as zen starts
every child interpreter; `--port 0` makes the server choose a free port and print its URL, which is
read from its first line of output. `kill9()` is what a crashed machine does to it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from zen.runtime import childproc


class ZenServer:
    def __init__(self, library: str | Path, *args: str, env: dict | None = None, start_timeout: float = 60) -> None:
        library = str(library) if "://" in str(library) else str(Path(library).resolve())  # the child runs elsewhere
        self.library, self.args, self.env, self.start_timeout = library, [str(a) for a in args], env, start_timeout
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log = Path(tempfile.mkstemp(prefix="zen-serve-", suffix=".log")[1])

    def start(self) -> ZenServer:
        argv = childproc.module_argv("zen", ["serve", "--library", self.library, "--port", "0", *self.args])
        self._cwd = tempfile.mkdtemp(prefix="zen-serve-cwd-")
        self._logfh = open(self.log, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._logfh, cwd=self._cwd,
                                     env={**os.environ, "COLUMNS": "1000", **(self.env or {})})  # fmt: skip
        line = self.proc.stdout.readline().decode(errors="replace")  # type: ignore[union-attr]
        m = re.search(r" at (https?://\S+) \(OpenAPI", line)
        if not m:
            self.kill9()
            raise RuntimeError(f"zen serve did not start: {line.strip()} {self.log.read_text()[-1500:]}")
        self.url = m.group(1)
        import threading

        threading.Thread(target=self._drain, daemon=True).start()  # whatever else it prints must not fill the pipe
        self._wait_ready()
        return self

    def _drain(self) -> None:
        for _ in iter(lambda: self.proc.stdout.read(65536), b""):  # type: ignore[union-attr]
            pass

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", verify=False, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:  # type: ignore[union-attr]
                break
            time.sleep(0.05)
        self.kill9()
        raise RuntimeError(f"zen serve at {self.url} never answered: {self.log.read_text()[-1500:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        self._reap()

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            try:
                self.proc.wait(15)  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                pass
        self.kill9()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
            self._logfh.close()
            import shutil

            shutil.rmtree(self._cwd, ignore_errors=True)

    def __enter__(self) -> ZenServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.log.unlink(missing_ok=True)
