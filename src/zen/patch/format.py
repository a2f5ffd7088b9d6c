"""Patch files: the recovered model's code, as changes to a base model's code (ZEN §IV-D, Fig. 2).

A patch is one JSON document, versioned and self-describing:

    format, kind = "zen-patch", python {version, minor}, mode ("patch" | "self-contained"), base,
    source {case, image sha256, model}, modules {recovered module -> base module | null (synthesise)},
    class_map / function_map {recovered "module:qualname" -> target "module:qualname"},
    classes [added classes, bases before subclasses: bases, metaclass, attributes, methods],
    functions [{op: "replace"|"add", fid, module, qualname, owner, attr, binding, code: SHA256,
                defaults, kwdefaults, closure, changes}],
    globals {module -> {name -> encoded value}}, class_changes {class -> {attribute -> encoded value}},
    class_bases {class -> [bases]} and class_removals {class -> [names]} (mapped classes whose bases
    or methods differ from the base's), class_mro {class -> [MRO]} (checked at load),
    blobs {SHA256 -> base64(marshal(code))},
    content_sha256 (of everything else, canonical JSON)

Code objects travel as marshal data (zen's own output; marshal is only ever loaded after its
SHA-256 matched and the Python version matched). A patch edited after it was written, or written
for another Python version, is refused before anything is loaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import marshal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zen import __version__
from zen.cpython.code import canonical_marshal
from zen.represent import textio
from zen.runtime.errors import ZenError

if TYPE_CHECKING:  # the loader of a reuse package imports this module: keep it light
    from zen.diff.differ import DiffResult
    from zen.represent.pr import ClassRecord, CodeRecord, ProgrammaticRepresentation

PATCH_FORMAT = 1


class PatchError(ZenError):
    pass


def _canonical(data: dict) -> bytes:
    body = {k: v for k, v in data.items() if k != "content_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # Strings from an image may hold surrogates (CPython str allows them). The file holds them as JSON escapes
    # (backslashreplace), and reading it back joins a high and a low one into one character: join them here too
    # (through UTF-16), and hash a lone one as its escape. Text without surrogates hashes as it always did.
    text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return text.encode("utf-8", "backslashreplace")


def _order_classes(classes: list[ClassRecord], key) -> list[ClassRecord]:
    """Bases before subclasses (among the classes being created)."""
    by_key = {key(c): c for c in classes}
    out, done, visiting = [], set(), set()

    def visit(c: ClassRecord) -> None:
        k = key(c)
        if k in done or k in visiting:
            return
        visiting.add(k)
        for b in c.bases:
            dep = next((x for x in classes if x.name == b), None)
            if dep is not None:
                visit(dep)
        visiting.discard(k)
        done.add(k)
        out.append(c)

    for c in sorted(classes, key=key):
        visit(by_key[key(c)])
    return out


class PatchBuilder:
    def __init__(self, pr: ProgrammaticRepresentation, code: dict[str, Any], source: dict[str, Any]) -> None:
        self.pr = pr
        self.code = code  # code address -> rebuilt types.CodeType (case code.marshal)
        self.source = source
        self.blobs: dict[str, str] = {}
        self.functions: list[dict] = []
        self.classes_by_name = {c.name: c for c in pr.classes}

    def _blob(self, rec: CodeRecord) -> str:
        code = self.code.get(rec.address)
        if code is None:
            raise PatchError(f"no rebuilt code for {rec.fid}", "the case's code.marshal lacks it (corrupt or other Python)")
        raw = canonical_marshal.dumps(code)  # the blob's hash must not depend on this process
        sha = hashlib.sha256(raw).hexdigest()
        self.blobs[sha] = base64.b64encode(raw).decode()
        return sha

    def function(self, op: str, rec: CodeRecord, module: str, qualname: str, owner: str | None, changes: dict | None = None,
                 attr: str | None = None, inst: dict | None = None, match: str | None = None) -> int:  # fmt: skip
        """One function object: the code record's first function, or `inst`, another one sharing its code."""
        i = inst or {"function": rec.function, "attr": rec.attr, "binding": rec.binding, "defaults_enc": rec.defaults_enc,
                     "kwdefaults_enc": rec.kwdefaults_enc, "closure_enc": rec.closure_enc, "dict_enc": rec.dict_enc,
                     "globals_module": rec.globals_module}  # fmt: skip
        entry = {"id": len(self.functions), "op": op, "fid": rec.fid, "module": module, "qualname": qualname, "owner": owner,
                 "attr": attr or i["attr"] or qualname.rsplit(".", 1)[-1], "binding": i["binding"] or "function",
                 "code": self._blob(rec), "defaults": i["defaults_enc"], "kwdefaults": i["kwdefaults_enc"],
                 "closure": i["closure_enc"], "dict": i["dict_enc"], "freevars": rec.freevars, "changes": changes or {},
                 "function": i["function"], "code_address": rec.address, "globals_module": i.get("globals_module"),
                 "match": match or rec.qualname,
                 "recovered": f"{rec.module}:{rec.qualname}"}  # fmt: skip
        self.functions.append(entry)
        return entry["id"]

    def klass(self, rec: ClassRecord, target_module: str) -> dict:
        methods = []
        owner = f"{target_module}:{rec.qualname}"
        for c in self.pr.codes:
            if c.parent is not None:
                continue
            if c.owner_class == rec.name:
                fid = self.function("add", c, target_module, c.qualname, owner)
                methods.append({"attr": self.functions[fid]["attr"], "binding": c.binding or "function", "function": fid})
            for o in c.others:  # the same code (a decorator's wrapper) on other methods of this class
                if o.get("owner") == rec.name and o.get("attr"):
                    fid = self.function("add", c, target_module, o.get("qualname") or c.qualname, owner, inst=o)
                    methods.append({"attr": o["attr"], "binding": o.get("binding") or "function", "function": fid})
        bases = [self._ref(b) for b in rec.bases]
        return {"key": f"{rec.module}:{rec.qualname}", "recovered_module": rec.module, "module": target_module,
                "qualname": rec.qualname,
                "name": rec.qualname.rsplit(".", 1)[-1], "bases": bases, "metaclass": rec.metaclass,
                "attributes": rec.attributes, "methods": methods}  # fmt: skip

    def mro(self, classes: list[ClassRecord], class_map: dict[str, str]) -> dict[str, list[str]]:
        """target class -> its recovered MRO as references (translated through the class map when
        applied): `load()` checks that every rebuilt class resolves attributes as the image's did."""
        out = {}
        for rec in classes:
            target = class_map.get(f"{rec.module}:{rec.qualname}")
            if target is not None and rec.mro_names:
                out[target] = [self._ref(n) for n in rec.mro_names]
        return dict(sorted(out.items()))

    def _ref(self, full_name: str) -> str:
        rec = self.classes_by_name.get(full_name)
        if rec is not None:
            return f"{rec.module}:{rec.qualname}"
        mod, _, q = full_name.rpartition(".")
        return f"{mod or 'builtins'}:{q}"

    def document(self, mode: str, base: str | None, modules: dict, class_map: dict, function_map: dict, classes: list[dict],
                 globals_: dict, class_changes: dict | None = None, structure: dict | None = None) -> dict:  # fmt: skip
        version = self.source.get("python") or ".".join(map(str, sys.version_info[:3]))
        data = {
            "format": PATCH_FORMAT, "kind": "zen-patch", "tool": f"zen {__version__}",
            "python": {"version": version, "minor": ".".join(version.split(".")[:2])},
            "mode": mode, "base": base, "source": self.source, "modules": modules, "class_map": class_map,
            "function_map": function_map, "classes": classes, "functions": self.functions, "globals": globals_,
            "class_changes": class_changes or {}, "blobs": dict(sorted(self.blobs.items())),
            **(structure or {}),
        }  # fmt: skip
        data["content_sha256"] = hashlib.sha256(_canonical(data)).hexdigest()
        return data


def build_patch(d: DiffResult, pr: ProgrammaticRepresentation, code: dict, source: dict,
                base_pr: ProgrammaticRepresentation | None = None) -> dict:  # fmt: skip
    """A patch that turns the base model's code into the recovered model's. With the base's PR,
    mapped classes are completed too (`complete_mapped_classes`)."""
    b = PatchBuilder(pr, code, source)
    function_map: dict[str, str] = {}
    for f in d.changed:
        b.function(
            "replace",
            f.recovered,
            f.target_module,
            f.target_qualname,
            f.owner,
            f.changes,
            attr=f.base.attr if f.base else None,
            match=f.base.qualname if f.base else None,
        )
        function_map[f"{f.recovered.module}:{f.recovered.qualname}"] = f"{f.target_module}:{f.target_qualname}"
    for f in d.added:
        b.function("add", f.recovered, f.target_module, f.target_qualname, f.owner)
        function_map[f"{f.recovered.module}:{f.recovered.qualname}"] = f"{f.target_module}:{f.target_qualname}"
    ordered = _order_classes(d.classes_added, key=lambda c: c.name)
    classes = [b.klass(c, d.module_map.get(c.module) or c.module) for c in ordered]
    modules = dict(d.module_map)
    globals_ = {m: names for m, names in pr.module_globals.items() if m in modules}  # keyed by recovered module
    structure: dict[str, Any] = {"class_mro": b.mro([c for c in pr.classes if c.module in modules], d.class_map)}
    if base_pr is not None:
        structure.update(complete_mapped_classes(b, d, pr, base_pr, function_map))
    return b.document("patch", d.base, modules, d.class_map, function_map, classes, globals_, d.class_changes, structure)


def complete_mapped_classes(b: PatchBuilder, d: DiffResult, pr: ProgrammaticRepresentation, base_pr: ProgrammaticRepresentation,
                            function_map: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """What a recovered class has that its base counterpart lacks, beyond changed code.

    Algorithm 2 pairs code objects, so a method the fork *renamed* pairs (often exactly) with the
    base's method under the old name: as a change it is nothing, yet the fork's code calls the new
    name. Every method, property accessor or static/class method a mapped recovered class holds
    under a name its base class does not is added under that name; methods the base class holds and
    the recovered class does not are removed (inherited ones then resolve as in the image); a class
    whose bases changed gets the recovered bases. Class attributes are in `class_changes` already."""
    base_classes = {f"{c.module}:{c.qualname}": c for c in base_pr.classes}
    base_names = {c.name: f"{c.module}:{c.qualname}" for c in base_pr.classes}
    added = {f"{c.module}:{c.qualname}" for c in d.classes_added}
    have = {(e["owner"], e["attr"]) for e in b.functions if e["owner"]}  # (class, name) already in the patch
    have_bound = {(e["owner"], e["attr"], e["binding"]) for e in b.functions if e["owner"]}  # a property's accessors share a name
    bases: dict[str, list[str]] = {}
    removals: dict[str, list[str]] = {}
    for rec in pr.classes:
        key = f"{rec.module}:{rec.qualname}"
        target = d.class_map.get(key)
        base = base_classes.get(target) if target and key not in added else None
        if base is None:
            continue
        module, qual = target.split(":", 1)
        for c in pr.codes:
            insts = [] if c.parent is not None else ([None] if c.owner_class == rec.name and c.function else [])
            insts += [o for o in (c.others if c.parent is None else []) if o.get("owner") == rec.name and o.get("attr")]
            for o in insts:
                attr = (o or {}).get("attr") or c.attr or c.qualname.rsplit(".", 1)[-1]
                binding = (o or {}).get("binding") or c.binding or "function"
                if attr in base.methods or (target, attr, binding) in have_bound:
                    continue
                if (target, attr) in have and not binding.startswith("property."):
                    continue
                b.function("add", c, module, f"{qual}.{attr}", target, attr=attr, inst=o)
                have.add((target, attr))
                have_bound.add((target, attr, binding))
                function_map.setdefault(f"{c.module}:{c.qualname}", f"{module}:{qual}.{attr}")
        gone = sorted(set(base.methods) - set(rec.methods) - set(rec.attributes))
        if gone:
            removals[target] = gone
        mine = [d.class_map.get(b._ref(x), b._ref(x)) for x in rec.bases]
        theirs = [base_names.get(x) or b._ref(x) for x in base.bases]
        if mine != theirs:
            bases[target] = [b._ref(x) for x in rec.bases]
    return {"class_bases": dict(sorted(bases.items())), "class_removals": dict(sorted(removals.items()))}


def build_self_contained(pr: ProgrammaticRepresentation, code: dict, source: dict, model_modules: set[str]) -> dict:
    """A patch that synthesises every model module from the recovered code alone (no base).

    `model_modules`: the modules defining the model's own classes (attribution's primary modules);
    everything else the code refers to (torch, installed libraries) is imported by name."""
    b = PatchBuilder(pr, code, source)
    mine = [c for c in pr.classes if c.module in model_modules]
    classes = [b.klass(c, c.module) for c in _order_classes(mine, key=lambda c: c.name)]
    for c in pr.codes:
        if c.parent is None and c.owner_class is None and c.function and c.module in model_modules:
            b.function("add", c, c.module, c.qualname, None)
        for o in c.others if c.parent is None else []:
            if o.get("owner") is None and o.get("module") in model_modules:
                b.function("add", c, o["module"], o.get("qualname") or c.qualname, None, inst=o)
    modules = {m: None for m in sorted(model_modules)}
    class_map = {f"{c.module}:{c.qualname}": f"{c.module}:{c.qualname}" for c in mine}
    globals_ = {m: names for m, names in pr.module_globals.items() if m in modules}
    structure = {"class_mro": b.mro(mine, class_map)}
    return b.document("self-contained", None, modules, class_map, {}, classes, globals_, None, structure)


def write_patch(data: dict, path: Path) -> None:
    textio.write_json(path, data, indent=1)


def read_patch(path: Path, *, check_python: bool = True) -> dict:
    """Load a patch and verify it; raises PatchError (clearly) for another Python or any tampering."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PatchError(f"patch file not found: {path}") from None
    except ValueError as exc:
        raise PatchError(f"{path} is not a zen patch (invalid JSON: {exc})") from None
    if data.get("kind") != "zen-patch" or data.get("format") != PATCH_FORMAT:
        raise PatchError(f"{path} is not a zen patch (format {PATCH_FORMAT})")
    if hashlib.sha256(_canonical(data)).hexdigest() != data.get("content_sha256"):
        raise PatchError(f"{path} was modified after it was written (content hash mismatch); refusing it")
    for sha, blob in data["blobs"].items():
        if hashlib.sha256(base64.b64decode(blob)).hexdigest() != sha:
            raise PatchError(f"{path}: code blob {sha[:12]}... does not match its hash; refusing the patch")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if check_python and data["python"]["minor"] != here:
        raise PatchError(
            f"{path} holds Python {data['python']['minor']} bytecode; this interpreter is Python {here}",
            f"apply it under Python {data['python']['minor']} (bytecode is specific to a minor version)",
        )
    return data


def code_of(data: dict, sha: str):
    """The code object of a verified patch's blob (marshal is loaded only after verification)."""
    return marshal.loads(base64.b64decode(data["blobs"][sha]))
