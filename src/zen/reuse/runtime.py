"""Loading a reuse package in the investigator's process. EXECUTES code recovered from an image.

Called by the `load()` of packages `zen reuse` writes, and by `zen verify`. Needs torch.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from zen.represent import case
from zen.runtime.errors import ZenError


def load_tensors(path: Path) -> dict:
    from zen.reuse.tensor_load import load_safetensors

    # each tensor in its own aligned memory, like the deployed process's tensors (see zen.reuse.graph)
    return load_safetensors(Path(path))


def load_package(pkg_dir: Path, *, eval_mode: bool = True, device: str = "cpu", dequantize: bool = False) -> tuple[Any, dict]:
    """(model, report). Verifies the patch (hashes, Python version) before anything runs. The model is
    rebuilt on the CPU, then moved to `device` (parameters and buffers; tensors the model keeps in plain
    attributes stay where they are and are named in the report)."""
    from zen.patch.apply import apply_patch
    from zen.patch.format import read_patch
    from zen.reuse.graph import rebuild

    pkg_dir = Path(pkg_dir)
    if (pkg_dir / "model.pt").is_file():  # a TorchScript archive (reuse.torchscript_archive): torch compiles its code
        return _load_archive(pkg_dir, eval_mode, device, dequantize)
    patch = read_patch(pkg_dir / "patch.json")
    applied = apply_patch(patch)
    mr = package_mr(pkg_dir)
    model, graph = rebuild(mr, applied.resolver, pkg_dir, eval_mode=eval_mode, device=_accelerator(device))
    dequantized = None
    if dequantize:  # a float copy (zen.reuse.dequantize): the library's own dequantization, layer by layer
        from zen.reuse.dequantize import dequantize as to_float

        dequantized = to_float(model)
    placed = _place(model, device)
    problems = graph.problems() + [f"class {m}" for m in applied.mro_mismatch]
    if problems:  # said at load time too, not only in the report: a placeholder fails only when used
        import warnings

        more = f" (and {len(problems) - 5} more; see load_with_report())" if len(problems) > 5 else ""
        warnings.warn(f"zen: {len(problems)} value(s) of the recovered model could not be rebuilt: "
                      + "; ".join(problems[:5]) + more, stacklevel=3)  # fmt: skip
    report = {"patch": applied.to_json(), "graph": graph.to_json(), "problems": problems, "device": placed}
    return model, ({**report, "dequantized": dequantized} if dequantize else report)


def _load_archive(pkg_dir: Path, eval_mode: bool, device: str, dequantize: bool) -> tuple[Any, dict]:
    import torch

    from zen.reuse.package import is_archive

    if dequantize:
        raise ZenError("--dequantize applies to quantized Python models, not to a TorchScript archive")
    if not is_archive(package_mr(pkg_dir)):
        raise ZenError(f"{pkg_dir}: model.pt does not belong to this package's model", "write the package again with zen reuse")
    model = torch.jit.load(str(pkg_dir / "model.pt"), map_location=device)
    if eval_mode:
        model.eval()
    report = {"patch": {"warnings": [], "torchscript_archive": "model.pt"}, "graph": {"torchscript_archive": "model.pt"},
              "problems": [], "device": {"moved_to": str(device)}}  # fmt: skip
    return model, report


def _accelerator(device: str) -> str | None:
    """`device` when it names an accelerator the model is rebuilt for, else None (a CPU rebuild)."""
    return None if str(device) == "cpu" else str(device)


def _place(model: Any, device: str) -> dict:
    """Move the rebuilt model to `device`; what was moved and what stayed behind."""
    import torch

    if str(device) == "cpu":
        return {"device": "cpu"}
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ZenError(f"unknown device {device!r}: {exc}", "use cpu, cuda or cuda:N") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ZenError(f"device {device} requested but this torch has no usable GPU", "load(device='cpu')")
    model.to(target)
    held = [f"{name}.{k}" if name else k for name, m in model.named_modules() for k, v in vars(m).items()
            if isinstance(v, torch.Tensor) and not k.startswith("_") and v.device != target]  # fmt: skip
    return {"device": str(target), "tensors_left_in_attributes": held[:100]}


def package_mr(pkg_dir: Path):
    """The package's mr.json, schema-checked. A package has no case manifest (whose hashes protect
    a case's files): `zen verify` records and checks the package's own file hashes instead."""
    from zen.represent.mr import MR_FORMAT, ModelMR
    from zen.represent.schema import load_record

    p = Path(pkg_dir) / case.MR_FILE
    if not p.is_file():
        raise ZenError(f"{pkg_dir} has no {case.MR_FILE}", "write the package again with `zen reuse CASE -o DIR`")
    return load_record(p, ModelMR, "zen-mr", MR_FORMAT)


def import_package(pkg_dir: Path):
    """Import a reuse package from its directory (whatever its parent is on sys.path or not)."""
    pkg_dir = Path(pkg_dir).resolve()
    init = pkg_dir / "__init__.py"
    if not init.is_file() or not (pkg_dir / "patch.json").is_file():
        raise ZenError(
            f"{pkg_dir} is not a zen reuse package (no __init__.py/patch.json)", "write one with `zen reuse CASE -o DIR`"
        )
    name = pkg_dir.name
    if name in sys.modules and Path(getattr(sys.modules[name], "__file__", "") or "").resolve() == init:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(pkg_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def first_tensor(out: Any):
    """The tensor a model output stands for: itself, `.logits`, or the first tensor inside."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        for x in out:
            t = first_tensor(x)
            if t is not None:
                return t
    return None
