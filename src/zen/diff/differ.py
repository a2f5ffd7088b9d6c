"""Differential analysis (ZEN Algorithm 2): what a recovered model changed relative to its base.

From the code matching of attribution (Ω: pairs, Δ: unmatched recovered code):

* classes are mapped recovered -> base by their code (the base class that most of a class's
  methods matched, pairs scoring >= 0.6), else by identical name; the rest are *added* classes,
  and base model classes nothing maps to are *removed*;
* modules are mapped the same way (majority of matched code); a recovered module with no
  counterpart is *synthesised* when the model is rebuilt;
* ϵ, changed functions: matched pairs whose listings, constants, names, arguments, locals,
  defaults or keyword defaults differ, each with the per-field differences (nested code objects
  travel inside their parent's code object);
* Υ, added functions: recovered code without a counterpart (or whose best counterpart is a
  different function: pair score < 0.5 or a method of an unrelated class): module-level
  functions, methods added to existing classes, and the methods of added classes;
* corrupt objects are excluded and reported: code objects that could not be rebuilt, and those
  whose defaults or closure cells were unreadable in the image (Algorithm 2 lines 2-8, 17-19).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz import fuzz

from zen.attribute.algorithm import primary_modules
from zen.attribute.pr_similarity import code_similarity, views
from zen.represent.mr import ModelMR
from zen.represent.pr import ClassRecord, CodeRecord, ProgrammaticRepresentation

CLASS_VOTE_MIN = 0.6
CHANGE_MIN = 0.5


def _elected(name: str, votes: Counter, weight: Counter) -> str:
    """The base class most of a recovered class's matched methods vote for. Ties (a class with
    two methods matched into two base classes) go to the closer class name, then to the higher
    summed score, then to the name: never to the order of the matched pairs, which follows the
    addresses of the code objects and so changes from one image of the same program to the next
    (the suspected cause of one CI run where Qwen2ForCausalLM was rebuilt as LlamaAttention).
    The name comes before the score: a helper copied into several classes matches exactly
    wherever it is, and says less about which class this is than the name does."""
    short = name.rpartition(".")[2]
    return max(votes, key=lambda b: (votes[b], fuzz.ratio(short, b.rpartition(".")[2]), round(weight[b], 9), b))


def _cls_key(full: str, records: dict[str, ClassRecord]) -> str:
    """'module:qualname' for a class full name (dotted), using the class records to split it."""
    r = records.get(full)
    if r is not None:
        return f"{r.module}:{r.qualname}"
    mod, _, q = full.rpartition(".")
    return f"{mod}:{q}"


@dataclass
class FunctionDiff:
    op: str  # "replace" or "add"
    recovered: CodeRecord
    base: CodeRecord | None
    target_module: str  # module the function lives in (patch) or is created in
    target_qualname: str  # its qualname there
    owner: str | None  # target class "module:qualname" for methods
    score: float | None = None
    changes: dict[str, Any] = field(default_factory=dict)


@dataclass
class DiffResult:
    base: str
    module_map: dict[str, str | None]  # recovered module -> base module (None: synthesise)
    class_map: dict[str, str]  # recovered "module:qualname" -> target "module:qualname"
    changed: list[FunctionDiff] = field(default_factory=list)
    added: list[FunctionDiff] = field(default_factory=list)
    classes_added: list[ClassRecord] = field(default_factory=list)
    classes_removed: list[str] = field(default_factory=list)
    methods_added: list[str] = field(default_factory=list)  # "Class.method" added to an existing class
    added_class_methods: list[FunctionDiff] = field(default_factory=list)  # methods of added classes (made with them)
    unchanged: int = 0
    class_changes: dict[str, dict[str, Any]] = field(default_factory=dict)  # mapped class -> {attribute: encoded value}
    excluded: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"base": self.base, "changed": len(self.changed), "added": len(self.added), "unchanged": self.unchanged,
                "classes_added": [c.name for c in self.classes_added], "classes_removed": self.classes_removed,
                "methods_added": self.methods_added, "class_attributes_changed": sorted(self.class_changes),
                "excluded": self.excluded,
                "module_map": self.module_map}  # fmt: skip


def _has_unreadable(enc: Any) -> bool:
    if isinstance(enc, dict):
        if "unsupported" in enc and str(enc["unsupported"]).startswith("unreadable"):
            return True
        return any(_has_unreadable(v) for v in enc.values())
    if isinstance(enc, list):
        return any(_has_unreadable(v) for v in enc)
    return False


def corrupt_reason(c: CodeRecord, rebuilt: set[str] | None) -> str | None:
    if rebuilt is not None and c.address not in rebuilt:
        return "code object could not be rebuilt from the image"
    for what, enc in (("defaults", c.defaults_enc), ("keyword defaults", c.kwdefaults_enc), ("closure", c.closure_enc)):
        if _has_unreadable(enc):
            return f"{what} point to memory that is not readable as objects"
    return None


def field_changes(r: CodeRecord, b: CodeRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.listing != b.listing:
        out["listing"] = {"base_lines": len(b.listing), "recovered_lines": len(r.listing)}
    for name in ("argcount", "posonlyargcount", "kwonlyargcount", "nlocals", "flags"):
        if getattr(r, name) != getattr(b, name):
            out[name] = {"base": getattr(b, name), "recovered": getattr(r, name)}
    for name in ("varnames", "names", "consts", "freevars", "cellvars"):
        rv, bv = getattr(r, name), getattr(b, name)
        if rv != bv:
            out[name] = {"removed": [x for x in bv if x not in rv], "added": [x for x in rv if x not in bv]}
    for name in ("defaults", "kwdefaults"):
        if getattr(r, name) != getattr(b, name):
            out[name] = {"base": getattr(b, name), "recovered": getattr(r, name)}
    return out


def _python_minor(pr: ProgrammaticRepresentation) -> str:
    version = ((pr.context or {}).get("runtime") or {}).get("python") or ""
    return ".".join(version.split(".")[:2])


def diff(mr: ModelMR, pr: ProgrammaticRepresentation, base_name: str, base_mr: ModelMR, base_pr: ProgrammaticRepresentation,
         rebuilt: set[str] | None = None) -> DiffResult:  # fmt: skip
    rec_primary, base_primary = primary_modules(mr), primary_modules(base_mr)
    # Same Python: every code object as it is (patches replace them one by one). Another Python:
    # 3.11's comprehensions are spliced into their callers, as 3.12+ compiles them.
    inline = _python_minor(pr) != _python_minor(base_pr)
    rec_views = [v for v in views(pr, rec_primary, inline=inline) if v.model_code]
    base_views = [v for v in views(base_pr, base_primary, inline=inline) if v.model_code]
    match = code_similarity(rec_views, base_views, optimal=False)
    rec_classes = {c.name: c for c in pr.classes if c.module in rec_primary}
    base_classes = {c.name: c for c in base_pr.classes if c.module in base_primary}
    rec_codes = [v.rec for v in rec_views]
    # -- class and module maps, from the code ----------------------------------------------------
    votes: dict[str, Counter] = {}
    weight: dict[str, Counter] = {}  # the same votes' summed scores (to choose among tied counts)
    mod_votes: dict[str, Counter] = {}
    for p in match.pairs:
        if p.score < CLASS_VOTE_MIN:
            continue
        mod_votes.setdefault(p.recovered.module, Counter())[p.base.module] += 1
        if p.recovered.owner_class and p.base.owner_class:
            votes.setdefault(p.recovered.owner_class, Counter())[p.base.owner_class] += 1
            weight.setdefault(p.recovered.owner_class, Counter())[p.base.owner_class] += p.score
    methods = Counter(c.owner_class for c in rec_codes if c.owner_class)
    class_map: dict[str, str] = {}
    added_classes: list[ClassRecord] = []
    for name, rec in sorted(rec_classes.items()):
        v = votes.get(name)
        if v and max(v.values()) * 2 >= max(1, methods[name]):
            class_map[f"{rec.module}:{rec.qualname}"] = _cls_key(_elected(name, v, weight[name]), base_classes)
        elif name in base_classes:
            class_map[f"{rec.module}:{rec.qualname}"] = f"{rec.module}:{rec.qualname}"
        else:
            added_classes.append(rec)
    module_map: dict[str, str | None] = {}
    per_module = Counter(c.module for c in rec_codes)
    for m in sorted(rec_primary | set(per_module)):
        v = mod_votes.get(m)
        if v and v.most_common(1)[0][1] * 2 >= per_module[m]:  # most of its code matched there
            module_map[m] = v.most_common(1)[0][0]
        else:
            module_map[m] = m if m in base_primary else None
    for rec in added_classes:  # added classes live in their module's counterpart (or a synthesised one)
        target = module_map.get(rec.module) or rec.module
        class_map[f"{rec.module}:{rec.qualname}"] = f"{target}:{rec.qualname}"
    mapped_targets = set(class_map.values())
    removed = sorted(
        f"{c.module}:{c.qualname}" for c in base_classes.values() if f"{c.module}:{c.qualname}" not in mapped_targets
    )
    res = DiffResult(base_name, module_map, class_map, classes_added=added_classes, classes_removed=removed)
    res.class_changes = class_attribute_changes(rec_classes, base_classes, class_map)
    # -- functions ---------------------------------------------------------------------------------
    added_class_keys = {f"{c.module}:{c.qualname}" for c in added_classes}
    excluded = set()
    for c in rec_codes:
        reason = corrupt_reason(c, rebuilt) if c.parent is None else None
        if reason:
            excluded.add(c.address)
            res.excluded.append({"function": c.fid, "address": c.address, "reason": reason})
    leftovers = list(match.added)
    for p in match.pairs:
        r, b = p.recovered, p.base
        if r.parent is not None or r.address in excluded:
            continue  # nested code travels with its parent
        owner_r = _owner_key(r, rec_classes)
        same_place = (owner_r is None and b.owner_class is None) or (
            owner_r is not None and b.owner_class is not None and class_map.get(owner_r) == _cls_key(b.owner_class, base_classes)
        )
        if p.score < CHANGE_MIN or not same_place or owner_r in added_class_keys:
            leftovers.append(r)
            continue
        changes = {} if p.exact else field_changes(r, b)
        if p.exact and (r.defaults != b.defaults or r.kwdefaults != b.kwdefaults):
            changes = field_changes(r, b)
        if not changes:
            res.unchanged += 1
            continue
        owner_b = _cls_key(b.owner_class, base_classes) if b.owner_class else None
        res.changed.append(FunctionDiff("replace", r, b, b.module, b.qualname, owner_b, p.score, changes))
    for r in sorted(leftovers, key=lambda c: (c.module, c.qualname)):
        if r.parent is not None or r.address in excluded:
            continue
        owner_r = _owner_key(r, rec_classes)
        if owner_r in added_class_keys:
            target_module = module_map.get(r.module) or r.module
            res.added_class_methods.append(FunctionDiff("add", r, None, target_module, r.qualname, class_map.get(owner_r)))
            continue  # created with its class
        target_module = module_map.get(r.module) or r.module
        owner = class_map.get(owner_r) if owner_r else None
        qual = f"{owner.split(':', 1)[1]}.{r.attr}" if owner and r.attr else r.qualname
        res.added.append(FunctionDiff("add", r, None, target_module, qual, owner))
        if owner:
            res.methods_added.append(qual)
    return res


# class-dict entries that are interpreter bookkeeping, not something a fork writes
CLASS_INTERNALS = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "_abc_impl", "__abstractmethods__",
                             "__parameters__", "__orig_bases__", "__firstlineno__", "__static_attributes__",
                             "__doc__"})  # fmt: skip


def class_attribute_changes(rec: dict[str, ClassRecord], base: dict[str, ClassRecord], class_map: dict[str, str]) -> dict:
    """Non-function class attributes a mapped class sets differently from its base counterpart
    (a fork changing `expansion = 4`, a config class): target class -> {name: recovered encoding}."""
    by_key = {f"{c.module}:{c.qualname}": c for c in base.values()}
    out: dict[str, dict[str, Any]] = {}
    for r in rec.values():
        target = class_map.get(f"{r.module}:{r.qualname}")
        b = by_key.get(target) if target else None
        if b is None:
            continue
        changed = {
            k: v
            for k, v in r.attributes.items()
            if k not in CLASS_INTERNALS and _canonical_code(b.attributes.get(k)) != _canonical_code(_renamed(v, r, b))
        }
        if changed:
            out[target] = changed
    return out


def _renamed(enc: Any, r: ClassRecord, b: ClassRecord) -> Any:
    """An encoding with the recovered module name replaced by the base's (a renamed fork's
    `{"cls": "fork:Block"}` equals the base's `{"cls": "base:Block"}`)."""
    if r.module == b.module:
        return enc
    import json

    return json.loads(json.dumps(enc).replace(f'"{r.module}:', f'"{b.module}:'))


def _canonical_code(enc: Any, depth: int = 0) -> Any:
    """`enc` with every embedded function's marshalled code rewritten in canonical form.

    Library entries and cases written before zen wrote canonical marshal hold the same code
    objects as other bytes (the writer's reference counts decided them): compared raw, an
    unchanged function held in a class attribute would show as changed."""
    if depth > 32 or not isinstance(enc, (dict, list)):
        return enc
    if isinstance(enc, list):
        return [_canonical_code(v, depth + 1) for v in enc]
    out = {k: _canonical_code(v, depth + 1) for k, v in enc.items()}
    code, python = enc.get("code"), enc.get("python")
    if isinstance(code, str) and isinstance(python, str):
        import base64
        import binascii

        from zen.cpython.code.canonical_marshal import MarshalFormatError, canonical

        try:
            version = tuple(int(x) for x in python.split(".")[:2])
            out["code"] = base64.b64encode(canonical(base64.b64decode(code), version)).decode()
        except (ValueError, binascii.Error, MarshalFormatError):
            pass  # not marshal data zen can read: compared as it is
    return out


def _owner_key(c: CodeRecord, records: dict[str, ClassRecord]) -> str | None:
    return _cls_key(c.owner_class, records) if c.owner_class else None
