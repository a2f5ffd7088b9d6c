"""Benchmark `zen decompile` (issue 19, NeuroDeX-style table): build TVM libraries of several models,
fused and unfused, stripped and not; decompile each; report kernel (operator) recovery, attribute
accuracy against the original layers, and model-level equivalence with the executable.

    python bench/decompile.py [-o bench/results/decompile.md] [MODEL ...]
    python bench/decompile.py --arch aarch64 [-o bench/results/decompile_aarch64.md] [MODEL ...]

`--arch aarch64` (issue 53): every library compiled for aarch64-linux-gnu (Debian's cross gcc links it, its
strip strips it) and decompiled on this machine, its kernels probed and checked through zen's emulated runtime
(`python -m zen.compiled.emulation build aarch64` first).

Models come from tests/targets/tvm_models.py (built in a child process with TVM and torch).
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

ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "tests" / "targets" / "tvm_models.py"
DEFAULT = [
    "cnn",
    "mlp",
    "deep_mlp",
    "resnet",
    "lenet",
    "conv1d",
    "encoder",
    "encoder_mha",
    "hf_bert_tiny",
    "hf_distilbert_tiny",
    "tv_resnet18",
    "tv_mobilenet_v2",
    "tv_mobilenet_v3_small",
    "tv_squeezenet",
    "tv_shufflenet",
    "tv_mnasnet",
    "tv_regnet_x_400mf",
    "tv_efficientnet_b0",
    "tv_densenet121",
    "timm_resnet10t",
    "timm_vit_tiny",
    "timm_convnext_atto",
    "timm_mixer",
    "timm_ghostnet",
    "mobile",
]
ARM_DEFAULT = ["cnn", "mlp", "resnet", "lenet", "conv1d", "encoder", "mobile", "int8_mlp"]
EQUIVALENT = 1e-5  # max abs difference, relative to the largest output magnitude (1 + max |y|)


def attr_match(graph: dict, truth: dict) -> tuple[int, int]:
    """(layers whose probed attributes equal the original's, layers with attributes), as multisets."""
    found: dict[str, list] = {}
    for n in graph["nodes"]:
        for op in (n.get("attrs") or {}).get("ops", []):
            found.setdefault(op["op"], []).append(op)
    keys = {
        "conv2d": ("stride", "padding", "dilation", "groups"),
        "conv1d": ("stride", "padding", "dilation", "groups"),
        "max_pool2d": ("kernel", "stride", "padding"),
        "batch_norm": ("eps",),
        "layer_norm": ("eps",),
    }
    good = total = 0
    for kind, ks in keys.items():
        want = sorted(tuple(layer[k] for k in ks) for layer in truth["layers"] if layer["type"] == kind)
        got = sorted(tuple(o.get(k) for k in ks) for o in found.get(kind, []))
        total += len(want)
        for w in want:
            if w in got:
                got.remove(w)
                good += 1
    return good, total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--arch", choices=["x86_64", "aarch64"], default="x86_64")
    ap.add_argument("-o", "--output", type=Path)
    ap.add_argument("--no-strip", action="store_true", help="skip the stripped copies (stripping changes nothing measured)")
    args = ap.parse_args()
    arm = args.arch == "aarch64"
    args.models = args.models or (ARM_DEFAULT if arm else DEFAULT)
    args.output = args.output or ROOT / "bench" / "results" / ("decompile_aarch64.md" if arm else "decompile.md")
    suffix, strip = ("@aarch64", "aarch64-linux-gnu-strip") if arm else ("", "strip")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows: list[dict] = []
    failed: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        specs = [m + suffix for m in args.models] + [m + ":unfused" + suffix for m in args.models]
        for spec in specs:  # one child per model: a model TVM cannot compile is reported, not fatal
            b = subprocess.run([sys.executable, str(BUILDER), str(tmp), spec], capture_output=True, text=True)
            if b.returncode != 0:  # TVM's (or the exporter's) own failure, recorded in the table's notes
                failed.append((spec, (b.stderr.strip().splitlines() or ["?"])[-1][:200]))
                print(f"build {spec} failed: {failed[-1][1]}", flush=True)
        libs = sorted(tmp.glob("*.so"))
        if shutil.which(strip) and not args.no_strip:
            for lib in list(libs):
                s = tmp / f"{lib.stem}_stripped.so"
                subprocess.run([strip, "--strip-all", "-o", str(s), str(lib)], check=True)
                libs.append(s)
        for lib in libs:
            base = lib.stem.replace("_stripped", "")
            truth = json.loads((tmp / f"{base}.json").read_text())
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "zen", "decompile", str(lib), "-o", str(tmp / f"pkg_{lib.stem}")],
                capture_output=True,
                text=True,
                env=env,
            )
            secs = time.monotonic() - t0
            try:
                man = json.loads((tmp / f"pkg_{lib.stem}" / "manifest.json").read_text())
                graph = json.loads((tmp / f"pkg_{lib.stem}" / "graph.json").read_text())
            except (OSError, ValueError):  # zen refused the library: its one-line error goes in the table
                why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                man, graph = {"rebuilt": False, "problems": [why]}, {"nodes": []}
            kernels = [n for n in graph["nodes"] if not n["builtin"]]
            ok = sum(1 for n in kernels if (n.get("attrs") or {}).get("status") == "ok")
            good, total = attr_match(graph, truth)
            eq = man.get("equivalence") or {}
            rows.append(
                {
                    "library": lib.stem,
                    "size_kb": lib.stat().st_size // 1024,
                    "kernels": len(kernels),
                    "resolved": ok,
                    "attrs": f"{good}/{total}",
                    "rebuilt": man["rebuilt"],
                    "max_abs_diff": eq.get("max_abs_diff"),
                    "max_abs_output": eq.get("max_abs_output") or 0.0,
                    "tvm_vs_torch": truth["tvm_vs_torch"],
                    "seconds": round(secs, 1),
                    "rc": proc.returncode,
                    "problems": "; ".join(man["problems"])[:160],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            write(args.output, rows, failed, args.arch)  # rewritten after every library: a sweep leaves partial results
    write(args.output, rows, failed, args.arch)
    return 0


def write(path: Path, rows: list[dict], failed: list[tuple[str, str]] = (), arch: str = "x86_64") -> None:
    n = len(rows)
    eq = sum(
        1
        for r in rows
        if r["rebuilt"] and r["max_abs_diff"] is not None and r["max_abs_diff"] < EQUIVALENT * (1 + r["max_abs_output"])
    )
    k_all = sum(r["kernels"] for r in rows)
    k_ok = sum(r["resolved"] for r in rows)
    a_good = sum(int(r["attrs"].split("/")[0]) for r in rows)
    a_all = sum(int(r["attrs"].split("/")[1]) for r in rows)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"# `zen decompile` benchmark (TVM 0.27 relax VM libraries, llvm target, CPU, {arch})",
        "",
        *(
            [
                "The same models compiled for aarch64 and decompiled here under emulation (issue 53):",
                "`python bench/decompile.py --arch aarch64` -> `decompile_aarch64.md`.",
                "",
            ]
            if arch == "x86_64"
            else [
                "Libraries compiled for aarch64-linux-gnu (+neon) and decompiled on the x86_64 machine below: their",
                "kernels ran in zen's emulated aarch64 TVM runtime (qemu-user), for probing and for the equivalence",
                "check alike; *tvm vs torch* is the library run that way against the original model.",
                "",
            ]
        ),
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}; run {when}.",
        "",
        f"Generated by `python bench/decompile.py{' --arch ' + arch if arch != 'x86_64' else ''}`. Each model is compiled",
        "fused (default relax pipeline) and",
        "unfused (one kernel per op), and each library also as a `strip --strip-all` copy.",
        "*resolved*: kernel calls whose computation probing reproduced (operator-type recovery);",
        "*attrs*: conv stride/padding/dilation/groups, max-pool window/stride/padding and norm epsilons equal",
        "to the original layers'; *max abs diff*: rebuilt PyTorch model vs the executable's VM on 3 random inputs;",
        "*tvm vs torch*: the executable vs the original PyTorch model (for scale); *s*: wall-clock seconds of",
        "`zen decompile` (static parse, probing, rebuild and the equivalence check) on a shared 2-core machine.",
        "",
        f"Summary: {eq}/{n} libraries rebuilt equivalent (max abs diff < 1e-5 x (1 + max |output|)); "
        f"kernels resolved {k_ok}/{k_all} "
        f"({100 * k_ok / max(k_all, 1):.1f}%); attributes {a_good}/{a_all}.",
        "",
        "| library | KiB | kernel calls | resolved | attrs | rebuilt | max abs diff | tvm vs torch | s | problems |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = f"{r['max_abs_diff']:.2g}" if r["max_abs_diff"] is not None else "-"
        lines.append(
            f"| {r['library']} | {r['size_kb']} | {r['kernels']} | {r['resolved']} | {r['attrs']} | "
            f"{'yes' if r['rebuilt'] else 'no'} | {d} | {r['tvm_vs_torch']:.2g} | {r['seconds']} | "
            f"{r['problems'].replace('|', '/')} |"
        )
    if failed:
        lines += ["", "Models that did not build (TVM or torch.export failed; not decompiled):", ""]
        lines += [f"- `{spec}`: {why.replace('|', '/')}" for spec, why in failed]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
