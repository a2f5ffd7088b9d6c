"""`zen drift` on two snapshots of a 1.5 B-parameter model (issue 49.4): peak RSS and seconds, in one run.

    python bench/drift_scale.py [--model llama-bf16] [-o bench/results/drift_scale.md]

The deployed process of bench/bench_scale.py (a transformers model of 1.57 B parameters, bf16 by default) is imaged
with `zen acquire --lean`; it then changes its weights in place (noise added to every fourth decoder layer's MLP,
as an online update would) and is imaged again. Both images are recovered with `zen recover`, and `zen drift`
compares the two cases; every zen command runs under GNU time, so its peak RSS is that process's own. The drift
must find exactly the layers the process changed. Images and cases live in a temporary directory (about 13 GB for
the bf16 model; the free space is checked first) and are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_scale import MODELS, TARGET, timed  # noqa: E402

# after READY: a line "perturb" adds noise to the MLPs of layers 0, 4, 8, ... and prints PERTURBED with their names
PERTURB = r"""
for line in sys.stdin:
    if line.strip() == "perturb":
        changed = []
        with torch.no_grad():
            for name, p in model.named_parameters():
                parts = name.split(".")
                if "mlp" in parts and "layers" in parts and int(parts[parts.index("layers") + 1]) % 4 == 0:
                    p.add_((torch.randn(p.shape, generator=torch.Generator().manual_seed(len(changed))) * 0.01).to(p.dtype))
                    changed.append(name)
        print("PERTURBED", json.dumps(changed), flush=True)
"""


def zen(*args) -> tuple[subprocess.CompletedProcess, float, float]:
    r, wall, rss = timed([sys.executable, "-m", "zen", *args])
    if r.returncode not in (0, 5):
        raise SystemExit(f"zen {' '.join(map(str, args))} failed:\n{r.stderr[-3000:]}")
    return r, wall, rss


def run(name: str, work: Path) -> dict:
    spec = MODELS[name]
    script = work / "target.py"
    script.write_text(TARGET.replace("sys.stdin.read()\n", PERTURB))
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    ready = proc.stdout.readline().split()
    if not ready or ready[0] != "READY":
        proc.kill()
        raise SystemExit("the target did not start")
    size, params = int(ready[1]), int(ready[2])
    row: dict = {"model": name, "parameters": params, "bytes": size}
    try:
        _, row["acquire_s"], row["acquire_rss"] = zen("acquire", "--pid", proc.pid, "-o", work / "t0.core", "--lean")
        proc.stdin.write("perturb\n")
        proc.stdin.flush()
        line = proc.stdout.readline().split(" ", 1)
        changed = json.loads(line[1]) if line[0] == "PERTURBED" else []
        zen("acquire", "--pid", proc.pid, "-o", work / "t1.core", "--lean")
    finally:
        proc.stdin.close()
        proc.wait(120)
    for i in (0, 1):
        _, row[f"recover{i}_s"], row[f"recover{i}_rss"] = zen("recover", work / f"t{i}.core", "-o", work / f"c{i}")
        (work / f"t{i}.core").unlink()
    r, row["drift_s"], row["drift_rss"] = zen("drift", work / "c0", work / "c1", "-o", work / "drift", "--json")
    doc = json.loads((work / "drift" / "drift.json").read_text())
    moved = {t["name"] for t in doc["tensors"] if t.get("first_changed") is not None}
    row["changed_by_process"], row["changed_by_drift"] = len(changed), len(moved)
    row["same_tensors"] = moved == set(changed)
    row["rc"] = r.returncode
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-bf16", choices=sorted(MODELS))
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "drift_scale.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zen-drift-scale-") as tmp:
        need = 4.5 * {"bfloat16": 2, "float32": 4}[MODELS[args.model]["dtype"]] * 1.6e9
        if shutil.disk_usage(tmp).free < need:
            raise SystemExit(f"needs about {need / 1e9:.0f} GB free in {tmp}")
        t0 = time.monotonic()
        row = run(args.model, Path(tmp))
    print(json.dumps(row))
    same = "the same" if row["same_tensors"] else "DIFFERENT"
    line = (f"| {row['model']} | {row['parameters'] / 1e9:.2f} B | {row['bytes'] / 1e9:.2f} GB | {row['recover0_s']:.0f} s, "
            f"{row['recover0_rss']:.0f} MB | {row['drift_s']:.1f} s | **{row['drift_rss']:.0f} MB** | "
            f"{row['changed_by_drift']} / {row['changed_by_process']} ({same}) |")  # fmt: skip
    head = ("# `zen drift` at 1.5 B parameters (bench/drift_scale.py)\n\n"
            "| model | parameters | tensors | recover (each) | drift | drift peak RSS | tensors changed: drift / process |\n"
            "|---|---|---|---|---|---|---|\n")  # fmt: skip
    text = args.output.read_text() if args.output.exists() else head
    note = f" <!-- {time.strftime('%Y-%m-%d')}, {time.monotonic() - t0:.0f} s in all, load {os.getloadavg()[0]:.1f} -->"
    args.output.write_text(text + line + note + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
