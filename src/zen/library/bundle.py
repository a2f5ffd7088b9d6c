"""Fingerprint bundles: the case files a library entry (or an attribution query) is made from.

A bundle is the bytes of `mr.json`, `pr.json`, `ur.json`, the rebuilt `code.marshal` when the case
has one, and `manifest.json`, whose `files` digests vouch for the others. Never the image and
never the weights: a fingerprint is what attribution compares. `zen library add` makes one from a
case directory whichever library it writes to; for a `zen serve` it is the upload.

`Bundle.fingerprint()` is the one reader of a bundle, for a local add and for a server's upload
alike, so both refuse the same things for the same reasons:

* the manifest is checked against its JSON Schema (zen.represent.case.check_manifest);
* every file sent must be the one the manifest recorded (sha256), and mr/pr/ur must be present;
* each file is parsed by the case-file readers (zen.represent.schema: bounded nesting, every field
  typed against the dataclasses), the same code `zen attribute` reads a case with;
* with `limits` (a server's uploads), sizes are bounded before parsing, and the parts of an MR or
  PR whose cost grows faster than their size are bounded after: the module graph (its Laplacian
  spectrum is a dense eigen-decomposition, quadratic in memory and cubic in time) and the code
  objects (compared pairwise with the candidates' code).

A query bundle (`zen attribute` against a server) holds mr.json and pr.json only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zen.represent import case
from zen.represent.mr import MR_FORMAT, ModelMR
from zen.represent.pr import PR_FORMAT, UR_FORMAT, ProgrammaticRepresentation, UnifiedRepresentation
from zen.represent.schema import CaseFileError, parse_json_bytes, record_from_json

FINGERPRINT_FILES = (case.MR_FILE, case.PR_FILE, case.UR_FILE)
OPTIONAL_FILES = (case.CODE_FILE,)
QUERY_FILES = (case.MR_FILE, case.PR_FILE)
ALL_PARTS = (case.MANIFEST, *FINGERPRINT_FILES, *OPTIONAL_FILES)
# multipart field of each file in an upload to `zen serve`
FILE_OF_PART = {"manifest": case.MANIFEST, "mr": case.MR_FILE, "pr": case.PR_FILE, "ur": case.UR_FILE, "code": case.CODE_FILE}
PART_OF_FILE = {v: k for k, v in FILE_OF_PART.items()}
RECORDS = {case.MR_FILE: (ModelMR, "zen-mr", MR_FORMAT), case.PR_FILE: (ProgrammaticRepresentation, "zen-pr", PR_FORMAT),
           case.UR_FILE: (UnifiedRepresentation, "zen-ur", UR_FORMAT)}  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """Bounds on an uploaded fingerprint. Real ones stay far below: a transformers process's pr.json
    is ~23 MB with ~3,400 model code objects; the largest timm model graph has ~1,400 modules."""

    file_bytes: int = 128 << 20
    manifest_bytes: int = 1 << 20
    graph_nodes: int = 8192
    graph_edges: int = 200_000
    code_objects: int = 100_000


class BundleError(CaseFileError):
    """A bundle that cannot be a fingerprint: a file missing, altered, too large or malformed."""


@dataclass
class Fingerprint:
    """A checked bundle, ready for `Library.add_fingerprint`."""

    mr: ModelMR
    pr: ProgrammaticRepresentation
    ur: UnifiedRepresentation
    code: bytes | None
    source_sha256: str | None
    python: str | None
    torch: str | None
    digests: dict[str, Any]  # file name -> sha256 (as the manifest records them), "evidence" -> the image's


class Bundle:
    """Case files by name, as bytes (read once: what is checked is what is parsed)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    @classmethod
    def from_case(cls, case_dir: Path, *, query: bool = False) -> Bundle:
        """The bundle of a case directory. A base's fingerprint is what every later attribution
        trusts, so an add needs the whole case intact; a query needs its mr.json and pr.json intact
        (other problems are the caller's to report, as local `zen attribute` does)."""
        manifest = case.load_manifest(case_dir)
        names = QUERY_FILES if query else FINGERPRINT_FILES + tuple(n for n in OPTIONAL_FILES if n in manifest.get("files", {}))
        case.require_intact(case_dir, manifest, names if query else case.ALL_FILES)
        files = {n: (Path(case_dir) / n).read_bytes() for n in names}
        if not query:
            files[case.MANIFEST] = (Path(case_dir) / case.MANIFEST).read_bytes()
        return cls(files)

    def _sized(self, limits: Limits | None) -> None:
        unknown = sorted(set(self.files) - set(ALL_PARTS))
        if unknown:
            raise BundleError(f"unexpected part {unknown[0]!r} in the fingerprint", f"send only {', '.join(ALL_PARTS)}")
        if limits is None:
            return
        for name, data in self.files.items():
            cap = limits.manifest_bytes if name == case.MANIFEST else limits.file_bytes
            if len(data) > cap:
                raise BundleError(f"{name} is {len(data):,} bytes, more than a fingerprint file may be ({cap:,})")

    def _records(self, names: tuple[str, ...], limits: Limits | None) -> dict[str, Any]:
        missing = [n for n in names if n not in self.files]
        if missing:
            raise BundleError(f"the fingerprint has no {missing[0]}", f"send {', '.join(names)}")
        out = {}
        for name in names:
            cls, kind, fmt = RECORDS[name]
            out[name] = record_from_json(parse_json_bytes(self.files[name], name), cls, kind, fmt, name)
        if limits is not None:
            bounded(out[case.MR_FILE], out[case.PR_FILE], limits)
        return out

    def query(self, limits: Limits | None = None) -> tuple[ModelMR, ProgrammaticRepresentation]:
        """(mr, pr) of a query bundle."""
        self._sized(limits)
        r = self._records(QUERY_FILES, limits)
        return r[case.MR_FILE], r[case.PR_FILE]

    def fingerprint(self, limits: Limits | None = None) -> Fingerprint:
        """The checked fingerprint (see the module docstring); every failure is a one-line BundleError."""
        self._sized(limits)
        if case.MANIFEST not in self.files:
            raise BundleError("the fingerprint has no manifest.json", "send the case's manifest.json with its files")
        manifest = case.check_manifest(parse_json_bytes(self.files[case.MANIFEST], case.MANIFEST), case.MANIFEST)
        recorded = manifest["files"]
        digests: dict[str, Any] = {}
        for name, data in self.files.items():
            if name == case.MANIFEST:
                continue
            if name not in recorded:
                raise BundleError(f"{name} is not recorded in manifest.json", "send the files of one case, as zen wrote them")
            digest = hashlib.sha256(data).hexdigest()
            if digest != recorded[name]:
                raise BundleError(f"{name} differs from the file manifest.json records (sha256 {digest[:16]}…, recorded "
                                  f"{recorded[name][:16]}…)", "send the files of one case, as zen wrote them")  # fmt: skip
            digests[name] = digest
        if case.WEIGHTS in recorded:
            digests[case.WEIGHTS] = recorded[case.WEIGHTS]  # what the fingerprint was taken from; the weights stay home
        r = self._records(FINGERPRINT_FILES, limits)
        evidence = manifest.get("evidence") or {}
        if evidence.get("sha256"):
            digests["evidence"] = evidence["sha256"]
        return Fingerprint(r[case.MR_FILE], r[case.PR_FILE], r[case.UR_FILE], self.files.get(case.CODE_FILE),
                           evidence.get("sha256"), (manifest.get("python") or {}).get("version"),
                           (manifest.get("torch") or {}).get("version"), digests)  # fmt: skip


def bounded(mr: ModelMR, pr: ProgrammaticRepresentation, limits: Limits) -> None:
    """Refuse an MR whose module graph, or a PR whose code, exceeds `limits`, and a graph that is
    not lists of names (attribution walks it without further checks)."""
    from zen.represent.verify import graph_problems

    shape = graph_problems(mr.graph)  # the case check's rule: edges of names
    if shape:
        raise BundleError(shape[0])
    hierarchy, dataflow = mr.graph.get("hierarchy", []), mr.graph.get("dataflow", [])
    for key, edges in (("hierarchy", hierarchy), ("dataflow", dataflow)):
        if len(edges) > limits.graph_edges:
            raise BundleError(f"mr.json: graph.{key} is not a list of at most {limits.graph_edges:,} edges")
    nodes = {m.path for m in mr.modules} | {x for e in hierarchy for x in e[:2]}
    if len(nodes) > limits.graph_nodes:
        raise BundleError(f"mr.json: {len(nodes):,} modules is more than a fingerprint may hold ({limits.graph_nodes:,})")
    if len(pr.codes) > limits.code_objects:
        raise BundleError(
            f"pr.json: {len(pr.codes):,} code objects is more than a fingerprint may hold ({limits.code_objects:,})"
        )
