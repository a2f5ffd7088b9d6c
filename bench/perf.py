"""Performance of the whole method as ratios measured in one run (issue 7).

    python bench/perf.py

On a process serving a full-size transformers GPT-2 (124 M parameters):
  * recovery time ÷ the time to read the image once (cold and cached page cache),
  * PR recovery time (the `code` stage of `zen recover`) and its share of recovery,
  * reuse time ÷ `load_state_dict` time: `PKG.load()` (patch the installed base code, rebuild the
    object graph, load the recovered tensors) versus building the model from its constructor and
    calling `load_state_dict` on the same tensors, each in a fresh process with torch and
    transformers' GPT-2 modules already imported (median of 3), checking both give identical outputs;
and attribution time versus library size (10, 100, 1,000 entries; `bench_attribution.measure`).
Writes bench/results/perf.md. Absolute times depend on the machine; the ratios are the result.
"""

from __future__ import annotations

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
sys.path.insert(0, str(ROOT / "bench"))

from bench_attribution import measure as attribution_scaling  # noqa: E402
from bench_recover import TARGET, sequential_read  # noqa: E402

# Runs in a fresh process: imports are not timed (both ways of loading need torch and transformers).
TIMED_LOAD = r"""
import json, sys, time
import torch, transformers, safetensors.torch
import transformers.models.gpt2.modeling_gpt2  # transformers imports lazily: do it before the clock starts
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
how, pkg_parent, pkg_name, weights = sys.argv[1:5]
ids = torch.arange(16).reshape(1, 16)
t = time.perf_counter()
if how == "reuse":
    sys.path.insert(0, pkg_parent)
    model = __import__(pkg_name).load()
    build = 0.0
else:
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    build = time.perf_counter() - t
    t = time.perf_counter()
    model.load_state_dict(safetensors.torch.load_file(weights), strict=False)
elapsed = time.perf_counter() - t
with torch.no_grad():
    y = model(ids).logits
print(json.dumps({"seconds": elapsed, "build": build, "sha": __import__("hashlib").sha256(y.numpy().tobytes()).hexdigest()}))
"""


def zen(*args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True, timeout=1800)
    if r.returncode not in (0, 5):
        raise SystemExit(f"zen {' '.join(map(str, args))} failed:\n{r.stderr[-3000:]}")
    return r


def recovery(work: Path) -> dict:
    script = work / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([sys.executable, str(script), "gpt2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        raise SystemExit("GPT-2 target failed")
    image = work / "gpt2.core"
    try:
        zen("acquire", "--pid", proc.pid, "-o", image)
    finally:
        proc.stdin.close()
        proc.wait()
    with open(image, "rb") as fh:
        os.fsync(fh.fileno())
    cold, warm = sequential_read(image, cold=True), sequential_read(image, cold=False)
    case_dir = work / "gpt2-case"
    sequential_read(image, cold=True)  # recover starts from a cold page cache too
    t = time.perf_counter()
    zen("recover", image, "-o", case_dir)
    wall = time.perf_counter() - t
    run = json.loads((case_dir / "manifest.json").read_text())["run"]
    size = image.stat().st_size
    image.unlink()
    return {"image_bytes": size, "cold": cold, "warm": warm, "recover": wall, "stages": run["seconds"], "case": case_dir}


def reuse_vs_load_state_dict(work: Path, case_dir: Path) -> dict:
    lib = work / "library.sqlite"
    zen("library", "build", ROOT / "recipes" / "transformers.toml", "--only", "gpt2", "--library", lib)
    pkg = work / "rebuilt_gpt2"
    zen("reuse", case_dir, "--base", "gpt2", "--library", lib, "-o", pkg)
    script = work / "timed_load.py"
    script.write_text(TIMED_LOAD)
    runs: dict[str, list[dict]] = {"reuse": [], "load_state_dict": []}
    for _ in range(3):
        for how in runs:
            args = [sys.executable, str(script), how, str(pkg.parent), pkg.name, str(case_dir / "weights.safetensors")]
            r = subprocess.run(args, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise SystemExit(f"{how} failed:\n{r.stderr[-3000:]}")
            runs[how].append(json.loads(r.stdout.strip().splitlines()[-1]))
    med = {how: statistics.median(x["seconds"] for x in rs) for how, rs in runs.items()}
    build = statistics.median(x["build"] for x in runs["load_state_dict"])
    same = len({x["sha"] for rs in runs.values() for x in rs}) == 1
    return {"reuse": med["reuse"], "load_state_dict": med["load_state_dict"], "construct": build, "same_outputs": same}


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="zen-perf-"))
    t0 = time.perf_counter()
    print("GPT-2 (124 M): image, read, recover ...", flush=True)
    rec = recovery(work)
    print("reuse versus load_state_dict ...", flush=True)
    reuse = reuse_vs_load_state_dict(work, rec["case"])
    print("attribution versus library size ...", flush=True)
    attr = attribution_scaling(work / "attribution")
    code = rec["stages"].get("code", 0.0)
    lines = [
        "# Performance ratios (issue 7)", "",
        f"One run of `python bench/perf.py` on {time.strftime('%Y-%m-%d')}: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {time.perf_counter() - t0:.0f} s in all. Target: a full-size transformers "
        f"GPT-2 (124 M parameters) serving process, imaged with `zen acquire --all` ({rec['image_bytes'] / 1e6:,.0f} MB).", "",
        "## Recovery", "",
        "| measure | seconds | ratio |", "|---|---:|---:|",
        f"| read the image once, cold page cache | {rec['cold']:.2f} | 1 |",
        f"| read the image once, cached | {rec['warm']:.2f} | {rec['warm'] / rec['cold']:.2f} |",
        f"| `zen recover` (own process, cold cache, all stages) | {rec['recover']:.2f} | "
        f"**{rec['recover'] / rec['cold']:.2f}× cold read**, "
        f"{rec['recover'] / rec['warm']:.1f}× cached read |",
        f"| PR recovery (`code` stage: census, closure, listings, system table) | {code:.2f} | "
        f"{code / rec['recover']:.0%} of recovery |",
        "", "Stages (s): " + ", ".join(f"{k} {v}" for k, v in rec["stages"].items()) + ".", "",
        "## Reuse versus load_state_dict", "",
        "| measure (fresh process, torch and transformers' GPT-2 modules imported; median of 3) | seconds | ratio |",
        "|---|---:|---:|",
        f"| `load_state_dict` of the recovered tensors into a constructed model | {reuse['load_state_dict']:.2f} | 1 |",
        f"| constructing the model (`GPT2LMHeadModel(GPT2Config())`, random init) | {reuse['construct']:.2f} | "
        f"{reuse['construct'] / reuse['load_state_dict']:.2f} |",
        f"| `zen reuse` package `load()`: patch base code, rebuild object graph, load tensors | {reuse['reuse']:.2f} | "
        f"**{reuse['reuse'] / reuse['load_state_dict']:.2f}× load_state_dict**, "
        f"{reuse['reuse'] / (reuse['construct'] + reuse['load_state_dict']):.2f}× construct + load_state_dict |",
        "", f"Both give identical logits on the same input: {reuse['same_outputs']}.", "",
        "## Attribution versus library size", "",
        "Query: the convnet_se fork recovered from a real image; library: the real convnet base plus perturbed copies, all "
        "sharing code with the query, so every entry is a candidate.", "",
        "| library entries | attribution s (median of 3) | ratio to 10 entries | attributed | fully compared |",
        "|---:|---:|---:|---|---:|",
        *[f"| {n:,} | {t:.2f} | {t / attr[0][1]:.1f} | {a} | {k} |" for n, t, a, k in attr],
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "perf.md").write_text(text)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0 if reuse["same_outputs"] else 1


if __name__ == "__main__":
    sys.exit(main())
