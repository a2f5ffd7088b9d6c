"""Benchmark of programmatic/unified representation recovery (issue 4) on a transformers Llama process.

    python bench/bench_code.py

Starts a process serving a transformers LlamaForCausalLM (small config; the amount of *code* in
memory is what matters here: transformers, accelerate, huggingface_hub... tens of thousands of
functions), images it, and times each step of PR/UR recovery in-process: the runtime index
(census of functions and code objects), the model-code closure, the PR build (listings of the
model code), the system-wide code table, and the UR. Writes bench/results/code.md.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.acquire import acquire  # noqa: E402
from zen.cpython.context import execution_context  # noqa: E402
from zen.cpython.heap import Heap  # noqa: E402
from zen.cpython.interp import Interpreter  # noqa: E402
from zen.cpython.programmatic import build_pr, build_ur, model_closure, system_table  # noqa: E402
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


def main() -> int:
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
    ur = build_ur(rt, [(p, n.type.addr) for p, n in walk], pr, result)
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
