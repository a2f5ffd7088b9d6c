"""Are these cases one model? The check `zen drift` makes before comparing weights.

Snapshots of one process taken at different times must hold the same model: the same module tree
(paths and classes), the same tensors (state_dict keys, dtypes, shapes) and the same model code
(every model-specific code object by function ID and the sha256 of its de-specialised bytecode,
which does not change as the interpreter specialises it at run time). Anything else means the
weights of different models would be set side by side, so drift refuses and says what differs.
Hyper-parameters (plain values in a module's __dict__) may legitimately move during online
learning (a step counter, a schedule): they are reported, not refused; the `training` flag is
neither (a process switching between train and eval is the normal case).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from zen.analyze.tensors import TensorFile
from zen.represent import case
from zen.represent.mr import ModelMR
from zen.runtime.errors import ZenError

HINT_SAME = "zen drift compares snapshots of one model; `zen diff` or `zen attribute` compare different models"


@dataclass
class Snapshot:
    """One case: where it is, its records, and its tensor files (opened lazily by the reader)."""

    path: Path
    manifest: dict
    mr: ModelMR
    code: Counter  # (function ID, bytecode sha256) -> count
    weights: TensorFile
    extra: TensorFile | None

    @property
    def label(self) -> str:
        return self.path.name or str(self.path)

    @property
    def acquired_at(self) -> str | None:
        ev = self.manifest.get("evidence") or {}
        return (ev.get("acquisition") or {}).get("acquired_at")

    @property
    def evidence_sha256(self) -> str | None:
        return (self.manifest.get("evidence") or {}).get("sha256")


def open_snapshot(case_dir: Path) -> Snapshot:
    """Load and verify one case (every file drift reads must be what zen wrote); refuse one without weights."""
    case_dir = Path(case_dir)
    manifest = case.load_manifest(case_dir)
    case.require_intact(case_dir, manifest, (case.MR_FILE, case.PR_FILE, case.WEIGHTS, case.EXTRA))
    mr = case.load_mr(case_dir)
    readable = [t for t in mr.tensors if t.status == "ok"]
    if not readable or not (case_dir / case.WEIGHTS).is_file():
        n = len(mr.tensors)
        why = f"none of its {n} tensors was readable" if n else "the model has no parameters or buffers"
        raise ZenError(f"{case_dir} has no recovered weights ({why})",
                       "drift needs the weights of every snapshot: recover each from a complete image")  # fmt: skip
    code: Counter = Counter()
    if (case_dir / case.PR_FILE).is_file():
        code = Counter((c.fid, c.bytecode_sha256) for c in case.load_pr(case_dir).codes)
    extra = TensorFile(case_dir / case.EXTRA) if (case_dir / case.EXTRA).is_file() else None
    return Snapshot(case_dir, manifest, mr, code, TensorFile(case_dir / case.WEIGHTS), extra)


def _first(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" (and {len(items) - n} more)" if len(items) > n else "")


def differences(a: Snapshot, b: Snapshot) -> list[str]:
    """What makes b another model than a: module tree, tensors, code (empty: the same model)."""
    out: list[str] = []
    if a.mr.framework != b.mr.framework:
        out.append(f"framework {a.mr.framework} vs {b.mr.framework}")
    ma = {m.path: m.cls for m in a.mr.modules}
    mb = {m.path: m.cls for m in b.mr.modules}
    only_a, only_b = sorted(set(ma) - set(mb)), sorted(set(mb) - set(ma))
    if only_a:
        out.append(f"modules only in {a.label}: {_first([p or '<root>' for p in only_a])}")
    if only_b:
        out.append(f"modules only in {b.label}: {_first([p or '<root>' for p in only_b])}")
    changed = [f"{p or '<root>'} ({ma[p]} vs {mb[p]})" for p in sorted(set(ma) & set(mb)) if ma[p] != mb[p]]
    if changed:
        out.append(f"module classes differ: {_first(changed)}")
    ta = {t.key: (t.dtype, list(t.shape)) for t in a.mr.tensors}
    tb = {t.key: (t.dtype, list(t.shape)) for t in b.mr.tensors}
    if set(ta) != set(tb):
        diff = sorted(set(ta) ^ set(tb))
        out.append(f"tensors in one snapshot only: {_first(diff)}")
    shapes = [f"{k} {ta[k][0]}{ta[k][1]} vs {tb[k][0]}{tb[k][1]}" for k in sorted(set(ta) & set(tb)) if ta[k] != tb[k]]
    if shapes:
        out.append(f"tensor shapes or dtypes differ: {_first(shapes)}")
    if a.code != b.code:
        fa = {f for f, _ in a.code}
        fb = {f for f, _ in b.code}
        edited = sorted(f for f in fa & fb if {h for g, h in a.code if g == f} != {h for g, h in b.code if g == f})
        gone, new = sorted(fa - fb), sorted(fb - fa)
        parts = ([f"changed {_first(edited)}"] if edited else []) + ([f"only in {a.label}: {_first(gone)}"] if gone else []) \
            + ([f"only in {b.label}: {_first(new)}"] if new else [])  # fmt: skip
        out.append("model code differs: " + "; ".join(parts or ["the same functions in different numbers"]))
    return out


def hyperparameter_changes(snaps: list[Snapshot]) -> list[dict]:
    """Hyper-parameters whose value differs between snapshots: [{module, name, values per snapshot}]."""
    out = []
    for m in snaps[0].mr.modules:
        names = set(m.hyperparameters) - {"training"}
        others = [s.mr.module(m.path) for s in snaps[1:]]
        for name in sorted(names.union(*(set(o.hyperparameters) - {"training"} for o in others))):
            values = [m.hyperparameters.get(name)] + [o.hyperparameters.get(name) for o in others]
            if len(set(values)) > 1:
                out.append({"module": m.path or "<root>", "name": name, "values": values})
    return out


def require_one_model(snaps: list[Snapshot]) -> None:
    """Refuse (exit 2) unless every snapshot holds the same model as the first; the message names what changed."""
    first = snaps[0]
    for s in snaps[1:]:
        diff = differences(first, s)
        if diff:
            raise ZenError(f"{s.label} is not the same model as {first.label}: {diff[0]}"
                           + (f" (and {len(diff) - 1} more differences)" if len(diff) > 1 else ""), HINT_SAME)  # fmt: skip
