"""Deployment forms bench (issues 47, 48): what zen recovers of one model served in each form, in one run.

    python bench/forms.py [--only FORM ...] [-o bench/results/forms.md]

For each form of `tests/targets/forms_target.py` (eager as the control; torch.compile as a wrapper and in place;
torchao int8 and int4; optimum-quanto int8; bitsandbytes 8-bit and 4-bit; dynamic quantization per tensor and per
channel, of the MLP and of a transformers BERT; static quantization of a CNN; TorchScript traced, scripted and
`jit.load`ed; ONNX Runtime): start the real process, image it with `zen acquire --lean`, run `zen recover`
as a user would, and compare with what the process's own `state_dict()` holds: every tensor (a subclass's inner
tensors and packed parameters counted one by one) bit-exact or not. Where `zen reuse` writes a package, it is
loaded in a fresh process and run on the deployed request; its outputs are compared with the deployed response.
Seconds are zen recover's wall time; "s/GB" divides it by the image size, so quantized and float forms compare
per byte of evidence. Forms whose library is not installed are listed as skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "tests" / "targets"
FORMS = ["eager", "compile", "compile-method", "torchao-int8", "torchao-int4", "quanto-int8", "bnb-8bit", "bnb-4bit",
         "offload-cpu", "offload-disk", "several", "dynamic", "dynamic-per-channel", "dynamic-fp16", "dynamic-bert", "static-cnn",
         "static-cnn-fbgemm", "static-cnn-onednn", "static-cnn-qnnpack", "static-depthwise", "static-grouped",
         "static-conv1d", "static-conv1d-fbgemm", "static-convtranspose", "static-convtranspose1d", "static-conv3d",
         "static-conv3d-fbgemm", "static-embedding", "static-embedding-4bit",
         "static-resnet18", "static-mobilenet-v2", "jit-trace", "jit-trace-cnn", "jit-trace-resnet18", "jit-script",
         "jit-script-cnn", "jit-script-object",
         "jit-script-resnet18", "jit-load", "jit-load-cnn", "jit-load-trace", "jit-load-trace-cnn", "jit-load-resnet18",
         "ort"]  # fmt: skip
TORCHVISION = (
    "static-resnet18",
    "static-mobilenet-v2",
    "jit-script-resnet18",
    "jit-load-resnet18",
    "jit-trace-resnet18",
)  # torchvision from bench/zoo.py's side directory
QUANTIZED = ("torchao-int8", "torchao-int4", "quanto-int8", "bnb-8bit", "bnb-4bit")
RUNS = 3  # recoveries per form; the median is reported (each is ~1 s on these small images)


def zen(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"}, timeout=1200)  # fmt: skip


def truth_tensors(state: dict) -> dict[str, str]:
    """key -> sha256 of every tensor the model's own state_dict holds (a subclass's inner tensors as KEY.NAME,
    the items of packed parameters as KEY.N)."""
    out: dict[str, str] = {}

    def walk(key: str, d: dict) -> None:
        if "sha256" in d:
            out[key] = d["sha256"]
        for name, inner in (d.get("inner") or {}).items():
            walk(f"{key}.{name}", inner)
        for i, item in enumerate(d.get("items") or []):
            walk(f"{key}.{i}", item)

    for k, v in state.items():
        walk(k, v)
    return out


def recovered_tensors(case: Path) -> set[str]:
    """sha256 of every tensor in the case's tensor files (by content: bitsandbytes keys its serialization
    differently from memory; the rebuilt model's own state_dict is compared by key below)."""
    from safetensors.numpy import load_file

    out = set()
    for name in ("weights.safetensors", "extra.safetensors"):
        if (case / name).is_file():
            out |= {hashlib.sha256(v.tobytes()).hexdigest() for v in load_file(str(case / name)).values()}
    return out


def run_form(form: str, work: Path) -> list[dict]:
    outdir = work / form
    outdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(TARGETS / "forms_target.py"), str(outdir), form], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work)  # fmt: skip
    outdir.mkdir(parents=True, exist_ok=True)
    line = proc.stdout.readline()
    if line.strip() != "READY":
        err = proc.stderr.read()[-300:] if proc.poll() is not None else ""
        proc.kill()
        return [{"form": form, "skipped": (err.strip().splitlines() or ["did not start"])[-1]}]
    truth = json.loads((outdir / "truth.json").read_text())
    img = work / f"{form}.core"
    try:
        acq = zen("acquire", "--pid", truth["pid"], "-o", img, "--lean")
        assert acq.returncode == 0, acq.stderr
    finally:
        proc.stdin.close()
        proc.wait(30)
    rows = [_recover(form, img, work, outdir, truth)]
    if form == "offload-disk":  # again with the files accelerate wrote, given as the investigator would
        rows.append(_recover(form, img, work, outdir, truth, "--offload", outdir / "offload"))
    img.unlink()
    return rows


def _recover(form: str, img: Path, work: Path, outdir: Path, truth: dict, *extra) -> dict:
    label = f"{form} {' '.join(map(str, extra[:1]))}".strip()
    case = work / f"case-{form}{'-given' if extra else ''}"
    times = []
    for i in range(RUNS):
        t0 = time.perf_counter()
        rec = zen("recover", img, "-o", case if i == RUNS - 1 else work / f"timing-{form}-{i}", *extra)
        times.append(time.perf_counter() - t0)
    seconds = sorted(times)[RUNS // 2]
    size = img.stat().st_size
    row = {"form": label, "exit": rec.returncode, "seconds": round(seconds, 2), "image_mb": round(size / 1e6),
           "s_per_gb": round(seconds / (size / 1e9), 2)}  # fmt: skip
    manifest = json.loads((case / "manifest.json").read_text()) if (case / "manifest.json").exists() else {}
    row["status"] = manifest.get("status") or f"no case ({(rec.stderr.strip().splitlines() or ['?'])[0][:160]})"
    row["problems"] = manifest.get("problems", [])
    want = truth_tensors(truth["state"])
    got = recovered_tensors(case)
    row["exact"] = sum(1 for h in want.values() if h in got)
    row["total"] = len(want)
    row["rebuilt"], row["state_equal"] = rebuilt(case, outdir, work, form) if manifest else ("-", None)
    return row


def rebuilt(case: Path, outdir: Path, work: Path, form: str) -> tuple[str, bool | None]:
    pkg = work / f"pkg_{case.name.replace('-', '_')}"
    r = zen("reuse", case, "-o", pkg)
    if r.returncode != 0:
        return f"refused, exit {r.returncode}", None
    out = work / f"check-{form}.json"
    cmd = [sys.executable, str(TARGETS / "forms_check.py"), str(pkg), str(outdir), str(out)]
    path = str(work)
    if form in TORCHVISION:  # the check process imports torchvision the way the target did (bench/zoo.py)
        site = work / "tvsite"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'bench')!r})\nimport zoo\n"
                                               "zoo.prepare(str(zoo.zoo_site()))\n")  # fmt: skip
        path += os.pathsep + str(site)
    c = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env={**os.environ, "PYTHONPATH": path}, timeout=600)
    if c.returncode != 0:
        return f"**load failed**: {(c.stderr.strip().splitlines() or ['?'])[-1][:120]}", False
    res = json.loads(out.read_text())
    outputs = "bit-identical" if res["equal"] else f"max abs diff {res['max_abs_diff']:.2e}"
    state = "state_dict equal" if res["state_equal"] else f"state_dict differs: {', '.join(res['state_differs'][:3])}"
    return f"{outputs}; {state} ({res['state_entries']} entries)", res["state_equal"]


NOTES = """How to read the rows:
- bitsandbytes' exact/total by content is below total because bitsandbytes makes `weight_format` and the packed
  `weight.quant_state.bitsandbytes__nf4` at save time from values zen records with the quant_state; the rebuilt
  model's own state_dict, which runs that serialization, equals the deployed one entry by entry.
- offload-disk without the files is partial (the data is not in the image; each problem names the file accelerate
  would read); the next row gives the files with `--offload` and the case is complete.
- TorchScript: the C++ module tree is read through each ScriptModule's `_c` (issue 48), with the classes'
  constants and tuples. jit-script*: scripted in the process; each module linked to the Python class torch compiled
  it from (its concrete type store) and rebuilt from it. jit-load*: only what torch.jit.load read from an archive
  (-trace: a traced model saved and loaded, -trace-cnn with tensor constants, CONSTANTS.cN, read from the graph
  nodes that hold them; -resnet18: torchvision's, scripted); its TorchScript code is read from
  the image and `zen reuse` writes a TorchScript archive that torch.jit.load runs. jit-trace*: traced in the process,
  graphs and no code text: each class's graph is read from the image and printed again (op names, types,
  constants), and `zen reuse` has torch print it as code into a TorchScript archive (-cnn: sizes, views, tensor
  constants, a tuple output; -resnet18: torchvision's). jit-script-object:
  a TorchScript class instance held as an attribute, which zen does not decode: partial, named.
- dynamic*: fbgemm's packed weights are unpacked (issue 48; dynamic-fp16: float16 blocks, widened to the float32
  weight PyTorch's unpack gives) and packed again by the rebuilt model. exact/total
  counts by content the `scale` and `zero_point` entries too, which PyTorch's `_save_to_state_dict` makes at
  save time from each Linear's plain attributes (zen records them as hyper-parameters): every weight and bias is
  exact, and the rebuilt model's own state_dict equals the deployed one entry by entry.
- static-*: statically quantized models, each packed object told apart by its RTTI. static-cnn (x86 engine, the
  default qconfig): its Linear packed by fbgemm (unpacked), its Conv2d by oneDNN on this AVX512-VNNI CPU (the
  quantized weight it keeps, read with its quantizer's scales). -fbgemm, -onednn, -qnnpack: the same model under
  that engine (fbgemm's convolution unpacked from its PackBMatrix; QNNPACK keeps its weights like oneDNN).
  static-depthwise: fbgemm's depthwise packing, unpacked. static-grouped: a grouped convolution fbgemm packs
  group by group, unpacked. static-conv3d: a Conv3d, kept by oneDNN on this CPU; -fbgemm: fbgemm's 3-d packing,
  unpacked. static-embedding-4bit: a 4-bit table (two values a byte). static-resnet18 / static-mobilenet-v2:
  torchvision's quantizable models (fused, x86 qconfig, random weights), MobileNet's depthwise layers with more
  than 100 groups go to fbgemm.
  static-conv1d(-fbgemm): Conv1ds, packed as Conv2ds of kernel (1, k) and read as such. static-embedding: a
  weight-only quantized EmbeddingBag (fbgemm's 8-bit fused rows). static-convtranspose(1d): transposed
  convolutions, which fbgemm does not pack: oneDNN's object keeps the weight, read as stored.
- several: a float reference beside the served torchao model; the served one is chosen (see README, "Several models").
- ort: no case; zen names the ONNX Runtime session and the model file it loaded (exit 6).
- Every image holds the interpreter, torch and each form's library: recovery time is mostly the heap and code work
  those imports bring, not the model's bytes, so the per-GB column compares forms, not tensor throughput."""


def write(rows: list[dict], path: Path) -> None:
    lines = ["# Deployment forms", "", f"`python bench/forms.py` on {platform.node() and 'this machine'} "
             f"({os.cpu_count()} cores, Python {platform.python_version()}; load {os.getloadavg()[0]:.1f} at the end), "
             f"{time.strftime('%Y-%m-%d')}. "
             "One small MLP (3 Linear layers, 128 wide) per form, built at run time from the installed libraries; "
             "exact/total: of the tensors the process's own `state_dict()` holds (a subclass's inner tensors and "
             "packed parameters one by one), how many are in the case's tensor files bit-exact (by content: "
             "bitsandbytes serializes some under other names, or makes them at save time). \"rebuilt\": `zen reuse`, "
             "the package loaded in a fresh process (tests/targets/forms_check.py): its output on the deployed request "
             "against the deployed response, and its own `state_dict()` against the deployed one, key by key.", "",
             "| form | zen recover | status | tensors exact / total | rebuilt outputs | seconds | image MB | s/GB |",
             "|---|---|---|---|---|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['form']} | skipped: {r['skipped']} | | | | | | |")
            continue
        lines.append(f"| {r['form']} | exit {r['exit']} | {r['status']} | {r['exact']} / {r['total']} | {r['rebuilt']} | "
                     f"{r['seconds']} | {r['image_mb']} | {r['s_per_gb']} |")  # fmt: skip
    # "complete" must mean the whole state_dict: the rebuilt model's equals the deployed one (else every tensor in the case)
    lying = [r["form"] for r in rows if r.get("status") == "complete"
             and (r["state_equal"] is False or (r["state_equal"] is None and r["exact"] < r["total"]))]  # fmt: skip
    by = {r["form"]: r for r in rows if "s_per_gb" in r}
    if "eager" in by and any(f in by for f in QUANTIZED):
        worst = max((by[f]["s_per_gb"] / by["eager"]["s_per_gb"], f) for f in QUANTIZED if f in by)
        lines += ["", f"Recovery time per GB of image, quantized over float (eager): at most {worst[0]:.2f}x ({worst[1]}; "
                  f"medians of {RUNS} recoveries each)."]  # fmt: skip
    lines += ["", f"Cases \"complete\" with a tensor missing: {len(lying)}" + (f" ({', '.join(lying)})" if lying else "") + ".",
              "", NOTES, "", "## Problems zen reported, per form", ""]  # fmt: skip
    for r in rows:
        for p in (r.get("problems") or [])[:4]:
            lines.append(f"- {r['form']}: {p}")
        if len(r.get("problems") or []) > 4:
            lines.append(f"- {r['form']}: ... {len(r['problems']) - 4} more")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", choices=FORMS)
    ap.add_argument("-o", type=Path, default=ROOT / "bench" / "results" / "forms.md")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="zen-forms-") as tmp:
        for form in a.only or FORMS:
            for row in run_form(form, Path(tmp)):
                print(json.dumps({k: v for k, v in row.items() if k != "problems"}), flush=True)
                rows.append(row)
    write(rows, a.o)
    print(f"wrote {a.o}")


if __name__ == "__main__":
    main()
