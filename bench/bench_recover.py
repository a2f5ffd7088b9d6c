"""Benchmark of `zen recover` on model-serving processes of realistic size, measured in one run.

    python bench/bench_recover.py [--only gpt2|resnet50]

For a GPT-2-small-size process (transformers GPT2LMHeadModel, default config, 124M parameters)
and a ResNet-50-size process (a standard bottleneck ResNet-50, 25.6M parameters, defined here
because torchvision has no CPU build for this torch): image the process with `zen acquire`, time
one sequential read of the image (evicted from the page cache first, and page-cached), then run
`zen recover` as a separate process and record its wall time and peak RSS.

Writes bench/results/recover.md. Targets from issue 3: recover time <= 2x one sequential read;
peak RSS <= 25% of the model's bytes + 300 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.acquire.process import acquire  # noqa: E402

TARGET = r"""
import sys, torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)

class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False); self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False); self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False); self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + idt)

class ResNet50(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False); self.bn1 = nn.BatchNorm2d(64); self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            seq = []
            for i in range(blocks):
                seq.append(Bottleneck(cin, width, stride if i == 0 else 1)); cin = width * 4
            layers.append(nn.Sequential(*seq))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1); self.fc = nn.Linear(2048, 1000)
    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))

if sys.argv[1] == "gpt2":
    import transformers
    transformers.logging.set_verbosity_error()
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    x = torch.randint(0, 50257, (1, 16))
else:
    model = ResNet50().eval()
    x = torch.randn(1, 3, 224, 224)
with torch.no_grad():
    y = model(x)
print("READY", sum(p.numel() * p.element_size() for p in model.parameters()) +
      sum(b.numel() * b.element_size() for b in model.buffers()), flush=True)
sys.stdin.read()
"""


def fresh_bytecode() -> None:
    """zen's modules compiled to bytecode before anything is timed. Where PYTHONDONTWRITEBYTECODE is set (as on the
    machines these benches ran on), a module edited since its .pyc was written is compiled from source again in
    every process: 25 ms of each `zen attribute` run on 2026-12-06 (three edited modules), which no installed zen
    pays (pip compiles at install, an editable install writes the .pyc on first import)."""
    import compileall

    compileall.compile_dir(str(ROOT / "src" / "zen"), quiet=1)


def sequential_read(path: Path, cold: bool) -> float:
    with open(path, "rb", buffering=0) as fh:
        if cold:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t = time.perf_counter()
        while fh.read(16 << 20):
            pass
        return time.perf_counter() - t


def bench(name: str, work: Path) -> dict:
    script = work / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([sys.executable, str(script), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        raise SystemExit(f"{name} target failed")
    model_bytes = int(line[1])
    image = work / f"{name}.core"
    res = acquire(proc.pid, image)
    proc.stdin.close()
    proc.wait()
    with open(image, "rb") as fh:
        os.fsync(fh.fileno())
    cold = sequential_read(image, cold=True)
    warm = sequential_read(image, cold=False)
    case = work / f"{name}-case"
    t = time.perf_counter()
    # GNU time reports this one child's peak RSS (RUSAGE_CHILDREN would keep the max over all children)
    r = subprocess.run(["/usr/bin/time", "-f", "ZEN_MAXRSS_KB=%M", sys.executable, "-m", "zen", "recover", str(image),
                        "-o", str(case)], capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t
    rss_kb = int(next(x for x in r.stderr.split() if x.startswith("ZEN_MAXRSS_KB=")).split("=")[1])
    if r.returncode not in (0, 5):
        raise SystemExit(f"zen recover failed: {r.stderr}")
    manifest = json.loads((case / "manifest.json").read_text())
    mr = json.loads((case / "mr.json").read_text())
    image.unlink()
    return {
        "name": name, "image_mb": res.bytes_written / 1e6, "model_mb": model_bytes / 1e6, "cold": cold, "warm": warm,
        "wall": wall, "rss_mb": rss_kb / 1024, "stages": manifest["run"]["seconds"],
        "params": mr["summary"]["parameter_elements"], "tensors": mr["summary"]["state_dict_entries"],
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["gpt2", "resnet50"])
    args = ap.parse_args()
    fresh_bytecode()
    work = Path(tempfile.mkdtemp(prefix="zen-bench-recover-"))
    try:
        rows = [bench(n, work) for n in (["gpt2", "resnet50"] if not args.only else [args.only])]
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the recovered cases hold the models' weights (500 MB for GPT-2)
    lines = [
        "# Recovery benchmark (issue 3)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
        "Images: `zen acquire --all`. `zen recover` runs as its own process (wall time includes interpreter start-up "
        "and imports, ~0.5 s); peak RSS is that process's maximum resident set.",
        "",
        "| process | params | model MB | image MB | read cold s | read cached s | recover s | ÷ cold read | ÷ cached read "
        "| peak RSS MB | RSS target MB | stages s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        target = 0.25 * r["model_mb"] + 300
        lines.append(
            f"| {r['name']} | {r['params']:,} | {r['model_mb']:,.0f} | {r['image_mb']:,.0f} | {r['cold']:.2f} | {r['warm']:.2f} "
            f"| {r['wall']:.2f} | {r['wall'] / r['cold']:.2f} | {r['wall'] / r['warm']:.2f} | {r['rss_mb']:,.0f} | {target:,.0f} "
            f"| {', '.join(f'{k} {v}' for k, v in r['stages'].items())} |"
        )
    lines += ["", "Targets: recover ≤ 2× one sequential read; peak RSS ≤ 25% of the model's bytes + 300 MB."]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench" / "results" / "recover.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
