"""`zen recover` of one image by two revisions of zen, alternated, and whether their cases agree.

    python bench/bench_revisions.py --base REV --image IMAGE [--runs 3] [--cold] [--write TITLE]

The base revision is checked out into a temporary git worktree and run from there
(`PYTHONPATH=WORKTREE/src`), the working tree's zen from `src/`: `python -m zen recover IMAGE`
under GNU time, alternately, each from a cold page cache of the image with `--cold`. Reported per
revision: the median wall time (range), CPU time of zen and the children it waited for, peak RSS
and the stages of the median run. Every case file except the manifest (which holds timings) must
be byte-identical between the two revisions: a speed-up that changed what a case says would show
here. With `--write TITLE`, the table is appended to bench/results/perf.md under that title.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_scale import drop_cache, write_sections  # noqa: E402

COMPARED = ("mr.json", "weights.safetensors", "inputs.safetensors", "pr.json", "ur.json", "code.marshal",
            "requirements.txt", "extra.safetensors")  # fmt: skip


def run(src: Path, image: Path, out: Path, cold: bool) -> dict:
    if cold:
        drop_cache(image)
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "zen", "recover", image, "-o", out]
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "ZEN_MAXRSS_KB=%M ZEN_CPU=%U+%S", *map(str, cmd)], capture_output=True,
                       text=True, env=env, timeout=3600)  # fmt: skip
    wall = time.perf_counter() - t
    if r.returncode not in (0, 5):
        raise SystemExit(f"recover failed ({src}):\n{r.stderr[-3000:]}")
    words = r.stderr.split()
    cpu = sum(float(v) for v in [w for w in words if w.startswith("ZEN_CPU=")][-1].split("=")[1].split("+"))
    rss = int([w for w in words if w.startswith("ZEN_MAXRSS_KB=")][-1].split("=")[1]) / 1024
    manifest = json.loads((out / "manifest.json").read_text())
    files = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in COMPARED if (out / n).exists()}
    return {"wall": wall, "cpu": cpu, "rss": rss, "stages": manifest["run"]["seconds"], "files": files}


def _short(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare with the working tree")
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the image from the page cache before each run")
    ap.add_argument("--write", metavar="TITLE", help="append the table to bench/results/perf.md under this title")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zen-bench-rev-"))
    tree = work / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.base], check=True,
                   capture_output=True)  # fmt: skip
    base_rev, head_rev = (_short(tree), _short(ROOT))
    sides = {f"base {base_rev}": tree / "src", f"working tree (HEAD {head_rev})": ROOT / "src"}
    results: dict[str, list[dict]] = {k: [] for k in sides}
    load = os.getloadavg()[0]
    try:
        for i in range(args.runs):
            for name, src in sides.items():
                results[name].append(run(src, args.image, work / "case", args.cold))
                print(name, i, json.dumps({k: v for k, v in results[name][-1].items() if k != "files"}), flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    digests = {json.dumps(r["files"], sort_keys=True) for rs in results.values() for r in rs}
    rows = []
    for name, rs in results.items():
        walls = [r["wall"] for r in rs]
        mid = sorted(rs, key=lambda r: r["wall"])[len(rs) // 2]
        rows.append(f"| {name} | **{statistics.median(walls):.2f}** ({min(walls):.2f}-{max(walls):.2f}) | "
                    f"{statistics.median(r['cpu'] for r in rs):.2f} | {max(r['rss'] for r in rs):,.0f} | "
                    f"{', '.join(f'{k} {v}' for k, v in mid['stages'].items())} |")  # fmt: skip
    text = "\n".join([
        f"One run of `python bench/bench_revisions.py --base {args.base} --image {args.image.name} --runs {args.runs}"
        f"{' --cold' if args.cold else ''}` on {time.strftime('%Y-%m-%d')}: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; image {args.image.stat().st_size / 1e6:,.0f} MB; load average {load:.1f} "
        f"at the start. `python -m zen recover IMAGE` by each revision, alternated, {args.runs} runs each"
        f"{', each from a cold page cache of the image' if args.cold else ''}; wall time median (range), CPU of zen and "
        "its children (GNU time), peak RSS of the largest zen process, the stages of the median run.",
        "",
        "| revision | `zen recover` s | CPU s | peak RSS MB | stages s (median run) |",
        "|---|---:|---:|---:|---|",
        *rows,
        "",
        f"Case files (all but the manifest) byte-identical across all {args.runs * 2} runs: "
        f"{'yes' if len(digests) == 1 else 'NO'}.",
    ])  # fmt: skip
    print(text)
    if args.write:
        write_sections({args.write: text})
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
