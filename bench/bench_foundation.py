"""Benchmark of the reading layer on a real torch process image, as ratios measured in one run.

    python bench/bench_foundation.py [--keep DIR]

Starts the torch objects target (tests/targets/objects_target.py), images it with `zen acquire`
(all mappings), then times, on that image:

* one sequential read of the whole file (the baseline every ratio divides by; read twice, the
  second, page-cached read is the baseline, so both sides run from memory);
* `zen info` work: open the image, discover the interpreter, load the profile;
* the full census: every type object, objects counted by type, the GC lists;
* finding every code object and rebuilding each one as a `types.CodeType`.

Writes bench/results/foundation.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.acquire.process import acquire  # noqa: E402
from zen.cpython.code.codebuild import rebuild_code  # noqa: E402
from zen.cpython.heap import Heap  # noqa: E402
from zen.cpython.interp import Interpreter  # noqa: E402
from zen.memory import open_space  # noqa: E402
from zen.runtime.errors import ZenError  # noqa: E402


def sequential_read(path: Path, cold: bool = False) -> float:
    """Seconds to read the whole file in 16 MB blocks; cold=True first evicts it from the page cache."""
    with open(path, "rb", buffering=0) as fh:
        if cold:
            os.fsync(fh.fileno())
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t = time.perf_counter()
        while fh.read(16 << 20):
            pass
        return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="keep the image in this directory")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="zen-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    target = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/targets/objects_target.py"), str(work)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if target.stdout.readline().strip() != "READY":
        print("target failed to start", file=sys.stderr)
        return 1
    image = work / "torch-all.core"
    t = time.perf_counter()
    res = acquire(target.pid, image)
    t_acquire = time.perf_counter() - t
    target.stdin.close()
    target.wait()

    t_cold = sequential_read(image, cold=True)
    t_seq = sequential_read(image)

    t0 = time.perf_counter()
    space = open_space(image)
    ip = Interpreter.open(space)
    t_open = time.perf_counter() - t0

    t1 = time.perf_counter()
    heap = Heap(ip)
    types = heap.all_types()
    counts = heap.census(types)
    gens = heap.gc_generations()
    t_census = time.perf_counter() - t1

    t2 = time.perf_counter()
    codes = heap.instances(ip.wk.types["code"]).tolist()
    memo: dict = {}
    failed = 0
    for a in codes:
        try:
            rebuild_code(ip, a, memo)
        except ZenError:
            failed += 1
    t_code = time.perf_counter() - t2
    total = t_open + t_census + t_code

    size = image.stat().st_size
    lines = [
        "# Reading layer benchmark (issue 2)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
        f"Image: zen acquire --all of the torch objects target, {size / 1e6:,.0f} MB "
        f"({res.bytes_written / 1e6:,.0f} MB of memory copied in {t_acquire:.2f} s).",
        "",
        "| step | seconds | ÷ cold read | ÷ page-cached read |",
        "|---|---:|---:|---:|",
        f"| sequential read of the image, evicted from the page cache first | {t_cold:.3f} | 1.00 | {t_cold / t_seq:.2f} |",
        f"| sequential read of the image, page-cached | {t_seq:.3f} | {t_seq / t_cold:.2f} | 1.00 |",
        f"| open + interpreter discovery + profile (`zen info` without census) | {t_open:.3f} "
        f"| {t_open / t_cold:.2f} | {t_open / t_seq:.2f} |",
        f"| census: {len(types):,} types, {sum(counts.values()):,} objects, GC lists {[len(g) for g in gens]} "
        f"| {t_census:.3f} | {t_census / t_cold:.2f} | {t_census / t_seq:.2f} |",
        f"| find {len(codes):,} code objects and rebuild each ({len(memo):,} incl. nested, {failed} failed) "
        f"| {t_code:.3f} | {t_code / t_cold:.2f} | {t_code / t_seq:.2f} |",
        f"| **total** | **{total:.3f}** | **{total / t_cold:.2f}** | **{total / t_seq:.2f}** |",
        "",
        "Target in the issue: total ≤ 2× one sequential read. The analysis itself runs on the page-cached",
        "image in both columns (it follows the reads); only the baseline differs.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench" / "results" / "foundation.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    space.close()
    if not args.keep:
        image.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
