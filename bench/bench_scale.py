"""Recovery and scale benchmark (issue 16, targets 2 and 3), every ratio measured within one run.

    python bench/bench_scale.py [--only NAME ...] [--no-write]

For each model below a real transformers process is deployed (random init, one inference), imaged
with `zen acquire`, read sequentially from a cold page cache (the unit of every ratio) and
recovered with `zen recover` from a cold page cache, three times each, alternated (the ratio is of
the medians: this machine's virtual disk serves the same file at 0.7-3 GB/s from one minute to
the next), and for the billion-parameter models rebuilt
with `zen reuse` and loaded (`PKG.load()`) in a fresh process, against `load_state_dict` of the
same recovered tensors into a constructed model. Every zen command runs under GNU time: its peak
RSS is that zen process's own (the deployed and the loading processes hold the model and are
bigger by nature).

    gpt2         transformers GPT2LMHeadModel(GPT2Config()), 124 M parameters, fp32
    llama        a Llama-architecture model of 221 M parameters (12 layers, hidden 1024), fp32
    gpt2-xl      GPT-2 XL's configuration (48 layers, hidden 1600), 1.56 B parameters, fp32 (6.2 GB)
    llama-bf16   a Llama configuration of 1.57 B parameters (24 layers, hidden 2048), bf16 (3.1 GB)

Targets: recover <= 2x the cold read and the `code` stage <= 1 s (gpt2, llama); for the 1.5 B
models zen's peak RSS <= 2 GB in acquire, recover and reuse, recover <= 2x the cold read and
reuse load <= 2x load_state_dict. Building 1.5 B parameters with torch's initialisers takes minutes
on two cores: the target skips them (`transformers.initialization.no_init_weights`) and fills every
parameter from one seeded random block instead. Images go to a temporary directory (about 7 GB for
gpt2-xl; the free space is checked first) and are deleted as soon as each model is done.

Writes the "Recovery" and "Scale" sections of bench/results/perf.md (other sections are kept).
"""

from __future__ import annotations

import argparse
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

from bench_recover import fresh_bytecode, sequential_read  # noqa: E402

MODELS = {
    "gpt2": {"family": "gpt2", "config": {}, "dtype": "float32", "reuse": False},
    "llama": {"family": "llama", "dtype": "float32", "reuse": False,
              "config": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12,
                         "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000}},
    "gpt2-xl": {"family": "gpt2", "dtype": "float32", "reuse": True, "config": {"n_embd": 1600, "n_layer": 48, "n_head": 25}},
    "llama-bf16": {"family": "llama", "dtype": "bfloat16", "reuse": True,
                   "config": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                              "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000}},
}  # fmt: skip

# The deployed process: argv[1] is the JSON spec above. Prints READY and its model's bytes.
TARGET = r"""
import json, sys, torch, transformers
from transformers.initialization import no_init_weights
spec = json.loads(sys.argv[1])
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
torch.manual_seed(0)
cls = {"gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
       "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[spec["family"]]
dtype = getattr(torch, spec["dtype"])
torch.set_default_dtype(dtype)
with no_init_weights():  # torch's initialisers take minutes for 1.5 B parameters on two cores
    model = cls[1](cls[0](**spec["config"])).eval()
torch.set_default_dtype(torch.float32)
model.tie_weights()  # as constructing with initialisers would (GPT-2 ties lm_head to wte; Llama does not)
block = (torch.randn(1 << 22) * 0.02).to(dtype)
with torch.no_grad():
    for i, p in enumerate(model.parameters()):  # deterministic, cheap, different per tensor
        flat, n, pos = p.view(-1), p.numel(), 0
        start = (i * 7919) % block.numel()
        while pos < n:
            k = min(n - pos, block.numel() - start)
            flat[pos:pos + k].copy_(block[start:start + k])
            pos, start = pos + k, 0
    x = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    model(x)
size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
print("READY", size, sum(p.numel() for p in model.parameters()), flush=True)
sys.stdin.read()
"""

# Both ways of loading run in a fresh process with torch and transformers' model modules imported.
TIMED_LOAD = r"""
import json, sys, time, hashlib
import torch, transformers, safetensors.torch
from transformers.initialization import no_init_weights
import transformers.models.gpt2.modeling_gpt2, transformers.models.llama.modeling_llama
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
how, pkg_parent, pkg_name, weights, spec = sys.argv[1:6]
spec = json.loads(spec)
t = time.perf_counter()
if how == "reuse":
    sys.path.insert(0, pkg_parent)
    model = __import__(pkg_name).load()
    build = 0.0
else:
    cls = {"gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
           "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[spec["family"]]
    torch.set_default_dtype(getattr(torch, spec["dtype"]))
    with no_init_weights():  # the cheapest construction there is: load_state_dict alone is timed
        model = cls[1](cls[0](**spec["config"])).eval()
    torch.set_default_dtype(torch.float32)
    model.tie_weights()
    build = time.perf_counter() - t
    t = time.perf_counter()
    model.load_state_dict(safetensors.torch.load_file(weights), strict=False)
elapsed = time.perf_counter() - t
x = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    y = model(x).logits
print(json.dumps({"seconds": elapsed, "build": build, "sha": hashlib.sha256(y.float().numpy().tobytes()).hexdigest()}))
"""


REPEATS = 3  # cold reads and cold recoveries per model, alternated; medians reported
CPU: dict[str, float] = {}  # CPU seconds (user + system) of the last process `timed` ran, by command


def timed(cmd: list, timeout: int = 3600) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run under GNU time: (result, wall seconds, peak RSS MB of that process); its CPU seconds
    go to CPU["last"] (on a machine shared with other work, CPU time says what wall time cannot)."""
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "ZEN_MAXRSS_KB=%M ZEN_CPU=%U+%S", *map(str, cmd)], capture_output=True,
                       text=True, timeout=timeout)  # fmt: skip
    wall = time.perf_counter() - t
    words = r.stderr.split()
    kb = [x for x in words if x.startswith("ZEN_MAXRSS_KB=")]
    cpu = [x for x in words if x.startswith("ZEN_CPU=")]
    CPU["last"] = sum(float(v) for v in cpu[-1].split("=")[1].split("+")) if cpu else float("nan")
    return r, wall, int(kb[-1].split("=")[1]) / 1024 if kb else float("nan")


def zen(*args) -> tuple[subprocess.CompletedProcess, float, float]:
    r, wall, rss = timed([sys.executable, "-m", "zen", *args])
    if r.returncode not in (0, 5):
        raise SystemExit(f"zen {' '.join(map(str, args))} failed:\n{r.stderr[-3000:]}")
    return r, wall, rss


def sha256_rate() -> float:
    """Bytes per second one core hashes with sha256 here (hashlib, 256 MB from memory)."""
    import hashlib

    block = bytes(range(256)) * (1 << 16)  # 16 MB
    h = hashlib.sha256()
    t = time.perf_counter()
    for _ in range(16):
        h.update(block)
    return 16 * len(block) / (time.perf_counter() - t)


def hash_floor(image_bytes: int, model_bytes: int, rate: float) -> float:
    """Seconds the three sha256 digests of a case take at the least on two cores: the image (one
    stream, one core at most) and the tensors twice (each tensor's digest and the weights file's),
    all at `rate`. Recovery cannot be faster than this while the case records those digests."""
    image, tensors = image_bytes / rate, 2 * model_bytes / rate
    return max(image, (image + tensors) / 2)


def drop_cache(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def bench(name: str, work: Path) -> dict:
    spec = MODELS[name]
    script = work / "target.py"
    script.write_text(TARGET)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        raise SystemExit(f"{name} target failed")
    deploy = time.perf_counter() - t
    model_bytes, params = int(line[1]), int(line[2])
    need = 1.3 * model_bytes + 3e9  # image (model + runtime), weights file, margin
    free = shutil.disk_usage(work).free
    if free < need:
        proc.kill()
        raise SystemExit(f"{name}: {free / 1e9:.1f} GB free in {work}, about {need / 1e9:.1f} GB needed")
    image = work / f"{name}.core"
    try:
        _, acquire_s, acquire_rss = zen("acquire", "--pid", proc.pid, "-o", image)
    finally:
        proc.stdin.close()
        proc.wait()
    # The virtual disk here serves the same file at 0.7-3 GB/s from one minute to the next: cold
    # reads and cold recoveries alternate, and the ratio is of their medians.
    case = work / f"{name}-case"
    colds, runs = [], []
    load = os.getloadavg()[0]
    for _ in range(REPEATS):
        drop_cache(image)
        colds.append(sequential_read(image, cold=True))
        shutil.rmtree(case, ignore_errors=True)
        drop_cache(image)  # recover starts from a cold page cache too
        _, recover_s, recover_rss = zen("recover", image, "-o", case)
        manifest = json.loads((case / "manifest.json").read_text())
        runs.append({"recover": recover_s, "rss": recover_rss, "cpu": CPU["last"], "stages": manifest["run"]["seconds"]})
    mid = sorted(runs, key=lambda r: r["recover"])[len(runs) // 2]
    rate = sha256_rate()
    out = {"name": name, "params": params, "dtype": spec["dtype"], "model_bytes": model_bytes,
           "image_bytes": image.stat().st_size, "deploy": deploy, "acquire": acquire_s, "acquire_rss": acquire_rss,
           "cold": statistics.median(colds), "colds": colds, "recover": mid["recover"],
           "recovers": [r["recover"] for r in runs], "sha256_rate": rate,
           "hash_floor": hash_floor(image.stat().st_size, model_bytes, rate),
           "recover_rss": max(r["rss"] for r in runs), "recover_cpu": mid["cpu"], "load": load, "stages": mid["stages"],
           "status": manifest["status"]}  # fmt: skip
    image.unlink()
    if spec["reuse"]:
        out.update(reuse(work, case, spec))
    shutil.rmtree(case, ignore_errors=True)
    return out


def reuse(work: Path, case: Path, spec: dict) -> dict:
    pkg = work / "rebuilt"
    shutil.rmtree(pkg, ignore_errors=True)
    _, reuse_s, reuse_rss = zen("reuse", case, "-o", pkg)
    script = work / "timed_load.py"
    script.write_text(TIMED_LOAD)
    runs: dict[str, list[dict]] = {"reuse": [], "load_state_dict": []}
    for _ in range(2):
        for how in runs:
            r, _, rss = timed([sys.executable, script, how, pkg.parent, pkg.name, case / "weights.safetensors", json.dumps(spec)])
            if r.returncode != 0:
                raise SystemExit(f"{how} failed:\n{r.stderr[-3000:]}")
            runs[how].append({**json.loads(r.stdout.strip().splitlines()[-1]), "rss": rss})
    shutil.rmtree(pkg, ignore_errors=True)
    med = {how: statistics.median(x["seconds"] for x in rs) for how, rs in runs.items()}
    return {"reuse_cmd": reuse_s, "reuse_rss": reuse_rss, "load_s": med["reuse"], "load_state_dict": med["load_state_dict"],
            "load_rss": max(x["rss"] for x in runs["reuse"]), "lsd_rss": max(x["rss"] for x in runs["load_state_dict"]),
            "same_outputs": len({x["sha"] for rs in runs.values() for x in rs}) == 1}  # fmt: skip


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def tables(rows: list[dict], seconds: float) -> tuple[str, str]:
    head = (f"One run of `python bench/bench_scale.py` on {time.strftime('%Y-%m-%d')}: {platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}, {seconds:.0f} s in all. Images: `zen acquire` "
            "(all readable mappings); the cold read and `zen recover` both start from a cold page cache of the image "
            f"(`posix_fadvise(DONTNEED)`), {REPEATS} of each, alternated: medians (range in parentheses; the virtual disk "
            "serves the same file at very different speeds from one minute to the next), the ratio of the medians; "
            "recover's wall time includes its interpreter start-up and imports. The machine is "
            "shared: \"load avg\" is the 1-minute load average when recover started (2 cores; above 2, other work took "
            "CPU from zen and its wall time grew with it; its CPU time did not).")  # fmt: skip
    small = [r for r in rows if not MODELS[r["name"]]["reuse"]]
    big = [r for r in rows if MODELS[r["name"]]["reuse"]]
    rec = [head, "", "| process | params | image MB | cold read s | `zen recover` s | ÷ cold read | sha256 floor s "
           "| ÷ cold read | recover CPU s | code stage s | peak RSS MB | load avg | stages s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in small:
        rec.append(f"| {r['name']} | {r['params'] / 1e6:,.0f} M | {r['image_bytes'] / 1e6:,.0f} | {r['cold']:.2f} "
                   f"({_span(r['colds'])}) | {r['recover']:.2f} ({_span(r['recovers'])}) | **{r['recover'] / r['cold']:.2f}** | "
                   f"{r['hash_floor']:.2f} | "
                   f"{r['hash_floor'] / r['cold']:.2f} | {r['recover_cpu']:.2f} | **{r['stages'].get('code', 0):.2f}** | "
                   f"{r['recover_rss']:,.0f} | {r['load']:.1f} | "
                   f"{', '.join(f'{k} {v}' for k, v in r['stages'].items())} |")  # fmt: skip
    rec += ["", "Targets: `zen recover` ≤ 2× the cold read; the `code` stage (census of code, closure, listings, system "
            "table, PR/UR) ≤ 1 s. \"recover CPU\" counts zen and the children it forks (image digest, tensor files, "
            "parts of the code stage). \"sha256 floor\": the time the case's three sha256 digests (the image; each "
            "tensor; the weights file) take at the least on two cores at this machine's single-core sha256 rate "
            f"({rows[0]['sha256_rate'] / 1e9 if rows else 0:.2f} GB/s): no recovery that records them is faster."]  # fmt: skip
    sc = [head, "", "| model | params | dtype | model GB | image GB | acquire s (RSS MB) | cold read s | recover s (RSS MB) "
          "| ÷ cold read | sha256 floor s (÷ cold read) | recover CPU s | load avg | `zen reuse` s (RSS MB) | load() s "
          "| load_state_dict s | ÷ load_state_dict | same logits |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in big:
        sc.append(f"| {r['name']} | {r['params'] / 1e9:.2f} B | {r['dtype']} | {r['model_bytes'] / 1e9:.2f} | "
                  f"{r['image_bytes'] / 1e9:.2f} | {r['acquire']:.1f} ({r['acquire_rss']:,.0f}) | {r['cold']:.2f} "
                  f"({_span(r['colds'])}) | {r['recover']:.2f} ({_span(r['recovers'])}; {r['recover_rss']:,.0f}) | "
                  f"**{r['recover'] / r['cold']:.2f}** | "
                  f"{r['hash_floor']:.1f} ({r['hash_floor'] / r['cold']:.2f}) | "
                  f"{r['recover_cpu']:.1f} | {r['load']:.1f} | {r['reuse_cmd']:.1f} ({r['reuse_rss']:,.0f}) | "
                  f"{r['load_s']:.2f} | {r['load_state_dict']:.2f} | "
                  f"**{r['load_s'] / r['load_state_dict']:.2f}** | {r['same_outputs']} |")  # fmt: skip
    sc += ["", "Stages of `zen recover` (s): " + "; ".join(
        f"{r['name']}: " + ", ".join(f"{k} {v}" for k, v in r["stages"].items()) for r in big) + ".", "",
        "Targets: zen's peak RSS ≤ 2 GB (acquire, recover, reuse: the RSS columns; with forked children, the largest "
        "single zen process); recover ≤ 2× the cold read (\"sha256 floor\": as in the recovery table); "
        "`load()` ≤ 2× `load_state_dict` (median of 2 fresh processes each; `load_state_dict` of the recovered "
        "tensors into a model constructed without initialisers, construction not counted; the loading processes hold "
        "the model: " + ", ".join(f"{r['name']} load() {r['load_rss']:,.0f} MB, load_state_dict {r['lsd_rss']:,.0f} MB"
                                  for r in big) + ")."]  # fmt: skip
    return "\n".join(rec), "\n".join(sc)


def write_sections(sections: dict[str, str]) -> None:
    """Replace (or append) `## TITLE` sections of perf.md, keeping every other section."""
    path = ROOT / "bench" / "results" / "perf.md"
    text = path.read_text() if path.exists() else "# Performance ratios\n"
    for title, body in sections.items():
        block = f"## {title}\n\n{body}\n\n"
        start = text.find(f"## {title}\n")
        if start < 0:
            text = text.rstrip("\n") + "\n\n" + block
            continue
        end = text.find("\n## ", start + 1)
        text = text[:start] + block + (text[end + 1 :] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=list(MODELS), help="models to run (default: all)")
    ap.add_argument("--no-write", action="store_true", help="print the tables, leave perf.md alone")
    args = ap.parse_args()
    fresh_bytecode()
    work = Path(tempfile.mkdtemp(prefix="zen-bench-scale-"))
    t0 = time.perf_counter()
    rows = []
    try:
        for name in args.only or list(MODELS):
            print(f"{name} ...", flush=True)
            rows.append(bench(name, work))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec, sc = tables(rows, time.perf_counter() - t0)
    print(rec + "\n\n" + sc)
    if not args.no_write:
        sections = {}
        if any(not MODELS[r["name"]]["reuse"] for r in rows):
            sections["Recovery (issue 16, target 2)"] = rec
        if any(MODELS[r["name"]]["reuse"] for r in rows):
            sections["Scale: 1.5 B parameters (issue 16, target 3)"] = sc
        write_sections(sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
