"""Start and drive one ``qemu-system-x86_64`` guest; take whole-RAM dumps through QMP.

The guest boots the stock kernel directly (``-kernel``/``-initrd``), sees the host root and a
writable share over 9p, talks on a serial log file, and is controlled over a QMP unix socket.
``-nodefaults`` keeps out the default NIC/VGA/monitor; networking is added only for LiME's TCP
mode and then forwards a *loopback-only* host port.

Acceleration: /dev/kvm may exist yet be a nested software hypervisor that cannot boot a stock
kernel, so KVM is probed once (boot must reach /init quickly) and the verdict cached; TCG uses
``-cpu max,la57=off``: with 5-level paging Volatility's x86 layers find nothing.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cache import GuestError, cache_root, locked
from .qmp import QMP, QMPError

QEMU = "qemu-system-x86_64"


@dataclass
class VMConfig:
    """Everything one boot needs; paths are host paths."""

    kernel: Path
    initrd: Path
    share: Path
    memory_mib: int = 1536
    accel: str = "tcg"  # "kvm" or "tcg"
    append_extra: str = ""
    disk: Path | None = None  # virtio raw disk (/dev/vda): LiME's block-device output
    hostfwd_port: int | None = None  # host 127.0.0.1:PORT -> guest :4444 (LiME tcp)
    la57: bool = False  # let a TCG guest use 5-level paging (tests of zen's refusal)
    # host directories hidden in the guest by its own tmpfs on /tmp and /run (a checkout or venv
    # under /tmp): shared read-only and mounted at the same path inside the chroot
    expose: list[Path] = field(default_factory=list)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="zen-vm-")))

    def append(self) -> str:
        """Kernel command line: serial console, 4-level paging, KASLR left on (as in the field)."""
        paging = "" if self.la57 else " no5lvl"
        base = f"console=ttyS0{paging} panic=-1 guestvm.share={self.share}"
        base += "".join(f" guestvm.x{i}={p}" for i, p in enumerate(self.expose))
        return f"{base} {self.append_extra}".strip()

    def argv(self) -> list[str]:
        cpu = "host,la57=off" if self.accel == "kvm" else ("max" if self.la57 else "max,la57=off")
        a = [
            QEMU,
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-machine",
            "pc",
            "-accel",
            self.accel,
            "-cpu",
            cpu,
            "-smp",
            "1",
            "-m",
            str(self.memory_mib),
            "-kernel",
            str(self.kernel),
            "-initrd",
            str(self.initrd),
            "-append",
            self.append(),
            "-serial",
            f"file:{self.workdir / 'serial.log'}",
            "-qmp",
            f"unix:{self.workdir / 'qmp.sock'},server=on,wait=off",
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs",
            f"local,path={self.share},mount_tag=share,security_model=none,multidevs=remap",
            *[
                a
                for i, p in enumerate(self.expose)
                for a in ("-virtfs", f"local,path={p},mount_tag=x{i},security_model=none,readonly=on,multidevs=remap")
            ],
        ]
        if self.disk is not None:
            a += ["-drive", f"file={self.disk},if=virtio,format=raw,cache=unsafe"]
        if self.hostfwd_port is not None:
            a += [
                "-netdev",
                f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.hostfwd_port}-:4444",
                "-device",
                "virtio-net-pci,netdev=n0",
            ]
        return a


class VM:
    """A running QEMU process with its QMP session; always ``close()`` it (kills on failure)."""

    def __init__(self, cfg: VMConfig) -> None:
        self.cfg = cfg
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        self.serial = cfg.workdir / "serial.log"
        self.serial.write_text("")
        self.log = open(cfg.workdir / "qemu.log", "wb")
        if shutil.which(QEMU) is None:
            raise GuestError(f"{QEMU} is not installed (apt-get install qemu-system-x86)")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cfg.argv(), stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            self.qmp = QMP(cfg.workdir / "qmp.sock", timeout=30)
        except GuestError:
            self.close()
            raise GuestError(f"QEMU did not start:\n{self.tail()}") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        """The last lines of the serial log and QEMU's own output, for error messages."""
        ser = self.serial.read_text(errors="replace").splitlines()[-n:] if self.serial.exists() else []
        own = (self.cfg.workdir / "qemu.log").read_text(errors="replace").strip()
        rc = "" if self.alive() else f" (qemu exited {self.proc.returncode})"
        return "--- serial log tail" + rc + " ---\n" + "\n".join(ser) + (f"\n--- qemu ---\n{own}" if own else "")

    def check(self) -> None:
        """Raise with the serial tail if the guest died or the kernel panicked."""
        if not self.alive():
            raise GuestError(f"the guest exited unexpectedly\n{self.tail()}")
        text = self.serial.read_text(errors="replace") if self.serial.exists() else ""
        if "Kernel panic" in text or "guestvm: FATAL" in text:
            raise GuestError(f"the guest failed\n{self.tail()}")

    def wait_serial(self, marker: str, timeout: float) -> bool:
        """Wait until ``marker`` appears on the serial console; False on timeout or death."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker in self.serial.read_text(errors="replace"):
                return True
            if not self.alive():
                return False
            time.sleep(0.2)
        return False

    # -- memory dumps --------------------------------------------------------------------------
    def paused(self) -> _Paused:
        """``with vm.paused():`` stops the vCPU so several dumps show one instant."""
        return _Paused(self)

    def dump_elf(self, path: Path, timeout: float = 1800) -> None:
        """QEMU's ELF core of guest-physical RAM (``dump-guest-memory``, paging off: PT_LOADs
        carry physical addresses, plus a QEMU note per vCPU)."""
        path = Path(path).resolve()
        path.unlink(missing_ok=True)
        self.qmp.command("dump-guest-memory", timeout=timeout, paging=False, protocol=f"file:{path}", detach=False)
        path.chmod(0o644)  # QEMU creates it 0400

    def ram_ranges(self) -> list[tuple[int, int]]:
        """Guest-physical RAM as (start, size) ranges, read from ``info mtree``.

        On the ``pc`` machine RAM up to 3.5 GiB is one range [0, size); bigger guests are split
        into ram-below-4g and ram-above-4g (which starts at 4 GiB)."""
        tree = self.qmp.hmp("info mtree")
        out = []
        for m in re.finditer(r"([0-9a-f]+)-([0-9a-f]+) \(prio [-\d]+, ram\): alias (ram-(?:below|above)-4g)", tree):
            lo, hi = int(m.group(1), 16), int(m.group(2), 16)
            if (lo, hi - lo + 1) not in out:
                out.append((lo, hi - lo + 1))
        if not out:
            size = self.qmp.command("query-memory-size-summary")["base-memory"]
            out = [(0, size)]
        return sorted(out)

    def dump_raw(self, path: Path, timeout: float = 1800) -> None:
        """A flat image, file offset = guest-physical address (``pmemsave`` per RAM range; the
        gap below 4 GiB of a >3.5 GiB guest is a sparse hole)."""
        path = Path(path).resolve()
        path.unlink(missing_ok=True)
        ranges = self.ram_ranges()
        with self.paused():
            for i, (start, size) in enumerate(ranges):
                part = path if start == 0 else path.with_name(path.name + f".part{i}")
                self.qmp.command("pmemsave", timeout=timeout, val=start, size=size, filename=str(part))
                if part != path:
                    with open(part, "rb") as src, open(path, "r+b") as dst:
                        dst.seek(start)
                        shutil.copyfileobj(src, dst, 16 << 20)
                    part.unlink()

    # -- shutdown ------------------------------------------------------------------------------
    def close(self, timeout: float = 20) -> None:
        """Quit through QMP, then SIGTERM/SIGKILL the process group if it lingers."""
        if self.alive():
            try:
                self.qmp.command("quit", timeout=5)
            except (GuestError, OSError):
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(self.proc.pid, sig)
                        self.proc.wait(10)
                        break
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        continue
        if hasattr(self, "qmp"):
            self.qmp.close()
        self.log.close()


class _Paused:
    def __init__(self, vm: VM) -> None:
        self.vm = vm
        self.was_running = False

    def __enter__(self) -> VM:
        st = self.vm.qmp.command("query-status")
        self.was_running = bool(st.get("running"))
        if self.was_running:
            self.vm.qmp.command("stop")
        return self.vm

    def __exit__(self, *exc: object) -> None:
        if self.was_running and self.vm.alive():
            try:
                self.vm.qmp.command("cont")
            except QMPError:
                pass


def kvm_usable() -> bool:
    """/dev/kvm exists and opens read-write (the first, cheap half of the KVM check)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


def choose_accel(kernel: Path, initrd: Path, version: str, probe_timeout: float = 25) -> str:
    """``kvm`` if a probe boot of this kernel under KVM reaches /init within ``probe_timeout``
    seconds (a real KVM does it in ~2 s), else ``tcg``.  ``$ZEN_GUEST_ACCEL`` overrides; the
    verdict is cached per host kernel in ``<cache>/accel.json`` (whether KVM works is a property
    of the host; ``version`` only names the kernel used for the probe)."""
    forced = os.environ.get("ZEN_GUEST_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if not kvm_usable():
        return "tcg"
    key = platform.release()
    verdicts_file = cache_root() / "accel.json"
    with locked(".accel.lock"):
        verdicts = json.loads(verdicts_file.read_text()) if verdicts_file.exists() else {}
        if key in verdicts:
            return verdicts[key]
        share = Path(tempfile.mkdtemp(prefix="zen-kvmprobe-"))
        vm = None
        try:
            vm = VM(VMConfig(kernel=kernel, initrd=initrd, share=share, memory_mib=256, accel="kvm"))
            ok = vm.wait_serial("guestvm: init", probe_timeout)
        except GuestError:
            ok = False
        finally:
            if vm is not None:
                vm.close(timeout=5)
                shutil.rmtree(vm.cfg.workdir, ignore_errors=True)
            shutil.rmtree(share, ignore_errors=True)
        verdicts[key] = "kvm" if ok else "tcg"
        verdicts_file.write_text(json.dumps(verdicts, indent=1))
        return verdicts[key]
