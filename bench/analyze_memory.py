"""Peak memory of `zen analyze` on a large real model (issue 49.4), against the model's own bytes, in one run.

    python bench/analyze_memory.py [--hidden 16384] [-o bench/results/analyze_memory.md]

A real process builds a wide MLP classifier (`--hidden` sets its width: 16384 gives 1.1 GB of float32 weights) and
keeps a batch of inputs beside it; it is imaged with `zen acquire --lean`, recovered with `zen recover`, and
`zen analyze` runs FGSM on the case through the CLI. The analysis child's peak RSS is read from the kernel
(RUSAGE_CHILDREN of a wrapper that only waits for zen: the largest of zen and its children) and divided by the
model's tensor bytes. The child must hold the model once: the ratio says how many copies it made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGET = """
import json, os, sys
import torch
from torch import nn

torch.manual_seed(0)
hidden = int(sys.argv[2])
model = nn.Sequential(nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))
model.eval()
x = torch.rand(8, 256)
with torch.no_grad():
    y = model(x)
nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
json.dump({"pid": os.getpid(), "nbytes": nbytes}, open(os.path.join(sys.argv[1], "truth.json"), "w"))
print("READY", flush=True)
sys.stdin.read()
"""

WRAPPER = """
import resource, subprocess, sys, time
t0 = time.monotonic()
rc = subprocess.run(sys.argv[1:]).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, time.monotonic() - t0)
"""


def zen(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True, timeout=3600)


def measure(hidden: int, work: Path) -> dict:
    script = work / "wide_target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([sys.executable, str(script), str(work), str(hidden)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    if proc.stdout.readline().strip() != "READY":
        proc.kill()
        raise SystemExit("the target did not start")
    truth = json.loads((work / "truth.json").read_text())
    image, case, out = work / "wide.core", work / "case", work / "analysis"
    try:
        res = zen("acquire", "--pid", truth["pid"], "-o", image, "--lean")
        if res.returncode:
            raise SystemExit(res.stderr)
    finally:
        proc.stdin.close()
        proc.wait(60)
    res = zen("recover", image, "-o", case)
    image.unlink()
    if res.returncode:
        raise SystemExit(res.stderr)
    cmd = [sys.executable, "-m", "zen", "analyze", case, "-o", out, "--attack", "fgsm", "--eps", "0.03", "--batch-size", "8"]
    done = subprocess.run([sys.executable, "-c", WRAPPER, *map(str, cmd)], capture_output=True, text=True, timeout=3600)
    rc, peak, secs = done.stdout.split()[-3:]
    return {"hidden": hidden, "model_bytes": truth["nbytes"], "rc": int(rc), "peak": int(peak), "seconds": float(secs),
            "ratio": int(peak) / truth["nbytes"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zen-analyze-mem-") as tmp:
        row = measure(args.hidden, Path(tmp))
    line = (f"| {row['hidden']} | {row['model_bytes'] / 1e9:.2f} GB | {row['rc']} | {row['peak'] / 1e9:.2f} GB | "
            f"{row['ratio']:.2f} | {row['seconds']:.1f} |")  # fmt: skip
    print(json.dumps(row))
    print(line)
    if args.output:
        text = args.output.read_text() if args.output.exists() else (
            "# zen analyze: peak memory against the model's bytes (bench/analyze_memory.py)\n\n"
            "| hidden | model tensors | exit | peak RSS (zen and its child) | peak / model | seconds |\n"
            "|---|---|---|---|---|---|\n")  # fmt: skip
        args.output.write_text(text + line + f" <!-- {time.strftime('%Y-%m-%d')}, load {os.getloadavg()[0]:.1f} -->\n")


if __name__ == "__main__":
    main()
