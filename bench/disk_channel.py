"""Does this machine's disk read and write at once, or share one channel? (issue 50: what bounds the 1.5B images)

`zen recover` of an fp32 model reads the image and writes nearly as many bytes of weights (with O_DIRECT, so inside
the command's time). This reads FILE from a cold page cache alone, writes as many bytes with O_DIRECT alone
(`dd oflag=direct`, to OUT), then does both at once; if "both" is near the sum of the two alone, reads and writes
share the disk, and recovering such a model cannot take less than about that sum, however the work is arranged.

    python bench/disk_channel.py FILE OUT [--runs 3]

FILE is left as it is (only evicted from the page cache); OUT must not exist, and is deleted after each run and
on an interrupt.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
import time


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages (a file just written) are not dropped: they would be read from memory
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read(path: str) -> float:
    evict(path)
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, 64 << 20):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - t


def write(out: str, size: int) -> float:
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={out}", "bs=64M", f"count={max(1, size >> 26)}", "oflag=direct"],
                   capture_output=True, check=True)  # fmt: skip
    return time.perf_counter() - t


def _timed_write(into: dict[str, float], out: str, size: int) -> None:
    into["w"] = write(out, size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not os.path.isfile(a.file):
        ap.error(f"{a.file} is not a regular file: give the file to read (an image of a few GB)")
    if os.path.lexists(a.out):
        ap.error(f"{a.out} exists: give a path that does not (it is written with zeros and deleted after each run)")
    size = os.path.getsize(a.file)
    print(f"{a.file}: {size / 1e9:.2f} GB", flush=True)
    try:
        for i in range(a.runs):
            _one_run(i, a.file, a.out, size)
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    finally:  # an interrupted run leaves no file of zeros behind
        if os.path.lexists(a.out):
            os.unlink(a.out)


def _one_run(i: int, path: str, out: str, size: int) -> None:
    r = read(path)
    w = write(out, size)
    os.unlink(out)
    evict(path)
    got: dict[str, float] = {}
    th = threading.Thread(target=_timed_write, args=(got, out, size))
    t = time.perf_counter()
    th.start()
    got["r"] = read(path)
    th.join()
    both = time.perf_counter() - t
    os.unlink(out)
    print(f"run {i}: read alone {r:.2f} s ({size / r / 1e9:.2f} GB/s), write alone {w:.2f} s "
          f"({size / w / 1e9:.2f} GB/s), both at once {both:.2f} s = {both / (r + w):.0%} of the sum "
          f"(read {got['r']:.2f}, write {got['w']:.2f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
