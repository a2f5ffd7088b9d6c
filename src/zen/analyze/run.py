"""`zen analyze`: white-box analysis of a recovered model with ART, in a child process.

The parent (this module; no torch, no ART) checks the case or package and the inputs, writes a
request, runs `zen.analyze.worker` through `zen.runtime.childproc` (isolated interpreter, scratch working
directory: the rebuilt model's `load()` EXECUTES code recovered from the image, never in zen's own
process), then writes DIR/analysis.json and the figures:

    analysis.json             what was analysed (case or package, evidence sha256), the inputs and
                              where they came from, the parameters, robustness per attack and
                              epsilon, Neural Cleanse per class, the sha256 of every file below
    adversarial.safetensors   the adversarial examples, keyed ATTACK@EPS (float32, the inputs' shape)
    robustness.png            accuracy (labels) or prediction change rate (none) against epsilon
    triggers.safetensors      Neural Cleanse's mask_K and pattern_K for every class K
    anomaly.png, trigger_class_K.png   anomaly index per class; the trigger of each flagged class and
                              of the class with the smallest trigger
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zen import __version__
from zen.analyze import plots
from zen.analyze.inputs import plan_inputs
from zen.analyze.subject import open_subject
from zen.analyze.tensors import TensorFile
from zen.represent import textio
from zen.represent.case import file_sha256
from zen.runtime import childproc
from zen.runtime.errors import ZenError

ATTACK_NAMES = ("fgsm", "pgd")
DEFAULT_EPS = (0.01, 0.03, 0.1)
EXTRA_HINT = "pip install 'zen-forensics[analysis]' (adversarial-robustness-toolbox, torch==2.13.0, safetensors)"
EXECUTES = "zen analyze EXECUTES code recovered from the image (the rebuilt model runs in a child process): run it in an " \
    "isolated environment"  # fmt: skip


class AnalysisCrash(ZenError):
    """The analysis child died without a result: a bug in zen, or recovered code that killed its interpreter."""

    exit_code = 70


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[name] is None, Python's mark for "not importable"
        return False


def require_extra() -> None:
    """ART, torch and safetensors are the `analysis` extra: say how to get them before the child starts."""
    missing = [m for m in ("art", "torch", "safetensors") if not _installed(m)]
    if missing:
        names = {"art": "adversarial-robustness-toolbox"}
        raise ZenError(f"zen analyze needs {', '.join(names.get(m, m) for m in missing)}, which is not installed", EXTRA_HINT)


def parse_attacks(text: str) -> list[str]:
    names = [a.strip().lower() for a in text.split(",") if a.strip()]
    if names == ["none"]:
        return []
    bad = [a for a in names if a not in ATTACK_NAMES]
    if bad:
        raise ZenError(f"unknown attack {bad[0]!r}", f"choose from {', '.join(ATTACK_NAMES)} (comma-separated) or none")
    return [a for a in ATTACK_NAMES if a in names]


def parse_floats(text: str, what: str, count: int | None = None) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ZenError(f"{what} must be comma-separated numbers, not {text!r}") from None
    if not vals or (count is not None and len(vals) != count) or any(v != v for v in vals):
        raise ZenError(f"{what} must be {count or 'one or more'} comma-separated numbers, not {text!r}")
    return vals


def _prepare_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "analysis.json").is_file())):
        raise ZenError(f"{out} exists and is not an empty directory or an earlier zen analysis", "choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():  # an earlier analysis: its files no longer describe this run
        if p.is_file() and (p.suffix in (".png", ".safetensors") or p.name == "analysis.json"):
            p.unlink()


def analyze(target: Path, out: Path, *, inputs: Path | None = None, attacks: list[str] | None = None,
            eps: list[float] | None = None, backdoor: bool = False, seed: int = 0, clip: list[float] | None = None,
            batch_size: int = 32, pgd_steps: int = 10, nc_steps: int = 100, input_shape: list[int] | None = None,
            samples: int = 16, threads: int = 1, device: str = "cpu", timeout: float = 3600.0,
            on_execute=None, memory_check: bool = True) -> dict[str, Any]:  # fmt: skip
    """Run the analysis and write DIR; returns the analysis document. `on_execute()` is called once every
    check has passed, just before the child process loads the model (the CLI warns there); `memory_check`: refuse
    a model this machine cannot hold (`check_memory`)."""
    attacks = list(ATTACK_NAMES) if attacks is None else attacks
    eps = list(DEFAULT_EPS) if eps is None else eps
    if not attacks and not backdoor:
        raise ZenError("nothing to do: no attack and no --backdoor", "give --attack fgsm,pgd and/or --backdoor")
    if any(e <= 0 for e in eps) or batch_size < 1 or pgd_steps < 1 or nc_steps < 1 or samples < 1 or threads < 1:
        raise ZenError("epsilons, batch size, steps, samples and threads must be positive")
    if clip is not None and clip[0] >= clip[1]:
        raise ZenError(f"--clip {clip[0]},{clip[1]}: the minimum must be below the maximum")
    out = Path(out)
    work = Path(tempfile.mkdtemp(prefix="zen-analyze-"))
    try:
        subject = open_subject(Path(target), work)
        if memory_check and device == "cpu":
            check_memory(subject.mr)
        plan = plan_inputs(subject, inputs, input_shape, samples)
        require_extra()
        _prepare_out(out)
        req = {"package": str(subject.package.resolve()), "inputs": plan, "attacks": attacks, "eps": eps, "backdoor": backdoor,
               "seed": seed, "clip": clip, "batch_size": batch_size, "pgd_steps": pgd_steps, "nc_steps": nc_steps,
               "threads": threads, "device": device, "out": str(out.resolve()), "result": str(work / "result.json")}  # fmt: skip
        (work / "request.json").write_text(json.dumps(req))
        if on_execute is not None:
            on_execute()
        result = _run_child(work, timeout)
        doc = _document(subject, plan, req, result)
        _figures(out, doc)
        doc["files"] = {p.name: file_sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != "analysis.json"}
        textio.write_json(out / "analysis.json", doc, indent=1)
        return doc
    finally:
        shutil.rmtree(work, ignore_errors=True)


BASELINE = 1 << 30  # the analysis child's interpreter, torch and ART, before any weight


def check_memory(mr, available: int | None = None) -> None:
    """Refuse, before anything runs, a model this machine cannot hold: the analysis child loads the weights and
    builds the model (ART runs on the model itself, so it cannot be streamed). The child holds the weights once:
    each tensor is read into its own memory (zen.reuse.tensor_load) and the weights are frozen, so ART's backward
    makes no gradient of them; measured by bench/analyze_memory.py at 1.34x the tensors' bytes for a 1.1 GB model
    (it was 3.34x before both). Hence the model's bytes plus BASELINE. A refusal says so; the kernel's OOM killer
    would end the child without a word."""
    held = sum(max(0, int(t.nbytes)) for t in mr.tensors)
    need = held + BASELINE
    available = _mem_available() if available is None else available
    if available is not None and need > available:
        raise ZenError(f"the model holds {held / 1e9:.1f} GB of tensors: analysing it needs about {need / 1e9:.1f} GB of "
                       f"memory, and this machine has {available / 1e9:.1f} GB available",
                       "run it on a machine with more memory, or give --no-memory-check to try anyway")  # fmt: skip


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            return next((int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")), None)
    except (OSError, ValueError):
        return None


def _run_child(work: Path, timeout: float) -> dict[str, Any]:
    argv = childproc.module_argv("zen.analyze.worker", [str(work / "request.json")])
    try:
        proc = childproc.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ZenError(f"the analysis did not finish in {timeout:g} s", "raise --timeout, or lower --nc-steps") from None
    result_path = work / "result.json"
    if os.environ.get("ZEN_DEBUG") == "1" and proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0 or not result_path.is_file():
        lines = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
        raise AnalysisCrash(f"the analysis process failed (exit {proc.returncode}): {lines[-1] if lines else 'no message'}",
                            "rerun with ZEN_DEBUG=1 for its output, and please report it")  # fmt: skip
    result = json.loads(result_path.read_text())
    if "error" in result:
        raise ZenError(result["error"], result.get("hint"))
    return result


def _document(subject, plan: dict, req: dict, result: dict) -> dict[str, Any]:
    inputs = {k: v for k, v in plan.items() if k not in ("probe",)}
    inputs.update(result.get("inputs_made") or {})
    inputs["samples"] = result["samples"]
    if plan["source"] != "spec":
        inputs["sha256_data"] = _data_sha256(Path(plan["file"]), plan["key"])
    return {
        "kind": "zen-analysis", "format": 1, "tool": f"zen {__version__}",
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "subject": {"kind": subject.kind, **subject.provenance, "model": subject.mr.root.cls,
                    "root_address": subject.mr.root.address},
        "executed_recovered_code": True, "where": "a child process (isolated interpreter, scratch working directory)",
        "versions": {"torch": result.get("torch"), "art": result.get("art")},
        "model": {"classes": result["classes"], "input_shape": result["input_shape"]},
        "inputs": inputs, "load_problems": result.get("load_problems", []),
        "parameters": {"attacks": req["attacks"], "eps": req["eps"], "seed": req["seed"], "clip": req["clip"],
                       "batch_size": req["batch_size"], "pgd_steps": req["pgd_steps"], "pgd_eps_step": "eps/4",
                       "pgd_random_inits": 1, "nc_steps": req["nc_steps"] if req["backdoor"] else None,
                       "threads": req["threads"], "device": req["device"],
                       "protocol": "np.random.seed(seed) and torch.manual_seed(seed) before each attack; y=None without labels"},
        "robustness": result.get("robustness"), "backdoor": result.get("backdoor"),
    }  # fmt: skip


def _data_sha256(path: Path, key: str) -> str:
    """sha256 of one tensor's bytes (what `zen recover` records for an input it found)."""
    import hashlib

    return hashlib.sha256(bytes(TensorFile(path).raw(key).data)).hexdigest()


def _figures(out: Path, doc: dict) -> None:
    rob = doc.get("robustness")
    if rob:
        (out / "robustness.png").write_bytes(plots.robustness(rob))
    bd = doc.get("backdoor")
    if not bd:
        return
    (out / "anomaly.png").write_bytes(plots.anomaly(bd["classes"], bd["threshold"]))
    tf = TensorFile(out / "triggers.safetensors")
    smallest = min(bd["classes"], key=lambda c: c["l1"])["class"]
    shown = sorted(set(bd["flagged"]) | {smallest})
    bd["trigger_images"] = {}
    for k in shown:
        mask = tf.raw(f"mask_{k}").reshape(tf.tensors[f"mask_{k}"].shape)
        pattern = tf.raw(f"pattern_{k}").reshape(tf.tensors[f"pattern_{k}"].shape)
        c = bd["classes"][k]
        flag = "FLAGGED, " if c["flagged"] else ""
        label = f"class {k}: {flag}trigger L1 {c['l1']:.1f}, anomaly index {c['anomaly_index']:.2f}"
        name = f"trigger_class_{k}.png"
        (out / name).write_bytes(plots.trigger(mask, pattern, label))
        bd["trigger_images"][str(k)] = name
