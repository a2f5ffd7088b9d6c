"""How `zen recover` scales with cores, and what bounds it: the same image recovered on 1, 2, 4, ... cores in one run.

    python bench/cores.py [--image CORE] [--cores 1,2,4,8,16] [--runs 3] [--assume-cores K] [--no-write] [--json FILE]

Issue 50 asks that a 16-core machine recover the same images faster than a 2-core one, "or the bench says why not".
This bench answers both on whatever machine runs it: without --image it starts the GPT-2 (124M) process of
`bench_recover.py`, images it with `zen acquire`, then runs `zen recover` of that image pinned to the first k of the
CPUs it may use (`sched_setaffinity`, which zen reads to size its work: `forking.cores()`), for each k in turn,
`--runs` rounds with the core counts alternated, the image in the page cache (this measures CPU, not the disk).

Per run it records the wall time, the CPU of the whole process tree (`wait4`: zen and the children it reaped), the
CPU of zen's own process (`getrusage(RUSAGE_SELF)` at exit: its main thread and the threads it hands work to) and of
its main thread alone (`RUSAGE_THREAD`). The last is the bound: zen's analysis is one chain of work in that thread
(its parts handed to threads and forked children run beside it), so no number of cores makes a recovery shorter
than the chain's own CPU time; the page says how close each run came to it. Where the machine has fewer than 16
cores, one more row runs on all of them with zen told it has 16 (`--assume-cores`): it then splits its work as a
16-core machine would, and that row's chain CPU is such a machine's floor with this CPU, measured where none is.
Case files (mr.json, pr.json, ur.json, weights.safetensors) are compared across core counts: the answer must not
depend on the machine.

Writes bench/results/cores.md (unless --no-write); --json FILE also writes the raw runs (bench/gpu.py's `cores` step
uses it on the GPU machine's 16 cores).
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
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_recover import TARGET, fresh_bytecode  # noqa: E402

# zen's CLI in a process that records its own CPU (not its children's) when it exits. atexit runs in the main thread:
# RUSAGE_THREAD there is the analysis chain's CPU, RUSAGE_SELF adds the threads the chain hands work to (the census's
# searches, the page-cache warmer, pr.json's writer), which the first version of this bench took for the chain. With
# ZEN_BENCH_ASSUME_CORES=K zen sizes its work (`forking.cores()`: the code records' split, the census's threads) as on a
# K-core machine while the kernel still runs it on the cores it is pinned to: the chain's CPU then is the floor of a
# K-core machine's wall time with this CPU, measured where no such machine is.
WRAPPER = (
    "import atexit, json, os, resource, sys\n"
    "def _own():\n"
    "    r, m = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)\n"
    "    with open(os.environ['ZEN_BENCH_RUSAGE'], 'w') as f:\n"
    "        json.dump({'user': r.ru_utime, 'sys': r.ru_stime, 'main': m.ru_utime + m.ru_stime}, f)\n"
    "atexit.register(_own)\n"
    "if os.environ.get('ZEN_BENCH_ASSUME_CORES'):\n"
    "    import zen.runtime.forking as forking\n"
    "    forking.cores = lambda: int(os.environ['ZEN_BENCH_ASSUME_CORES'])\n"
    "sys.argv = ['zen', *sys.argv[1:]]\n"
    "from zen.cli import main\n"
    "main()\n"
)
CASE_FILES = ("mr.json", "pr.json", "ur.json", "weights.safetensors")


def make_image(work: Path) -> Path:
    """A GPT-2 (124M) process of bench_recover.py, imaged with zen's own acquisition."""
    from zen.acquire.process import acquire

    script = work / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([sys.executable, str(script), "gpt2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = (proc.stdout.readline() if proc.stdout else "").split()
        if not line or line[0] != "READY":
            raise SystemExit("the GPT-2 target process did not start (is transformers installed?)")
        image = work / "gpt2.core"
        acquire(proc.pid, image)
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait()
    return image


def one_run(image: Path, cpus: list[int], work: Path, assume: int = 0) -> dict:
    """`zen recover IMAGE` pinned to `cpus` (sizing its work for `assume` cores, when given): wall, tree CPU, zen's
    own CPU, its main thread's, stages, case digests."""
    case, rusage = work / f"case-{len(cpus)}", work / "rusage.json"
    shutil.rmtree(case, ignore_errors=True)
    path = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, ZEN_BENCH_RUSAGE=str(rusage), PYTHONPATH=path)
    env.pop("ZEN_BENCH_ASSUME_CORES", None)
    if assume:
        env["ZEN_BENCH_ASSUME_CORES"] = str(assume)
    errors = work / "stderr.txt"
    with open(errors, "wb") as err_fh:  # a file, not a pipe: nothing blocks while wait4 waits
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", WRAPPER, "recover", str(image), "-o", str(case)], env=env,
                                stdout=subprocess.DEVNULL, stderr=err_fh,
                                preexec_fn=lambda: os.sched_setaffinity(0, cpus))  # fmt: skip
        try:
            _, status, tree = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: no zen left writing into the work folder about to be removed
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - t
    rc = proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: Popen must not wait again
    err = errors.read_text(errors="replace")
    if rc not in (0, 5):
        raise SystemExit(f"zen recover on {len(cpus)} cores exited {rc}: {err[-1500:]}")
    own = json.loads(rusage.read_text())
    manifest = json.loads((case / "manifest.json").read_text())
    digests = {}
    for name in CASE_FILES:
        h = hashlib.sha256()
        with open(case / name, "rb") as fh:
            while block := fh.read(1 << 24):
                h.update(block)
        digests[name] = h.hexdigest()
    shutil.rmtree(case, ignore_errors=True)  # the weights: 500 MB
    return {"cores": len(cpus), "assumed": assume, "wall": wall, "tree_cpu": tree.ru_utime + tree.ru_stime,
            "own_cpu": own["user"] + own["sys"], "chain_cpu": own["main"], "stages": manifest["run"]["seconds"],
            "digests": digests}  # fmt: skip


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for k, assumed in sorted({(r["cores"], r.get("assumed", 0)) for r in runs}, key=lambda ka: (ka[1] > 0, ka)):
        mine = [r for r in runs if r["cores"] == k and r.get("assumed", 0) == assumed]
        rows.append({"cores": k, "assumed": assumed, "runs": len(mine), "wall": statistics.median(r["wall"] for r in mine),
                     "wall_lo": min(r["wall"] for r in mine), "wall_hi": max(r["wall"] for r in mine),
                     "tree_cpu": statistics.median(r["tree_cpu"] for r in mine),
                     "own_cpu": statistics.median(r["own_cpu"] for r in mine),
                     "chain_cpu": statistics.median(r["chain_cpu"] for r in mine),
                     "code": statistics.median(r["stages"].get("code", 0.0) for r in mine)})  # fmt: skip
    return rows


def _core_line() -> str:
    """Which path ran: zen's compiled core is built for one Python (install.sh); elsewhere its Python reference runs."""
    from zen import native

    if native.core is not None and not os.environ.get("ZEN_PURE"):
        return "zen's compiled core was loaded."
    return "zen's compiled core was **not** loaded (not built for this Python, or ZEN_PURE): its Python reference ran."


def report(rows: list[dict], runs: list[dict], image_mb: float, command: str, seconds: float) -> str:
    same = len({json.dumps(r["digests"], sort_keys=True) for r in runs}) == 1
    real = [r for r in rows if not r["assumed"]]
    base = real[0]["wall"]
    lines = [
        "# `zen recover` and the number of cores (issue 50)",
        "",
        f"One run of `{command}` on {time.strftime('%Y-%m-%d')}: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {seconds:.0f} s in all. Image: a GPT-2 (124M) process of `bench_recover.py`, "
        f"{image_mb:,.0f} MB, in the page cache. Each run is `zen recover` pinned to the first k CPUs; medians of the "
        "alternated rounds. *Tree CPU*: zen and the children it reaped; *process CPU*: zen's process, its main thread "
        "and the threads it hands work to (the census's searches, the page-cache warmer, pr.json's writer); *chain "
        "CPU*: the main thread alone, the chain of analysis no core count shortens. A row *sized for K* ran on the "
        "same cores with zen told it had K (`forking.cores()`): it splits its work as on a K-core machine, so its "
        "chain CPU is the floor of a K-core machine's wall time with this CPU. " + _core_line(),
        "",
        "| cores | runs | wall s (range) | speed-up vs fewest | tree CPU s | process CPU s | chain CPU s | wall ÷ chain | "
        "code stage s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        label = f"{r['cores']}, sized for {r['assumed']}" if r["assumed"] else str(r["cores"])
        lines.append(f"| {label} | {r['runs']} | {r['wall']:.2f} ({r['wall_lo']:.2f}-{r['wall_hi']:.2f}) | "
                     f"{base / r['wall']:.2f}× | {r['tree_cpu']:.2f} | {r['own_cpu']:.2f} | {r['chain_cpu']:.2f} | "
                     f"{r['wall'] / r['chain_cpu']:.2f} | {r['code']:.2f} |")  # fmt: skip
    best = real[-1]
    gain = max(best["wall"] - best["chain_cpu"], 0.0)
    lines += [
        "",
        f"Case files {'byte-identical across every run and core count' if same else '**differ between runs**'} "
        f"({', '.join(CASE_FILES)}).",
        "",
        f"**What more cores can give.** On {best['cores']} cores the wall time is {best['wall']:.2f} s, "
        f"{best['wall'] / best['chain_cpu']:.2f}× the chain's CPU ({best['chain_cpu']:.2f} s): the analysis chain (the "
        "census, the model stage, the closure walk, its share of the code records, pr.json) is one thread, and the "
        "work handed to threads and forked children (tensor files, the system-wide code table, part of the records, "
        f"code.marshal and the UR) runs beside it. More cores can take at most the difference, about {gain:.2f} s "
        f"({gain / best['wall']:.0%}), off this recovery on this CPU, with the work split as on {best['cores']} cores.",
    ]
    for r in (r for r in rows if r["assumed"]):
        floor = r["chain_cpu"]
        lines += [
            "",
            f"Sized for {r['assumed']} cores (the code records shared with a child that also makes the class "
            f"records: `code_stage.PARENT_SHARE`; more census threads), the chain's CPU is **{floor:.2f} s**: a "
            f"{r['assumed']}-core machine with this CPU cannot recover this image in less, at most "
            f"{best['wall'] / floor:.2f}× faster than the {best['wall']:.2f} s measured here on {best['cores']} cores "
            "(a faster or slower core moves both alike). The rest of a recovery's CPU is already beside the chain.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=Path, help="a process image to recover (default: image a GPT-2 process now)")
    ap.add_argument("--cores", default="", help="core counts, comma-separated (default 1, 2, 4, ... up to all)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print the page, do not write bench/results/cores.md")
    ap.add_argument("--json", type=Path, help="also write the raw runs here")
    ap.add_argument("--assume-cores", type=int, default=-1,
                    help="also run on all the cores given with zen sizing its work for this many (default 16 where "
                         "fewer are given, 0: no such row)")  # fmt: skip
    args = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    counts = [int(c) for c in args.cores.split(",") if c.strip()] or [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= len(allowed)]
    if any(k < 1 or k > len(allowed) for k in counts):
        raise SystemExit(f"--cores: this process may use {len(allowed)} CPUs")
    assume = args.assume_cores if args.assume_cores >= 0 else (16 if max(counts) < 16 else 0)
    plan = [(k, 0) for k in counts] + ([(max(counts), assume)] if assume else [])
    if args.image is not None and not args.image.is_file():
        raise SystemExit(f"--image {args.image}: no such file (give a process image, or leave --image out to make one)")
    fresh_bytecode()
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="zen-bench-cores-"))
    try:
        image = args.image or make_image(work)
        image_mb = image.stat().st_size / 1e6
        with open(image, "rb") as fh:  # into the page cache: this bench measures CPU, not the disk
            while fh.read(1 << 24):
                pass
        runs = []
        for rnd in range(args.runs):
            for k, sized in plan if rnd % 2 == 0 else plan[::-1]:
                runs.append(one_run(image, allowed[:k], work, sized))
                print(f"round {rnd + 1}, {k} cores{f' sized for {sized}' if sized else ''}: {runs[-1]['wall']:.2f} s, "
                      f"chain CPU {runs[-1]['chain_cpu']:.2f} s", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = "python bench/cores.py" + (f" --cores {args.cores}" if args.cores else "") + f" --runs {args.runs}"
    command += f" --assume-cores {args.assume_cores}" if args.assume_cores >= 0 else ""
    text = report(summarize(runs), runs, image_mb, command, time.perf_counter() - t0)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "rows": summarize(runs)}, indent=1) + "\n")
    if not args.no_write:
        (ROOT / "bench" / "results" / "cores.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
