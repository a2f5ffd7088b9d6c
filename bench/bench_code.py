"""Benchmark of programmatic/unified representation recovery (issue 4) on a transformers Llama process.

    python bench/bench_code.py

Starts a process serving a transformers LlamaForCausalLM (small config; the amount of *code* in
memory is what matters here: transformers, accelerate, huggingface_hub... tens of thousands of
functions), images it, and times each step of PR/UR recovery in-process: the runtime index
(census of functions and code objects), the model-code closure, the PR build (listings of the
model code), the system-wide code table, and the UR. Writes bench/results/code.md.

    python bench/bench_code.py --image IMAGE [--runs 3] [--no-write]

Times `zen recover`'s code stage on an existing image (e.g. the GPT-2 image of bench_scale.py),
each run in a fresh process, the variants interleaved so that they share the machine's state:
    one process  ZEN_FORK=0: the whole stage (and the image digest and tensor files) in zen's process
    forked       as shipped: the system table, part of the code records with the class records, and
                 code.marshal with the UR made by forked copies of zen
Reported: the stage's wall time (the manifest's), zen's own CPU time in it (`time.process_time`)
and the CPU time of the children it forked and reaped in it (`RUSAGE_CHILDREN`). Every run's
pr.json, ur.json, code.marshal and requirements.txt must be byte-identical. Writes
bench/results/code_stage.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.acquire.process import acquire  # noqa: E402
from zen.cpython.heap import Heap  # noqa: E402
from zen.cpython.interp import Interpreter  # noqa: E402
from zen.cpython.program.context import execution_context  # noqa: E402
from zen.cpython.program.programmatic import build_pr, build_ur, model_closure, system_table  # noqa: E402
from zen.cpython.runtime import Runtime  # noqa: E402
from zen.frontends.pytorch.modules import ModuleIndex  # noqa: E402
from zen.memory import open_space  # noqa: E402

TARGET = r"""
import sys, torch, transformers
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=128, bos_token_id=0, eos_token_id=0, pad_token_id=0)
model = transformers.LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    model(torch.randint(0, 128, (1, 8)))
print("READY", flush=True)
sys.stdin.read()
"""


# One run of `recover` in a fresh process: argv = variant, image, case directory. Prints JSON.
STAGE_RUN = r"""
import json, os, resource, sys, time
from pathlib import Path
variant, image, out = sys.argv[1:4]
if variant == "one process":
    os.environ["ZEN_FORK"] = "0"
import zen.recover.run as R
stage = R._code_stage
got = {}
def children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
def timed(*a, **k):
    t, c = time.process_time(), children()
    try:
        return stage(*a, **k)
    finally:
        got["code_cpu"], got["children_cpu"] = time.process_time() - t, children() - c
R._code_stage = timed
t = time.perf_counter()
res = R.recover(Path(image), None, Path(out))
got["recover"] = time.perf_counter() - t
got["code_wall"] = res.manifest["run"]["seconds"]["code"]
got["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(got))
"""
VARIANTS = ("one process", "forked")
COMPARED = ("code.marshal", "pr.json", "ur.json", "requirements.txt")


def stage_bench(image: Path, runs: int, write: bool) -> int:
    """CPU seconds of the code stage on `image`, per variant, interleaved runs; identical bytes."""
    work = Path(tempfile.mkdtemp(prefix="zen-bench-stage-"))
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    digests: dict[str, set[str]] = {n: set() for n in COMPARED}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    load = [os.getloadavg()[0]]
    try:
        for i in range(runs):
            for v in VARIANTS:
                out = work / f"{v}-{i}"
                res = subprocess.run([sys.executable, "-c", STAGE_RUN, v, str(image), str(out)], capture_output=True,
                                     text=True, env=env, timeout=900)  # fmt: skip
                if res.returncode != 0:
                    raise SystemExit(f"recover ({v}) failed:\n{res.stderr[-3000:]}")
                results[v].append(json.loads(res.stdout.strip().splitlines()[-1]))
                for n in COMPARED:
                    digests[n].add(hashlib.sha256((out / n).read_bytes()).hexdigest())
                print(v, i, results[v][-1], flush=True)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    load.append(os.getloadavg()[0])
    identical = all(len(d) == 1 for d in digests.values())

    def med(v: str, k: str) -> float:
        return statistics.median(r[k] for r in results[v])

    def each(v: str, k: str) -> str:
        return ", ".join(f"{r[k]:.2f}" for r in results[v])

    lines = [
        "# Code stage of `zen recover` (issue 16)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}. Image: `{image.name}` ({image.stat().st_size / 2**30:.2f} GiB). {runs} runs per "
        f"variant, each in a fresh process, variants interleaved; medians (every run in parentheses). Load average "
        f"(1 min) {load[0]:.1f} before, {load[1]:.1f} after.",
        f"Command: `python bench/bench_code.py --image {image.name} --runs {runs}`",
        "",
        "| variant | code stage s (wall) | zen CPU s in it | children's CPU s in it | `recover` s | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {v} | **{med(v, 'code_wall'):.2f}** ({each(v, 'code_wall')}) | {med(v, 'code_cpu'):.2f} | "
          f"{med(v, 'children_cpu'):.2f} | {med(v, 'recover'):.2f} ({each(v, 'recover')}) | {med(v, 'peak_rss_mb'):.0f} |"
          for v in VARIANTS],
        "",
        f"code.marshal, pr.json, ur.json, requirements.txt byte-identical across all {runs * len(VARIANTS)} runs: "
        f"{'yes' if identical else 'NO'}.",
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if write:
        (ROOT / "bench" / "results" / "code_stage.md").write_text(text)
    return 0 if identical else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", type=Path, help="time the code stage of `zen recover` on this image instead")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.image:
        return stage_bench(args.image, args.runs, not args.no_write)
    work = Path(tempfile.mkdtemp(prefix="zen-bench-code-"))
    script = work / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "READY":
        raise SystemExit("target failed")
    image = work / "llama.core"
    acquire(proc.pid, image, lean=True)
    proc.stdin.close()
    proc.wait()
    times = {}
    t = time.perf_counter()
    space = open_space(image)
    ip = Interpreter.open(space)
    heap = Heap(ip)
    rt = Runtime(ip, heap)
    times["runtime index (census of functions, code objects, types)"] = time.perf_counter() - t
    t = time.perf_counter()
    index = ModuleIndex(ip, heap)
    root = max(index.roots(), key=lambda a: len(index.walk(a)))
    walk = index.walk(root)
    times["module tree"] = time.perf_counter() - t
    t = time.perf_counter()
    result = model_closure(rt, sorted({n.type.addr for _, n in walk}))
    times["model-code closure"] = time.perf_counter() - t
    t = time.perf_counter()
    ctx = execution_context(rt, set(), result.dependencies, {"cpu"}, "x86_64")
    pr = build_pr(rt, result, ctx, system=False)
    times["PR: model code records and listings"] = time.perf_counter() - t
    t = time.perf_counter()
    table = system_table(rt)
    times["PR: system-wide code table (hash of every code object)"] = time.perf_counter() - t
    t = time.perf_counter()
    ur = build_ur(rt, [(p, n.type.addr) for p, n in walk], [c.address for c in pr.codes], result)
    times["UR (ϕ for every node)"] = time.perf_counter() - t
    total = sum(times.values())
    lines = [
        "# PR/UR recovery benchmark (issue 4)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. Process: transformers "
        f"LlamaForCausalLM; {len(rt.function_addrs):,} functions, {len(rt.code_addrs):,} code objects, "
        f"{len(rt.type_addrs):,} types, {len(rt.modules):,} modules in memory.",
        f"Model-specific: {len(result.functions):,} functions, {len(pr.codes):,} code objects, {len(pr.classes):,} classes, "
        f"{len(pr.modules):,} modules; UR over {len(ur.nodes)} nodes; system table of {len(table):,} code objects.",
        "",
        "| step | seconds |",
        "|---|---:|",
        *[f"| {k} | {v:.2f} |" for k, v in times.items()],
        f"| **total** | **{total:.2f}** |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "code.md").write_text(text)
    space.close()
    image.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
