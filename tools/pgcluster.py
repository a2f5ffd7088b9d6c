"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb in a temp dir, one port on loopback.

    with PgCluster(tmpdir) as pg:          # initdb + pg_ctl start (a few seconds)
        url = pg.create_db("lib")          # postgresql://zen@127.0.0.1:PORT/lib
    # stopped and removed

The server binaries are found on PATH or under /usr/lib/postgresql/*/bin (Debian puts them there);
`bindir()` is None without them (tests skip, saying so). PostgreSQL refuses to run as root, so as
root the cluster runs as the unprivileged `nobody` user (its files in a directory handed to it).
Authentication is `trust` on 127.0.0.1 only; fsync is off (a scratch cluster: a crash of the
machine, not of a client or server process, would lose it). Nothing here is zen's own code path:
zen talks to this cluster exactly as to a team's server, by URL.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres (highest version), or None."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent

    def version(p: str) -> int:
        v = p.split("/")[4]
        return int(v) if v.isdigit() else 0

    cands = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    return Path(cands[-1]).parent if cands else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    def __init__(self, where: Path | None = None, *, user: str = "zen") -> None:
        self.bin = bindir()
        if self.bin is None:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found")
        self.own_dir = where is None
        self.root = Path(where or tempfile.mkdtemp(prefix="zen-pg-"))
        self.data, self.sock = self.root / "data", self.root / "sock"
        self.user, self.port = user, 0
        self.os_user = "nobody" if os.geteuid() == 0 else None

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              user=self.os_user, cwd=self.root, env={**os.environ, "LC_ALL": "C"})  # fmt: skip

    def start(self) -> PgCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        if self.os_user:
            ent = pwd.getpwnam(self.os_user)
            for p in (self.root, self.sock):
                os.chown(p, ent.pw_uid, ent.pw_gid)
        res = self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed: {res.stderr.strip()[-800:]}")
        for _ in range(5):
            self.port = free_port()
            opts = (f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
                    "-c full_page_writes=off -c max_connections=200")  # fmt: skip
            log = str(self.root / "server.log")
            res = self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", opts, "-w", "-t", "60", "start")
            if res.returncode == 0:
                return self
            time.sleep(0.5)
        raise RuntimeError(f"PostgreSQL did not start: {(self.root / 'server.log').read_text()[-800:]}")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.port:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.port = 0
        if self.own_dir:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            shutil.rmtree(self.data, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
