"""`zen drift`: how a deployed model's weights moved between memory snapshots (AiP §4.4, Table 4).

Input: cases recovered from images of one process taken at different times, in time order. After
the sameness check (sameness.py), every tensor is compared in each snapshot with the first
snapshot (the baseline) and with the snapshot before it:

- `l2`: ||w_i - w_0||_2;  `relative`: l2 / ||w_0||_2;  `cosine`: <w_0, w_i> / (||w_0|| ||w_i||);
- `changed`: the fraction of elements whose stored bits differ from the baseline's (exact: a
  weight that moved by one ulp counts, a NaN that stayed NaN does not);
- `step_l2`, `step_changed`: the same against the previous snapshot;
- `first_changed`: the first snapshot whose bits differ from the one before it (None: never).

A layer (the module that registers the tensors) and the whole model aggregate their floating-point
tensors' sums: l2 = sqrt(sum of squared distances), cosine over the concatenated vectors, changed
over all elements. Integer tensors (BatchNorm's num_batches_tracked, step counters) are reported
per tensor only: a counter going from 0 to 60 would otherwise outweigh every weight of its layer.
Sums are taken in float64 from the stored values (bfloat16 and float8 widened exactly). Tied
weights are counted once. Tensors the model holds outside its state_dict (extra.safetensors:
non-persistent buffers, attribute tensors, and for Keras cases the optimizer's slots and state)
are compared the same way, apart. PyTorch optimizer state is not in a case: `zen recover` reads
the model's module tree, and an optimizer (its momentum buffers, Adam moments) is a separate object
that holds references to the parameters, not one the model holds; drift says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zen import __version__
from zen.analyze.sameness import Snapshot, hyperparameter_changes, open_snapshot, require_one_model
from zen.analyze.tensors import CHUNK, TensorFile, to_float64
from zen.runtime.errors import ZenError

FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")

OPTIMIZER_NOTE_TORCH = ("PyTorch optimizer state (torch.optim momentum buffers, Adam moments, step counts) is not recovered: "
                        "`zen recover` reads the model's module tree, and the optimizer is a separate object that references "
                        "the parameters; the drift of the parameters themselves is complete")  # fmt: skip


@dataclass
class Sums:
    """What the metrics of one comparison (a against b) are computed from; additive over tensors."""

    aa: float = 0.0  # <a, a>
    bb: float = 0.0
    ab: float = 0.0
    dd: float = 0.0  # ||b - a||^2
    changed: int = 0
    numel: int = 0
    nonfinite: int = 0  # elements NaN or infinite in a or b: the norms and the cosine are undefined

    def add(self, o: Sums) -> None:
        self.aa, self.bb, self.ab, self.dd = self.aa + o.aa, self.bb + o.bb, self.ab + o.ab, self.dd + o.dd
        self.changed, self.numel = self.changed + o.changed, self.numel + o.numel
        self.nonfinite += o.nonfinite


def compare(fa: TensorFile, fb: TensorFile, key: str) -> Sums:
    """Sums of one tensor in two snapshots, a chunk at a time (GB-sized tensors stay on disk)."""
    ia, ib = fa.tensors[key], fb.tensors[key]
    if (ia.dtype, ia.shape) != (ib.dtype, ib.shape):
        raise ZenError(f"{key}: {ia.dtype} {list(ia.shape)} in {fa.path} but {ib.dtype} {list(ib.shape)} in {fb.path}",
                       "drift compares snapshots of one model; recover both from images of the same process")  # fmt: skip
    dtype = ia.dtype
    s = Sums(numel=ia.numel)
    unsigned = None
    for ra, rb in zip(fa.chunks(key, CHUNK), fb.chunks(key, CHUNK)):
        unsigned = unsigned or np.dtype(f"<u{ra.dtype.itemsize}")
        a, b = to_float64(dtype, ra), to_float64(dtype, rb)
        s.nonfinite += int(a.size - np.count_nonzero(np.isfinite(a) & np.isfinite(b)))
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: counted above, reported, never a raw warning
            d = b - a
        s.aa += float(np.dot(a, a))
        s.bb += float(np.dot(b, b))
        s.ab += float(np.dot(a, b))
        s.dd += float(np.dot(d, d))
        s.changed += int(np.count_nonzero(ra.view(unsigned) != rb.view(unsigned)))
    return s


def _metrics(base: Sums, step: Sums) -> dict[str, Any]:
    """The reported numbers of one snapshot (None where undefined: a zero-norm baseline, empty tensors)."""
    if base.nonfinite:  # NaN or infinite weights: no norm, relative change or cosine means anything
        return {"l2": None, "relative": None, "cosine": None, "changed": (base.changed / base.numel) if base.numel else 0.0,
                "step_l2": None, "step_changed": (step.changed / step.numel) if step.numel else 0.0,
                "nonfinite": base.nonfinite}  # fmt: skip
    l2 = math.sqrt(base.dd)
    na, nb = math.sqrt(base.aa), math.sqrt(base.bb)
    return {
        "l2": l2,
        "relative": (l2 / na) if na > 0 else (0.0 if l2 == 0 else None),
        # bit-identical vectors are exactly parallel (the float quotient of equal sums can miss 1 by an ulp)
        "cosine": (1.0 if base.changed == 0 else base.ab / (na * nb)) if na > 0 and nb > 0 else None,
        "changed": (base.changed / base.numel) if base.numel else 0.0,
        "step_l2": math.sqrt(step.dd),
        "step_changed": (step.changed / step.numel) if step.numel else 0.0,
    }  # fmt: skip


@dataclass
class Series:
    """One tensor, layer or the model, over the snapshots."""

    name: str
    numel: int = 0
    base: list[Sums] = field(default_factory=list)  # per snapshot i >= 1, against snapshot 0
    step: list[Sums] = field(default_factory=list)  # per snapshot i >= 1, against snapshot i - 1

    @classmethod
    def empty(cls, name: str, snapshots: int) -> Series:
        """A total to add tensors into: zero sums for each snapshot after the first."""
        return cls(name, 0, [Sums() for _ in range(snapshots - 1)], [Sums() for _ in range(snapshots - 1)])

    def add(self, other: Series) -> None:
        for mine, theirs in zip(self.base + self.step, other.base + other.step):
            mine.add(theirs)
        self.numel += other.numel

    def to_json(self, extra: dict | None = None) -> dict[str, Any]:
        series = [_metrics(b, s) for b, s in zip(self.base, self.step)]
        first = next((i + 1 for i, s in enumerate(self.step) if s.changed), None)
        return {"name": self.name, **(extra or {}), "elements": self.numel, "first_changed": first,
                "snapshots": series}  # fmt: skip


def _tensor_series(snaps: list[Snapshot], files: list[TensorFile], key: str) -> Series:
    s = Series(key, numel=files[0].tensors[key].numel)
    for i in range(1, len(snaps)):
        s.base.append(compare(files[0], files[i], key))
        s.step.append(compare(files[i - 1], files[i], key))
    return s


def _owners(snap: Snapshot) -> dict[str, str]:
    """state_dict key -> path of the module registering it (from the MR, not from the key's spelling)."""
    out: dict[str, str] = {}
    for m in snap.mr.modules:
        for k in list(m.parameter_keys.values()) + list(m.buffer_keys.values()):
            if k is not None:
                out.setdefault(k, m.path)
    for t in snap.mr.tensors:  # a subclass's inner tensors belong to its module (outer records come first)
        for inner in t.components.values():
            if t.key in out:
                out.setdefault(inner, out[t.key])
    return out


def _layer_of(key: str, owners: dict[str, str]) -> str:
    if key in owners:
        return owners[key] or "<root>"
    for sep in (".", "/"):
        if sep in key:
            return key.rsplit(sep, 1)[0]
    return "<root>"


def compute(case_dirs: list[Path], progress=None) -> dict[str, Any]:
    """The drift document (drift.json) of snapshots in time order; refuses what is not one model."""
    if len(case_dirs) < 2:
        raise ZenError("zen drift needs at least two cases", "give the cases of every snapshot, oldest first")
    snaps = [open_snapshot(Path(c)) for c in case_dirs]
    require_one_model(snaps)
    first = snaps[0]
    problems: list[str] = []
    tied = {t.key for t in first.mr.tensors if t.tied_to}
    keys, skipped = [], []
    for t in first.mr.tensors:
        if t.key in tied or t.status == "composite":  # a subclass's drift is its inner tensors' (compared as keys)
            continue
        missing = [s.label for s in snaps if s.mr.tensor(t.key).status != "ok" or t.key not in s.weights.tensors]
        if missing:
            skipped.append(t.key)
            problems.append(f"{t.key} not compared: not recovered in {', '.join(missing)}")
        else:
            keys.append(t.key)
    owners = _owners(first)
    weights = [s.weights for s in snaps]
    tensors, layers, model = [], {}, Series.empty("model", len(snaps))
    for n, key in enumerate(keys):
        if progress:
            progress(n, len(keys))
        s = _tensor_series(snaps, weights, key)
        layer = _layer_of(key, owners)
        dtype = weights[0].tensors[key].dtype
        if dtype in FLOATS:
            layers.setdefault(layer, Series.empty(layer, len(snaps))).add(s)
            model.add(s)
        tensors.append(s.to_json({"layer": layer, "dtype": dtype, "shape": list(weights[0].tensors[key].shape),
                                  "in_layer_totals": dtype in FLOATS}))  # fmt: skip
    bad = [t["name"] for t in tensors if any(p.get("nonfinite") for p in t["snapshots"])]
    if bad:
        problems.append(f"{len(bad)} tensor(s) hold NaN or infinite values ({', '.join(bad[:5])}): their L2, relative "
                        "change and cosine (and their layer's and model's) are undefined; 'changed' compares bits")  # fmt: skip
    extra = _extra(snaps, problems)
    times = [s.acquired_at for s in snaps]
    if all(times) and times != sorted(times):
        problems.append("the snapshots are not in the order they were acquired (acquisition times: " + ", ".join(times) + ")")
    shas = [s.evidence_sha256 for s in snaps]
    if len(set(shas)) < len(shas):
        problems.append("two cases come from the same image")
    return {
        "kind": "zen-drift", "format": 1, "tool": f"zen {__version__}",
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "framework": first.mr.framework, "model": first.mr.root.cls,
        "snapshots": [{"index": i, "case": str(s.path.resolve()), "image_sha256": s.evidence_sha256,
                       "acquired_at": s.acquired_at, "pid": (s.manifest.get("evidence") or {}).get("pid"),
                       "status": s.manifest.get("status")} for i, s in enumerate(snaps)],
        "model_drift": model.to_json(), "layers": [layers[k].to_json() for k in sorted(layers, key=_layer_order(first))],
        "counters": [t for t in tensors if not t["in_layer_totals"]],
        "tensors": tensors, "extra": extra, "hyperparameters_changed": hyperparameter_changes(snaps),
        "training_flags": [s.mr.modules[0].training for s in snaps],
        "optimizer": _optimizer(first, extra), "not_compared": skipped, "problems": problems,
    }  # fmt: skip


def _layer_order(snap: Snapshot):
    order = {(m.path or "<root>"): i for i, m in enumerate(snap.mr.modules)}
    return lambda name: (order.get(name, len(order)), name)


def _extra(snaps: list[Snapshot], problems: list[str]) -> list[dict]:
    """Tensors outside the state_dict (extra.safetensors), compared where every snapshot has them."""
    files = [s.extra for s in snaps]
    if any(f is None for f in files):
        return []
    kinds = {t.key: t.kind for t in snaps[0].mr.extra_tensors}
    out = []
    for key in sorted(files[0].tensors):
        info = files[0].tensors[key]
        if any(key not in f.tensors or (f.tensors[key].dtype, f.tensors[key].shape) != (info.dtype, info.shape) for f in files):
            problems.append(f"extra tensor {key} not compared: not in every snapshot with the same shape")
            continue
        out.append(_tensor_series(snaps, files, key).to_json({"kind": kinds.get(key, "extra"), "dtype": info.dtype,
                                                              "shape": list(info.shape)}))  # fmt: skip
    return out


def _optimizer(first: Snapshot, extra: list[dict]) -> dict[str, Any]:
    slots = [e for e in extra if str(e.get("kind", "")).startswith("optimizer")]
    if first.mr.framework == "keras":
        return {"recovered": bool(slots), "tensors": len(slots),
                "note": f"{len(slots)} optimizer variables (slots and state) from extra.safetensors are compared under 'extra'"
                if slots else "no optimizer was attached to the Keras model in the image"}  # fmt: skip
    return {"recovered": False, "tensors": 0, "note": OPTIMIZER_NOTE_TORCH}
