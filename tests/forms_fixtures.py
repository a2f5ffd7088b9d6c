"""The deployment-form targets (`targets/forms_target.py`), shared by test_forms and test_torchscript (a plugin of
conftest): every form's process starts together, is imaged once per session, and its image is deleted at the end."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import TARGETS, start_target, zen

FORMS = {  # form -> the library it needs (None: torch alone)
    "compile": None, "compile-method": None, "torchao-int8": "torchao", "quanto-int8": "optimum.quanto",
    "bnb-8bit": "bitsandbytes", "bnb-4bit": "bitsandbytes", "several": "torchao", "offload-cpu": "accelerate",
    "offload-disk": "accelerate", "dynamic": None, "dynamic-per-channel": None, "dynamic-fp16": None, "static-cnn": None,
    "static-cnn-fbgemm": None, "static-cnn-onednn": None, "static-cnn-qnnpack": None, "static-depthwise": None,
    "static-grouped": None, "static-conv1d": None, "static-conv1d-fbgemm": None, "static-embedding": None,
    "static-convtranspose": None, "static-convtranspose1d": None, "static-conv3d": None,
    "static-conv3d-fbgemm": None, "static-embedding-4bit": None,
    "hostile-ring": None, "nan-weights": None, "jit-trace": None, "jit-trace-cnn": None, "jit-load-trace-cnn": None,
    "jit-script": None,
    "jit-script-cnn": None, "jit-script-object": None,
    "jit-load": None, "jit-load-cnn": None, "ort": "onnxruntime",
}  # fmt: skip


def have(mod: str | None) -> bool:
    if mod is None:
        return True
    try:
        return importlib.util.find_spec(mod) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="session")
def form_images(workdir):
    """form -> (image, target); targets that cannot start (library absent) are left out."""
    import threading

    started: dict = {}
    errors: dict = {}

    def start(form):
        backend = "eager" if form == "compile-method" else "inductor"  # Module.compile()'s wrapper is the same for both
        try:
            started[form] = start_target("forms_target.py", workdir / f"form-{form}", form, backend, timeout=600)
        except RuntimeError as exc:
            errors[form] = str(exc)

    threads = [threading.Thread(target=start, args=(f,)) for f, lib in FORMS.items() if have(lib)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    images = {}
    try:
        for form, t in started.items():
            img = workdir / f"form-{form}.core"
            zen("acquire", "--pid", t.pid, "-o", img, "--lean")
            images[form] = (img, t)
    finally:
        for t in started.values():
            t.stop()
    yield images, errors
    for img, _ in images.values():
        img.unlink(missing_ok=True)


def get_form(form_images, form):
    images, errors = form_images
    if form not in images:
        lib = FORMS[form]
        pytest.skip(errors.get(form) or f"{lib} is not installed (pip install '.[quant]')")
    return images[form]


def recover_form(form_images, form, workdir, *extra):
    img, t = get_form(form_images, form)
    case = workdir / f"case-form-{form}{len(extra) and '-given' or ''}"
    res = zen("recover", img, "-o", case, *extra, "--force", check=False)  # several tests recover one form
    manifest = json.loads((case / "manifest.json").read_text()) if (case / "manifest.json").exists() else None
    return res, case, manifest, t


def digest(a) -> str:
    import torch

    return hashlib.sha256(a.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def rebuilt(workdir, case, form, t, *dequantize: str) -> dict:
    """`zen reuse` of the case, loaded in a fresh process (forms_check.py): outputs on the deployed request and the
    rebuilt model's own state_dict, both against the deployed process. `"--dequantize"`: the float copy."""
    pkg = workdir / f"rebuilt_{form.replace('-', '_')}{'_float' if dequantize else ''}"
    zen("reuse", case, "-o", pkg, *dequantize)
    out = workdir / f"check-{form}{'-float' if dequantize else ''}.json"
    cmd = [sys.executable, str(TARGETS / "forms_check.py"), str(pkg), str(t.outdir), str(out), "cpu"]
    cmd += ["dequantize"] if dequantize else []
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=workdir, env={**os.environ, "PYTHONPATH": str(workdir)}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(out.read_text())
