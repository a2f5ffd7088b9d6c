"""``Guest``: one booted VM running a host program, with the operations tests and benchmarks need.

The host and the guest's /init talk through ``SHARE/ctl`` (see initramfs.py): ``run()`` drops a
numbered script there and waits for its ``.done`` marker.  Every wait is bounded, checks that
QEMU is still alive, and fails with the tail of the serial log.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .assets import KernelAssets
from .cache import GuestError
from .qemu import VM, VMConfig, choose_accel

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Walk /proc with busybox builtins only: one block per task, the command line hex-encoded (it holds
# NULs and any byte).  busybox ps truncates and hides fields; this misses nothing.
PROC_WALK = r"""
for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ -r $d/status ] || continue
    echo "@@PID $p"
    grep -E '^(Name|Tgid|PPid|Uid|Gid|State):' $d/status
    printf 'CMDLINE '; od -An -v -tx1 $d/cmdline | tr -d ' \n'; echo
done
"""


def parse_proc_walk(text: str) -> list[dict[str, Any]]:
    """PROC_WALK output -> [{pid, ppid, uid, gid, comm, state, cmdline: [argv...]}] by pid."""
    procs: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        if line.startswith("@@PID "):
            cur = {"pid": int(line.split()[1]), "cmdline": []}
            procs.append(cur)
        elif cur is None:
            continue
        elif line.startswith("CMDLINE"):
            raw = bytes.fromhex(line[7:].strip())
            cur["cmdline"] = [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []
        elif ":" in line:
            k, _, v = line.partition(":")
            v = v.strip()
            if k == "Name":
                cur["comm"] = v
            elif k in ("Uid", "Gid"):
                cur[k.lower()] = int(v.split()[0])
            elif k == "PPid":
                cur["ppid"] = int(v)
            elif k == "State":
                cur["state"] = v.split()[0]
    return [p for p in procs if "comm" in p]


class Guest:
    """A booted guest.  ``with Guest(assets, share=..., workload=[...]) as g: ...``

    ``share``: host directory mounted writable at the same path in the guest (created; a temp dir
    if None).  ``workload``: argv run in a chroot of the host root, cwd ``cwd`` (default: the
    current directory), with ``env`` added to HOME=/root and a standard PATH, stdin open forever.
    ``lime``: prepare hardware for ``dump_lime``: "disk" (a virtio raw disk), "tcp" (user network
    with a loopback-only port forward) or "share" (write into the 9p share; needs nothing).
    """

    def __init__(
        self,
        assets: KernelAssets,
        memory_mib: int = 1536,
        share: Path | None = None,
        workload: list[str] | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        lime: str | None = None,
        accel: str | None = None,
        boot_timeout: float = 300,
        la57: bool = False,
    ) -> None:
        self.assets = assets
        self.memory_mib = memory_mib
        self._own_share = share is None
        self.share = Path(share or tempfile.mkdtemp(prefix="zen-share-")).resolve()
        self.workload = workload
        self.cwd = Path(cwd or Path.cwd()).resolve()
        self.env = dict(env or {})
        self.lime = lime
        self.accel = accel
        self.boot_timeout = boot_timeout
        self.la57 = la57  # TCG only: boot with 5-level page tables (as on LA57 hosts)
        self.ctl = self.share / "ctl"
        self.vm: VM | None = None
        self._seq = 0
        self.timings: dict[str, float] = {}
        self.disk: Path | None = None
        self.port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Guest:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> None:
        """Write the workload script, boot, and wait until /init is polling the share."""
        self.share.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.ctl, ignore_errors=True)
        self.ctl.mkdir()
        if self.workload:
            env = {"HOME": "/root", "PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **self.env}
            lines = ["cd " + shlex.quote(str(self.cwd)) + " || exit 111"]
            lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
            lines.append("exec " + shlex.join(self.workload))
            (self.ctl / "workload.sh").write_text("\n".join(lines) + "\n")
        accel = self.accel or choose_accel(self.assets.vmlinuz, self.assets.initrd, self.assets.version)
        workdir = Path(tempfile.mkdtemp(prefix="zen-vm-"))
        if self.lime == "disk":
            self.disk = workdir / "lime.disk"
            with open(self.disk, "wb") as f:  # sparse: RAM + headers + slack
                f.truncate((self.memory_mib + 64) << 20)
        elif self.lime == "tcp":
            self.port = _free_port()
        cfg = VMConfig(
            kernel=self.assets.vmlinuz,
            initrd=self.assets.initrd,
            share=self.share,
            memory_mib=self.memory_mib,
            accel=accel,
            disk=self.disk,
            hostfwd_port=self.port,
            la57=self.la57,
            expose=self._hidden_paths(),
            workdir=workdir,
        )
        t0 = time.monotonic()
        self.vm = VM(cfg)
        self.accel = accel
        self.wait_for(self.ctl / "ready", self.boot_timeout)
        self.timings["boot_s"] = time.monotonic() - t0

    def _hidden_paths(self) -> list[Path]:
        """The working directory and the workload's program when they lie under /tmp or /run,
        which the guest covers with its own tmpfs (a CI checkout under /tmp, say)."""
        hidden = ("/tmp/", "/run/")
        cands = [self.cwd]
        if self.workload:
            exe = Path(self.workload[0])
            cands.append(exe.parent.parent if exe.parent.name == "bin" else exe.parent)
        out: list[Path] = []
        for p in cands:
            p = Path(os.path.abspath(p))
            if str(p).startswith(hidden) and not any(str(p).startswith(str(q) + "/") or p == q for q in out):
                out.append(p)
        return out[:4]

    def shutdown(self, timeout: float = 30) -> None:
        """Power the guest off (QMP quit; killed if it lingers) and remove temporary files."""
        if self.vm is not None:
            self.vm.close(timeout=timeout)
            shutil.rmtree(self.vm.cfg.workdir, ignore_errors=True)
            self.vm = None
        if self._own_share:
            shutil.rmtree(self.share, ignore_errors=True)

    def _vm(self) -> VM:
        if self.vm is None:
            raise GuestError("the guest is not running")
        return self.vm

    @property
    def serial_log(self) -> Path:
        return self._vm().serial

    # -- waiting and running -------------------------------------------------------------------
    def wait_for(self, path: Path, timeout: float, contains: str | None = None) -> Path:
        """Wait until a file exists (host path, usually in the share) and, if ``contains`` is
        given, holds that text (e.g. a READY line: a file can exist before it is complete);
        fail early if the guest dies."""
        vm = self._vm()
        deadline = time.monotonic() + timeout
        path = Path(path)

        def done() -> bool:
            if not path.exists():
                return False
            return contains is None or contains in path.read_text(errors="replace")

        while not done():
            vm.check()
            if self.workload and (self.ctl / "workload.exited").exists() and not done():
                wl = self.ctl / "workload.log"
                tail = wl.read_text(errors="replace")[-3000:] if wl.exists() else ""
                raise GuestError(f"the workload exited before {path.name} appeared; its output:\n{tail}")
            if time.monotonic() > deadline:
                wl = self.ctl / "workload.log"
                extra = f"\n--- workload.log ---\n{wl.read_text(errors='replace')[-3000:]}" if wl.exists() else ""
                raise GuestError(f"timed out after {timeout}s waiting for {path}\n{vm.tail()}{extra}")
            time.sleep(0.5)
        return path

    def run(self, script: str, timeout: float = 120, check: bool = True) -> str:
        """Run a busybox sh script in the guest, outside the chroot (``$R`` is the host root's
        mount point, ``$SHARE`` the share's host path, ``$CTL`` the ctl dir); return its output."""
        self._seq += 1
        name = f"{self._seq:04d}"
        tmp = self.ctl / f"{name}.tmp"
        tmp.write_text(script if script.endswith("\n") else script + "\n")
        os.replace(tmp, self.ctl / f"{name}.sh")
        self.wait_for(self.ctl / f"{name}.done", timeout)
        out = (self.ctl / f"{name}.out").read_text(errors="replace")
        rc = int((self.ctl / f"{name}.rc").read_text().strip() or "0")
        for ext in (".run", ".out", ".rc", ".done"):
            (self.ctl / f"{name}{ext}").unlink(missing_ok=True)
        if check and rc:
            raise GuestError(f"guest script failed (rc {rc}):\n{script}\n--- output ---\n{out[-3000:]}")
        return out

    @property
    def workload_log(self) -> Path:
        """The workload's stdout+stderr (host path)."""
        return self.ctl / "workload.log"

    def workload_pid(self) -> int:
        """PID of the workload process (the chroot'd shell ``exec``s the program: same PID)."""
        return int(self.wait_for(self.ctl / "workload.pid", 60).read_text().strip())

    def processes(self) -> list[dict[str, Any]]:
        """Every task with pid, ppid, uid, gid, comm, state and full argv (a /proc walk), less
        the shell that ran the walk and its children (they are gone once the walk ends)."""
        procs = parse_proc_walk(self.run(PROC_WALK))
        walker = {
            p["pid"]
            for p in procs
            if any(a.startswith(str(self.ctl)) or "/ctl/" in a and a.endswith(".run") for a in p["cmdline"])
        }
        return [p for p in procs if p["pid"] not in walker and p.get("ppid") not in walker]

    def record(self, dest: Path | None = None) -> dict[str, Any]:
        """Save what comparisons against an image need into ``dest`` (default SHARE/guest):
        uname.json, version.txt (the banner), kallsyms.txt, processes.json, and for the
        workload maps.txt; returns the summary (also written as guest.json)."""
        dest = Path(dest or self.share / "guest")
        dest.mkdir(parents=True, exist_ok=True)
        uname = {k: self.run(f"uname -{k}").strip() for k in ("r", "v", "m", "n")}
        (dest / "uname.json").write_text(json.dumps(uname, indent=1))
        (dest / "version.txt").write_text(self.run("cat /proc/version"))
        (dest / "cmdline.txt").write_text(self.run("cat /proc/cmdline"))
        (dest / "kallsyms.txt").write_text(self.run("cat /proc/kallsyms", timeout=300))
        procs = self.processes()
        (dest / "processes.json").write_text(json.dumps(procs, indent=1))
        summary: dict[str, Any] = {
            "kernel": self.assets.version,
            "package_version": self.assets.package_version,
            "vmlinuz": str(self.assets.vmlinuz),
            "uname": uname,
            "memory_mib": self.memory_mib,
            "accel": self.accel,
            "processes": len(procs),
        }
        if self.workload:
            pid = self.workload_pid()
            if not any(p["pid"] == pid for p in procs):
                raise GuestError(
                    f"the workload (pid {pid}) is not running; its output:\n"
                    f"{self.workload_log.read_text(errors='replace')[-3000:]}"
                )
            # read inside the chroot: mapped files then show host paths, as in the process's view
            (dest / "maps.txt").write_text(self.run(f"chroot $R /bin/cat /proc/{pid}/maps"))
            summary["workload_pid"] = pid
            summary["workload"] = self.workload
        (dest / "guest.json").write_text(json.dumps(summary, indent=1))
        return summary

    # -- memory images -------------------------------------------------------------------------
    def paused(self) -> Any:
        """``with g.paused(): g.dump_elf(a); g.dump_raw(b)`` gives two images of one instant."""
        return self._vm().paused()

    def dump_elf(self, path: Path, timeout: float = 1800) -> float:
        """QEMU ELF dump (``dump-guest-memory``); returns seconds taken."""
        t0 = time.monotonic()
        self._vm().dump_elf(Path(path), timeout)
        return time.monotonic() - t0

    def dump_raw(self, path: Path, timeout: float = 1800) -> float:
        """Flat physical-memory image (``pmemsave``); returns seconds taken."""
        t0 = time.monotonic()
        self._vm().dump_raw(Path(path), timeout)
        return time.monotonic() - t0

    def dump_lime(self, path: Path, fmt: str = "lime", timeout: float = 3600) -> float:
        """Acquire with LiME inside the guest (method chosen by ``lime=`` at boot); returns seconds."""
        from .lime import acquire

        t0 = time.monotonic()
        acquire(self, Path(path), fmt, timeout)
        return time.monotonic() - t0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
