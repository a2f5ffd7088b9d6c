"""The analysis child: load the rebuilt model, run ART on it, write arrays and a result document.

Started by `zen analyze` through `zen.runtime.childproc` (isolated interpreter, scratch working directory):
`load()` of a reuse package EXECUTES code recovered from an image, and this process is where it
runs. Argument: the request JSON the parent wrote (package, inputs plan, attacks, parameters,
where to write). It writes the result JSON named in the request: {"ok": ...} or {"error", "hint"}
for a failure caused by the model or its inputs (the parent turns it into exit 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from zen.analyze.tensors import TensorFile, to_float64
from zen.runtime.errors import ZenError


def _array(path: str, key: str) -> np.ndarray:
    tf = TensorFile(Path(path))
    info = tf.tensors[key]
    raw = np.asarray(tf.raw(key))
    if info.dtype in ("F32",):
        return raw.reshape(info.shape).copy()
    if info.dtype.startswith("F") or info.dtype == "BF16":
        return to_float64(info.dtype, raw).astype(np.float32).reshape(info.shape)
    return raw.astype(np.int64).reshape(info.shape)


def _inputs(plan: dict, model, device: str, seed: int, clip) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """(x float32, labels or None, what was done) for the plan the parent made (inputs.py)."""
    import torch

    if plan["source"] != "spec":
        x = _array(plan["file"], plan["key"])
        labels = _array(plan["file"], plan["labels_key"]) if plan.get("labels_key") else None
        return x, labels, {}
    shape = plan.get("sample_shape")
    done: dict[str, Any] = {}
    if shape is None:  # a convolution: find a side the model accepts
        probe = plan["probe"]
        tried = []
        for side in probe["sides"]:
            trial = torch.zeros((1, probe["channels"], *([side] * probe["dims"])), device=device)
            tried.append(side)
            try:
                with torch.no_grad():
                    out = model(trial)
            except Exception:  # noqa: BLE001 - the recovered model rejects this size: try the next
                continue
            if out.ndim == 2:
                shape = [probe["channels"], *([side] * probe["dims"])]
                break
        if shape is None:
            raise ZenError(f"the model accepted none of the input sides tried ({', '.join(map(str, tried))})",
                           "give --input-shape C,H,W or --inputs FILE")  # fmt: skip
        done["probed_sides"] = tried
    lo, hi = clip if clip is not None else (0.0, 1.0)
    rng = np.random.default_rng(seed)
    x = rng.uniform(lo, hi, size=(plan["samples"], *shape)).astype(np.float32)
    done["sample_shape"] = list(shape)
    return x, None, done


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    from zen.represent.safetensors_io import Entry, SafetensorsWriter

    names = sorted(arrays)
    w = SafetensorsWriter(path, [Entry(k, "F32", tuple(arrays[k].shape), arrays[k].nbytes) for k in names],
                          {"producer": "zen analyze"})  # fmt: skip
    try:
        for k in names:
            w.write(k, [np.ascontiguousarray(arrays[k], dtype=np.float32).tobytes()])
        w.close()
    except BaseException:
        w.abort()
        raise


def run(req: dict) -> dict[str, Any]:
    import torch

    from zen.analyze import attacks as art_attacks
    from zen.reuse.runtime import import_package

    torch.set_num_threads(req["threads"])
    device = req["device"]
    pkg = import_package(Path(req["package"]))
    try:
        model, report = pkg.load_with_report(device=device) if device != "cpu" else pkg.load_with_report()
    except ZenError:
        raise
    except Exception as exc:  # noqa: BLE001 - recovered code failed to rebuild: the evidence's problem, said plainly
        raise ZenError(f"the rebuilt model could not be loaded: {type(exc).__name__}: {exc}",
                       "check the package with `zen verify`") from None  # fmt: skip
    for p in model.parameters():  # ART needs gradients of the input only: a weight's would be a second copy of the model
        p.requires_grad_(False)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    net = art_attacks.Logits(model, dtype).eval()
    clip = tuple(req["clip"]) if req.get("clip") else None
    x, labels, made = _inputs(req["inputs"], net, device, req["seed"], clip)
    try:
        with torch.no_grad():
            probe = net(torch.from_numpy(x[: req["batch_size"]]).to(device))
    except Exception as exc:  # noqa: BLE001
        raise ZenError(f"the rebuilt model failed on the inputs {list(x.shape)}: {type(exc).__name__}: {exc}",
                       "give inputs of the shape the model takes (--inputs FILE or --input-shape)") from None  # fmt: skip
    if probe.ndim != 2 or probe.shape[1] < 2:
        raise ZenError(f"the model's output {list(probe.shape)} is not [batch, classes]: ART's attacks and Neural Cleanse "
                       "need a classifier", "zen analyze runs on classifiers (logits out)")  # fmt: skip
    nb_classes = int(probe.shape[1])
    if labels is not None and (labels.min() < 0 or labels.max() >= nb_classes):
        raise ZenError(f"labels outside the model's {nb_classes} classes", "labels are class indices 0..classes-1")
    device_type = "gpu" if device.startswith("cuda") else "cpu"
    if device_type == "gpu" and ":" in device:
        torch.cuda.set_device(torch.device(device))
    out = Path(req["out"])
    result: dict[str, Any] = {"ok": True, "classes": nb_classes, "input_shape": list(x.shape[1:]), "samples": int(len(x)),
                              "inputs_made": made, "load_problems": report.get("problems", []),
                              "torch": torch.__version__, "art": _art_version()}  # fmt: skip
    if req["attacks"]:
        clf = art_attacks.classifier(net, tuple(x.shape[1:]), nb_classes, clip, device_type)
        res, advs = art_attacks.run_attacks(clf, x, labels, req["attacks"], req["eps"], req["seed"], req["batch_size"],
                                            req["pgd_steps"])  # fmt: skip
        _write(out / "adversarial.safetensors", advs)
        result["robustness"] = res
    if req["backdoor"]:
        res, arrays = art_attacks.run_neural_cleanse(net, x, labels, nb_classes, clip, device_type, req["seed"],
                                                     req["nc_steps"], req["batch_size"])  # fmt: skip
        _write(out / "triggers.safetensors", arrays)
        result["backdoor"] = res
    return result


def _art_version() -> str:
    import art

    return art.__version__


def main(argv: list[str]) -> int:
    req = json.loads(Path(argv[0]).read_text())
    try:
        result = run(req)
    except ZenError as exc:
        result = {"error": exc.message, "hint": exc.hint}
    Path(req["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
