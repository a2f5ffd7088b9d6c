"""Build the guest's initramfs: static busybox, the 9p/virtio modules, and an /init that runs a
host program inside a chroot of the host's own root filesystem.

Why a chroot of the host root over 9p: the workload (a torch process from the project's venv)
then runs byte-for-byte the same interpreter, libraries and files as on the host, with no disk
image to build or keep in sync, and file paths inside the guest equal host paths (the writable
share is mounted at its host path), so ground truth written by the workload means the same on both
sides.  The host talks to the running guest only through files in the share (``SHARE/ctl``):
``NNN.sh`` scripts are picked up by /init, run *outside* the chroot with busybox, and answered with
``NNN.out``, ``NNN.rc`` and a ``NNN.done`` marker.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import subprocess
from pathlib import Path

from .cache import GuestError

BUSYBOX = Path("/bin/busybox")  # from the host's busybox-static package
MSIZE = 512000  # the largest 9p message the 6.1 virtio transport accepts (PAGE_SIZE * 125)

INIT = r"""#!/bin/busybox sh
# guestvm /init: see tools/guestvm/initramfs.py for the protocol.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm /dev/pts
mount -t tmpfs shm /dev/shm
mount -t devpts pts /dev/pts
echo 0 > /proc/sys/kernel/kptr_restrict
echo 0 > /proc/sys/kernel/dmesg_restrict
echo "guestvm: init $(uname -r)"
die() { echo "guestvm: FATAL: $*"; sleep 2; poweroff -f; }
for m in $(cat /modules/order); do
    insmod /modules/$m.ko || echo "guestvm: insmod $m failed"
done
SHARE=
for w in $(cat /proc/cmdline); do
    case "$w" in guestvm.share=*) SHARE="${w#guestvm.share=}";; esac
done
[ -n "$SHARE" ] || die "no guestvm.share= on the kernel command line"
R=/mnt/host
mkdir -p $R
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=@MSIZE@,cache=loose hostroot $R \
    || die "cannot mount the host root (9p tag hostroot)"
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount --bind /dev $R/dev
mount -t tmpfs tmp $R/tmp
mount -t tmpfs run $R/run
# host directories under /tmp or /run (hidden by the tmpfs above) that the workload needs
for w in $(cat /proc/cmdline); do
    case "$w" in guestvm.x[0-9]=*)
        tag="${w%%=*}"; tag="${tag#guestvm.}"; dir="${w#*=}"
        mkdir -p "$R$dir" 2>/dev/null
        mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=@MSIZE@,cache=loose "$tag" "$R$dir" \
            || echo "guestvm: cannot mount $dir (9p tag $tag)";;
    esac
done
mkdir -p "$R$SHARE" 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=@MSIZE@,cache=none share "$R$SHARE" \
    || die "cannot mount the share (9p tag share) at $SHARE"
CTL="$R$SHARE/ctl"
export R SHARE CTL
mkdir -p "$CTL"
if [ -f "$CTL/workload.sh" ]; then
    # stdin stays open for ever (a program reading stdin must block, not see EOF)
    sleep 2147483647 | chroot $R /bin/sh "$SHARE/ctl/workload.sh" > "$CTL/workload.log" 2>&1 &
    WPID=$!
    echo $WPID > "$CTL/workload.pid"
    echo "guestvm: workload pid $!"
fi
echo "guestvm: ready"
: > "$CTL/ready"
# idle waits read a fifo with a timeout (a builtin): no short-lived sleep processes, so the
# process list seen in a memory image is the same as the one recorded just before the dump
mkfifo /tmp/tick
exec 3<>/tmp/tick
# a marker write that fails once over 9p (seen: ENOENT for the ctl directory, once in many CI runs) is
# retried; a failed redirection of ':' would end this shell, i.e. init, and panic the guest
put() {
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        ( echo "$2" > "$1" ) 2>/dev/null && return 0
        read -t 0.2 -u 3 _ || true
    done
    echo "guestvm: cannot write $1"
}
while :; do
    for f in "$CTL"/[0-9]*.sh; do
        [ -f "$f" ] || continue
        b="${f%.sh}"
        mv "$f" "$b.run" 2>/dev/null || continue
        ( cd / && sh "$b.run" ) > "$b.out" 2>&1 < /dev/null
        put "$b.rc" $?
        put "$b.done" ""
    done
    # a workload that died is reported at once (kill is a builtin: no process is spawned)
    if [ -n "$WPID" ] && [ ! -e "$CTL/workload.exited" ] && ! kill -0 "$WPID" 2>/dev/null; then
        : > "$CTL/workload.exited"
    fi
    read -t 0.3 -u 3 _ || true
done
"""


def _newc(name: str, mode: int, data: bytes = b"", ino: int = 0) -> bytes:
    """One cpio "newc" record (the format the kernel unpacks), 4-byte aligned."""
    nameb = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nameb), 0]
    hdr = b"070701" + b"".join(b"%08X" % f for f in fields)
    out = hdr + nameb
    out += b"\0" * (-len(out) % 4)
    out += data + b"\0" * (-len(data) % 4)
    return out


class Cpio:
    """A minimal newc archive writer (no ``cpio`` on the host, and none is needed)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1

    def _add(self, name: str, mode: int, data: bytes = b"") -> None:
        self.ino += 1
        self.buf.write(_newc(name, mode, data, self.ino))

    def dir(self, name: str) -> None:
        self._add(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._add(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._add(name, stat.S_IFLNK | 0o777, target.encode())

    def node(self, name: str, mode: int, major: int, minor: int) -> None:
        """A device node (``/dev/console`` must exist before devtmpfs for early output)."""
        self.ino += 1
        nameb = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, 0, 0, 0, major, minor, len(nameb), 0]
        rec = b"070701" + b"".join(b"%08X" % f for f in fields) + nameb
        self.buf.write(rec + b"\0" * (-len(rec) % 4))

    def finish(self) -> bytes:
        self.buf.write(_newc("TRAILER!!!", 0))
        return self.buf.getvalue()


def busybox_applets() -> list[str]:
    """The applets the host's static busybox provides (symlinked into the initramfs's /bin)."""
    if not BUSYBOX.exists():
        raise GuestError("/bin/busybox is missing: apt-get install busybox-static")
    out = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout
    return [a for a in out.split() if a and "/" not in a and a != "busybox"]


def build_initramfs(kernel_dir: Path, modules: list[str], dest: Path) -> None:
    """Write ``dest`` (gzip'd newc): busybox + applets, ``/modules/*.ko`` + load order, ``/init``."""
    c = Cpio()
    for d in ("bin", "dev", "proc", "sys", "tmp", "mnt", "modules", "root"):
        c.dir(d)
    c.node("dev/console", stat.S_IFCHR | 0o600, 5, 1)
    c.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    for a in busybox_applets():
        c.symlink(f"bin/{a}", "busybox")
    for m in modules:
        c.file(f"modules/{m}.ko", (kernel_dir / "modules" / f"{m}.ko").read_bytes())
    c.file("modules/order", ("\n".join(modules) + "\n").encode())
    c.file("init", INIT.replace("@MSIZE@", str(MSIZE)).encode(), 0o755)
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(c.finish(), compresslevel=6, mtime=0))
    os.replace(tmp, dest)
