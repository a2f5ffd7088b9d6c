"""Quantized deployment forms on a GPU (issue 47), in one prepared run on a machine with an NVIDIA GPU.

    python bench/gpu_forms.py OUTDIR [--wheels DIR] [--only FORM ...]

For bitsandbytes 8-bit, bitsandbytes 4-bit and torchao int8 (tests/targets/forms_target.py with
ZEN_FORMS_DEVICE=cuda): start the process with the model on cuda:0, `zen acquire --pid` (host image and GPU image,
the route chosen automatically), `zen recover --gpu`, and compare every tensor the process's own `state_dict()`
holds (a subclass's inner tensors one by one) with the case, by sha256; then `zen reuse` and the rebuilt model
loaded on cuda:0 and on the CPU (tests/targets/forms_check.py): outputs against the deployed response and the
rebuilt state_dict against the deployed one. Libraries absent on the machine are installed from --wheels
(`pip install --no-deps --target`), since the GPU machine reaches no package index. Each result is appended to
OUTDIR/results.json as soon as it is known. Written up by hand in bench/results/gpu.md, saying which machine ran it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from forms import truth_tensors  # noqa: E402
from gpu import Run  # noqa: E402

FORMS = ["bnb-8bit", "bnb-4bit", "torchao-int8"]
TARGETS = ROOT / "tests" / "targets"


def case_tensors(case: Path) -> dict[str, str]:
    from safetensors.numpy import load_file

    out = {}
    for name in ("weights.safetensors", "extra.safetensors"):
        if (case / name).is_file():
            out.update({k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in load_file(str(case / name)).items()})
    return out


def run_form(r: Run, form: str) -> dict:
    d = r.work / f"form-{form}"
    d.mkdir(parents=True, exist_ok=True)
    env = {**r.env, "ZEN_FORMS_DEVICE": "cuda"}
    proc = subprocess.Popen([sys.executable, str(TARGETS / "forms_target.py"), str(d), form], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=d,
                            start_new_session=True)  # fmt: skip
    r.procs.append(proc)
    if proc.stdout.readline().strip() != "READY":
        return {"error": f"target did not start: {proc.stderr.read()[-1500:]}"}
    truth = json.loads((d / "truth.json").read_text())
    img = r.work / f"{form}.core"
    res = {"acquire": r.zen("acquire", "--pid", proc.pid, "-o", img, "--lean", "--gpu-timeout", "240", timeout=400)}
    proc.stdin.close()
    gpu = Path(f"{img}.gpu0.nvcudmp")
    case = r.work / f"{form}-case"
    if not gpu.exists():
        res["error"] = "no GPU image written"
        return res
    res["gpu_image_bytes"], res["host_image_bytes"] = gpu.stat().st_size, img.stat().st_size
    res["recover"] = r.zen("recover", img, "--gpu", gpu, "-o", case, timeout=600)
    if (case / "mr.json").exists():
        mr = json.loads((case / "mr.json").read_text())
        res["devices"] = sorted({t["device"] for t in mr["tensors"]})
        man = json.loads((case / "manifest.json").read_text())
        res["status"], res["problems"] = man["status"], man["problems"][:10]
        res["recover_seconds"] = man["run"]["total_seconds"]
        want, got = truth_tensors(truth["state"]), case_tensors(case)
        by_content = set(got.values())
        res["tensors_by_key"] = f"{sum(1 for k, h in want.items() if got.get(k) == h)}/{len(want)}"
        res["tensors_by_content"] = f"{sum(1 for h in want.values() if h in by_content)}/{len(want)}"
        pkg = r.work / f"pkg_{form.replace('-', '_')}"
        res["reuse"] = r.zen("reuse", case, "-o", pkg, timeout=300)
        for device in ("cuda:0", "cpu"):
            out = r.work / f"{form}-check-{device.replace(':', '')}.json"
            c = subprocess.run([sys.executable, str(TARGETS / "forms_check.py"), str(pkg), str(d), str(out), device],
                               capture_output=True, text=True, timeout=300, cwd=r.work,
                               env={**r.env, "PYTHONPATH": os.pathsep.join([str(r.work), r.env["PYTHONPATH"]])})  # fmt: skip
            res[f"rebuilt_{device}"] = (
                json.loads(out.read_text()) if out.exists() else {"rc": c.returncode, "stderr": c.stderr[-1500:]}
            )
            res[f"rebuilt_{device}"].pop("report", None)
    for p in r.work.glob(f"{form}.core*"):
        p.unlink()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--wheels", type=Path, default=ROOT / "bench" / ".wheels")
    ap.add_argument("--only", nargs="*", choices=FORMS)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    r = Run(a.out, "cuda")
    site = r.work / "site"

    def env() -> dict:
        out = {"python": sys.version.split()[0]}
        wheels = sorted(str(p) for p in a.wheels.glob("*.whl")) if a.wheels.is_dir() else []
        if wheels:
            p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site), *wheels],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
            out["wheels"] = {"rc": p.returncode, "installed": [Path(w).name for w in wheels], "stderr": p.stderr[-800:]}
            r.env["PYTHONPATH"] = os.pathsep.join([r.env["PYTHONPATH"], str(site)])
        code = ("import torch, json; m = {}\nfor n in ('bitsandbytes', 'torchao'):\n try:\n  m[n] = __import__(n).__version__\n"
                " except Exception as e:\n  m[n] = repr(e)[:200]\nprint(json.dumps({'torch': torch.__version__, "
                "'cuda': torch.cuda.is_available(), **m}))")  # fmt: skip
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=r.env)
        try:
            out.update(json.loads(p.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            out["probe"] = p.stderr[-1500:]
        return out

    r.step("env", env)
    r.save()
    for form in a.only or FORMS:
        r.step(form, lambda f=form: run_form(r, f))
        r.save()
    r.stop_all()
    r.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    r.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
