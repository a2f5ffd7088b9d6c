"""What `zen analyze` runs: a reuse package, written from a case when it is given one, checked first.

The checks run here, before any child process starts and before anything recovered is executed:
the case's files must be what zen wrote (as for `zen reuse`); the model must be a PyTorch one
(ART's classifiers wrap the rebuilt torch module); every tensor of the MR must have been recovered,
and the weights file must hold each with the dtype and shape the MR records (a package has no
manifest to protect it, so a weights file that does not fit its architecture is refused here
instead of failing inside the model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from zen.analyze.tensors import TensorFile
from zen.represent import case
from zen.represent.mr import ModelMR
from zen.runtime.errors import ZenError

PACKAGE_NAME = "zen_analyzed_model"  # the package a case is written to, in a private temporary directory

# MR dtype names (torch's) -> safetensors codes
ST_CODE = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
           "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
           "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL"}  # fmt: skip
NEEDS_WEIGHTS = "zen analyze needs every weight of the model: recover it from a complete image (a GPU model with --gpu)"


@dataclass
class Subject:
    """The model to analyse: the package to load, its MR, and where it came from."""

    kind: str  # "case" or "package"
    given: Path
    package: Path
    mr: ModelMR
    provenance: dict = field(default_factory=dict)

    @property
    def recovered_inputs(self) -> Path | None:
        """The inputs zen found in the image: the case's own file (its package holds a link to it)."""
        p = self.given / case.INPUTS
        return p if p.is_file() else None


def check_weights(mr: ModelMR, weights: Path, where: Path) -> None:
    """Refuse a model without weights, with unrecovered tensors, or whose weights file does not fit its MR."""
    if not mr.tensors:
        raise ZenError(f"{where} has no weights: the model has no parameters or buffers", "nothing to analyse")
    bad = [t for t in mr.tensors if t.status not in ("ok", "composite")]  # composite: its parts are tensors of their own
    if len(bad) == len(mr.tensors) or not weights.is_file():
        raise ZenError(f"{where} has no recovered weights (none of its {len(mr.tensors)} tensors was readable)", NEEDS_WEIGHTS)
    if bad:
        raise ZenError(f"{where}: {len(bad)} of {len(mr.tensors)} tensors were not recovered ({bad[0].key}: {bad[0].status})",
                       NEEDS_WEIGHTS)  # fmt: skip
    stored = TensorFile(weights).tensors
    for t in mr.tensors:
        if t.status == "composite":  # a tensor subclass: its data are its inner tensors, checked as their own records
            continue
        info = stored.get(t.key)
        if info is None:
            raise ZenError(f"{weights} does not match the model's architecture: no tensor {t.key}",
                           "write the package again with `zen reuse CASE -o DIR`")  # fmt: skip
        want = ST_CODE.get(t.dtype)
        if list(info.shape) != list(t.shape) or (want is not None and info.dtype != want):
            raise ZenError(
                f"{weights} does not match the model's architecture: {t.key} is {info.dtype}{list(info.shape)}, "
                f"the MR says {t.dtype}{list(t.shape)}",
                "write the package again with `zen reuse CASE -o DIR`",
            )


def _refuse_keras(where: Path) -> None:
    raise ZenError(f"{where} is a Keras model: zen analyze runs ART on PyTorch models",
                   "rebuild it with `zen reuse` and run ART's TensorFlowV2Classifier in the TensorFlow environment")  # fmt: skip


def open_subject(path: Path, workdir: Path) -> Subject:
    """A case (written to a package under `workdir`) or a reuse package, checked."""
    from zen.reuse.package import package_hashes

    path = Path(path)
    if (path / case.MANIFEST).exists():
        return _from_case(path, workdir)
    if not (path / "reuse.json").is_file() or not (path / "patch.json").is_file():
        raise ZenError(f"{path} is neither a zen case nor a reuse package",
                       "give a case directory (`zen recover IMAGE -o CASE`) or a package (`zen reuse CASE -o DIR`)")  # fmt: skip
    from zen.reuse.keras_package import is_keras_package
    from zen.reuse.runtime import package_mr

    if is_keras_package(path):
        _refuse_keras(path)
    mr = package_mr(path)
    if mr.framework == "keras":
        _refuse_keras(path)
    check_weights(mr, path / case.WEIGHTS, path)
    try:
        info = json.loads((path / "reuse.json").read_text())
    except (OSError, ValueError):
        info = {}
    info = info if isinstance(info, dict) else {}
    prov = {"package": str(path.resolve()), "evidence_sha256": info.get("evidence_sha256"),
            "package_sha256": package_hashes(path), "mode": info.get("mode"), "base": info.get("base")}  # fmt: skip
    return Subject("package", path, path, mr, prov)


def _from_case(case_dir: Path, workdir: Path) -> Subject:
    from zen.reuse.package import make_patch, write_package

    manifest = case.load_manifest(case_dir)
    mr = case.load_mr(case_dir)
    if mr.framework == "keras":
        _refuse_keras(case_dir)
    case.require_intact(case_dir, manifest, case.ALL_FILES)  # the package is built from every case file
    check_weights(mr, case_dir / case.WEIGHTS, case_dir)
    data, _ = make_patch(case_dir, None)
    pkg = write_package(case_dir, Path(workdir) / PACKAGE_NAME, data, None)
    prov = {"case": str(case_dir.resolve()), "evidence_sha256": (manifest.get("evidence") or {}).get("sha256"),
            "manifest_sha256": case.file_sha256(case_dir / case.MANIFEST), "mode": "self-contained",
            "patch_sha256": data["content_sha256"]}  # fmt: skip
    return Subject("case", case_dir, pkg, mr, prov)
