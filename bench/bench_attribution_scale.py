"""Attribution at scale on real fingerprints (issue 16): libraries of 100, 1,000 and 10,000 entries.

    python bench/bench_attribution_scale.py --cases DIR [--work DIR] [--reference 100 1000]

DIR holds real recovered cases (`case_*` directories with manifest.json, mr.json, pr.json, ur.json;
`bench/zoo.py` writes them: torchvision, timm and transformers models recovered from images of
real processes). Libraries are built from those fingerprints plus perturbed copies of them, so that
entries are real-sized (a transformers entry holds ~3,400 code objects) and not identical: each copy
drops ~4% of leaf modules (with their tensors and graph edges), changes a hyper-parameter in ~15% of
the rest and the leading dimension of ~10% of tensors, drops ~3% of code objects and changes the
listing and names of ~10% (seeded, deterministic). The first 1,000 entries are added by the real
`Library.add` (invariants computed there); past 1,000 entries are written at the SQL level (`extend`:
one copy of each with a freshly perturbed architecture, then plain duplicates; adding 9,000 more
real-sized entries one by one would take hours here). Smaller libraries are prefixes of larger ones; built libraries are kept in
--work and reused when the recipe is the same.

Measured per library size and query (real recovered cases): `attribute()` with the library opened
(median of 3), one `zen attribute --json` run end to end (process start, case loading, library),
and, for the sizes in --reference, the reference implementation (the per-pair algorithm on fully
decoded entries, as attribution ran before issue 16), whose output must be identical. Appends (or
replaces) the section "Attribution at scale (issue 16)" of bench/results/perf.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.attribute.algorithm import attribute  # noqa: E402
from zen.attribute.invariants import packed  # noqa: E402
from zen.library.store import Library  # noqa: E402
from zen.represent import case  # noqa: E402
from zen.represent.mr import ModelMR  # noqa: E402
from zen.represent.pr import ProgrammaticRepresentation, UnifiedRepresentation  # noqa: E402

SIZES = (100, 1000, 10000)
QUERIES = {"tvfork_resnet18_obf": "tv_resnet18", "hf_llama": "hf_llama", "tv_efficientnet_v2_l": "tv_efficientnet_v2_l"}
SEED = 16
RECIPE_VERSION = 1
SECTION = "## Attribution at scale (issue 16)"


# -- perturbed copies ------------------------------------------------------------------------------


def perturb_mr(mr: dict, rng: random.Random) -> dict:
    """A copy of an MR (JSON form) with a few leaf modules dropped, hyper-parameters and tensor shapes changed."""
    hier = mr.get("graph", {}).get("hierarchy", [])
    parents = {p for p, _, _ in hier}
    leaves = sorted(m["path"] for m in mr["modules"] if m["path"] and m["path"] not in parents)
    drop = set(rng.sample(leaves, len(leaves) // 25)) if len(leaves) >= 25 else set()
    modules = []
    for m in mr["modules"]:
        if m["path"] in drop:
            continue
        hp = m["hyperparameters"]
        keys = sorted(k for k, v in hp.items() if k != "training" and isinstance(v, str) and v.isdigit())
        if keys and rng.random() < 0.15:
            k = rng.choice(keys)
            m = {**m, "hyperparameters": {**hp, k: repr(int(hp[k]) * 2 + 1)}}
        modules.append(m)

    def owner(key: str) -> str:
        return key.rsplit(".", 1)[0] if "." in key else ""

    tensors = []
    for t in mr["tensors"]:
        if owner(t["key"]) in drop:
            continue
        if t["shape"] and rng.random() < 0.10:
            t = {**t, "shape": [t["shape"][0] * 2, *t["shape"][1:]]}
        tensors.append(t)
    graph = dict(mr.get("graph", {}))
    graph["hierarchy"] = [e for e in hier if e[1] not in drop]
    graph["dataflow"] = [e for e in graph.get("dataflow", []) if e[0] not in drop and e[1] not in drop]
    return {**mr, "modules": modules, "tensors": tensors, "graph": graph}


def perturb_pr(pr: dict, rng: random.Random) -> dict:
    """A copy of a PR (JSON form) with ~3% of code objects dropped and ~10% changed (listing, names, hashes)."""
    codes = []
    for c in pr["codes"]:
        r = rng.random()
        if r < 0.03 and not c.get("children"):
            continue
        if r < 0.13:
            listing = [*c["listing"], f"LOAD_CONST {rng.randrange(1000)}", "POP_TOP"]
            c = {**c, "listing": listing, "names": [*c["names"], f"n{rng.randrange(1000)}"],
                 "listing_sha256": hashlib.sha256("\n".join(listing).encode()).hexdigest(),
                 "bytecode_sha256": hashlib.sha256((c["bytecode_sha256"] + "x").encode()).hexdigest()}  # fmt: skip
        codes.append(c)
    return {**pr, "codes": codes}


# -- libraries -------------------------------------------------------------------------------------


def load_cases(cases_dir: Path) -> dict[str, tuple[bytes, bytes, bytes]]:
    """name -> compressed JSON of (mr, pr without the system table, ur), loaded and checked once."""
    out = {}
    for d in sorted(cases_dir.glob("case_*")):
        try:
            mr, pr, ur = case.load_mr(d), case.load_pr(d), case.load_ur(d)
        except Exception as exc:  # noqa: BLE001 - a case still being written by a sweep: skip it
            print(f"skipping {d.name}: {exc}", file=sys.stderr)
            continue
        pj = pr.to_json()
        pj["system_codes"] = []
        out[d.name[len("case_") :]] = tuple(zlib.compress(json.dumps(x).encode(), 1) for x in (mr.to_json(), pj, ur.to_json()))
    return out


def plan(names: list[str], size: int) -> list[tuple[str, str, int]]:
    """(entry name, real case, copy number; 0 = the real fingerprint) for the largest library."""
    rng = random.Random(SEED)
    bases = sorted(set(QUERIES.values()) & set(names))
    rest = sorted(set(names) - set(bases))
    rng.shuffle(rest)
    order = bases + rest
    out = [(n, n, 0) for n in order]
    k = 1
    while len(out) < size:
        for n in order:
            if len(out) >= size:
                break
            out.append((f"{n}~{k:03d}", n, k))
        k += 1
    return out


ADDED = 1000  # entries added with `Library.add`; the rest are made at the SQL level (see `extend`)


def build(work: Path, cases: dict, sizes: tuple[int, ...]) -> dict[int, Path]:
    entries = plan(sorted(cases), min(max(sizes), ADDED))
    recipe = hashlib.sha256(json.dumps([RECIPE_VERSION, SEED, ADDED, sorted(cases), list(sizes)]).encode()).hexdigest()[:16]
    paths = {n: work / f"lib-{n}-{recipe}.sqlite" for n in sizes}
    if all(p.exists() for p in paths.values()):
        return paths
    tmp = work / f"building-{recipe}.sqlite"  # kept when interrupted: building resumes where it stopped
    t0 = time.perf_counter()

    def snapshot(lib: Library, n: int) -> None:
        if n in paths:
            dst = sqlite3.connect(paths[n])
            lib.db.backup(dst)
            dst.close()
            print(f"library of {n:,} entries built ({time.perf_counter() - t0:.0f} s)", flush=True)

    with Library(tmp, invariants=packed) as lib:
        lib.db.execute("PRAGMA synchronous = OFF")  # a scratch file: no fsync per entry
        have = {n for (n,) in lib.db.execute("SELECT name FROM models")}
        for i, (name, real, k) in enumerate(entries, 1):
            if name in have:
                continue
            mr, pr, ur = (json.loads(zlib.decompress(b)) for b in cases[real])
            if k:
                rng = random.Random(f"{SEED}:{name}")
                mr, pr = perturb_mr(mr, rng), perturb_pr(pr, rng)
            lib.add(name, ModelMR.from_json(mr), ProgrammaticRepresentation.from_json(pr), UnifiedRepresentation.from_json(ur))
            snapshot(lib, i)
        if max(sizes) > ADDED:
            extend(lib, max(sizes), lambda n: snapshot(lib, n))
    tmp.unlink(missing_ok=True)
    return paths


def extend(lib: Library, size: int, done) -> None:
    """Grow the library past ADDED entries at the SQL level (resumable: entries present are kept).

    `Library.add` of a transformers entry takes ~2-3 s here (its PR is ~9.5 MB of JSON), so 10,000
    added entries would take hours. Copy 1 of each added entry gets a freshly perturbed MR
    (`perturb_mr` of its source's stored MR; features and Laplacian spectrum computed by the
    functions `add` uses) and its source's code: PR blob, code hashes, stored views and body
    references copied row for row, so every table is as `add` would have written it for that MR
    and PR. Perturbing takes ~0.2 s a copy here, so copies 2 and later are plain duplicates of
    their source (new name, every row copied): the same per-entry work for attribution, minus the
    operator-term cache misses a perturbed architecture adds."""
    from zen.attribute.invariants import INVARIANTS_VERSION, mr_features
    from zen.attribute.invariants import _pack as pack_inv
    from zen.library.store import _pack, _unpack

    sources = lib.db.execute("SELECT id, name, summary FROM models ORDER BY id LIMIT ?", (ADDED,)).fetchall()
    have = {n for (n,) in lib.db.execute("SELECT name FROM models")}
    n, k = len(have), 0
    lib.db.execute("BEGIN IMMEDIATE")
    while n < size:
        k += 1
        for sid, sname, summary in sources:
            if n >= size:
                break
            name = f"{sname}#{k}"
            if name in have:
                continue
            if k == 1:
                rng = random.Random(f"{SEED}:{name}")
                mr_blob, lv = lib.db.execute("SELECT m.mr, i.mr FROM models m JOIN invariants i ON i.model_id = m.id "
                                             "WHERE m.id=?", (sid,)).fetchone()  # fmt: skip
                pmr = perturb_mr(_unpack(mr_blob), rng)
                mr = ModelMR.from_json(pmr)
                feats = mr_features(mr)
                summary = json.dumps({**json.loads(summary), "modules": len(mr.modules), "tensors": len(mr.tensors)})
                mr_blob = _pack(pmr)
                inv = (pack_inv({**feats.to_json(), "listing_version": json.loads(zlib.decompress(lv))["listing_version"]}),
                       feats.spectrum.astype("<f8").tobytes())  # fmt: skip
            else:
                mr_blob, *inv = lib.db.execute("SELECT m.mr, i.mr, i.spectrum FROM models m JOIN invariants i "
                                               "ON i.model_id = m.id WHERE m.id=?", (sid,)).fetchone()  # fmt: skip
            mid = lib.db.execute(
                "INSERT INTO models(name, created, source_sha256, python, torch, root_class, summary, mr, pr, ur, notes, "
                "code) SELECT ?, created, source_sha256, python, torch, root_class, ?, ?, pr, ur, notes, code FROM models "
                "WHERE id=?", (name, summary, mr_blob, sid)).lastrowid  # fmt: skip
            lib.db.execute("INSERT INTO invariants(model_id, version, mr, spectrum, views) SELECT ?, ?, ?, ?, views "
                           "FROM invariants WHERE model_id=?", (mid, INVARIANTS_VERSION, *inv, sid))  # fmt: skip
            lib.db.execute("INSERT INTO code_hashes(model_id, kind, hash, code) SELECT ?, kind, hash, code FROM code_hashes "
                           "WHERE model_id=?", (mid, sid))  # fmt: skip
            lib.db.execute("INSERT INTO code_body_refs(model_id, body) SELECT ?, body FROM code_body_refs WHERE model_id=?",
                           (mid, sid))  # fmt: skip
            n += 1
            if n % 500 == 0 or n == size:
                lib.db.execute("COMMIT")
                done(n)
                lib.db.execute("BEGIN IMMEDIATE")
    lib.db.execute("COMMIT")


# -- measurement -----------------------------------------------------------------------------------


def raw(att) -> list:
    """Every score of every candidate at full precision (the JSON output rounds to 4 places)."""
    return [(c.name, c.method, c.mr.arch, c.mr.ts, c.mr.op, c.mr.graph, c.cos, c.cls, c.optimal_cos, c.shared)
            for c in att.candidates]  # fmt: skip


def measure(paths: dict[int, Path], cases_dir: Path, reference: set[int]) -> list[dict]:
    rows = []
    for size, path in sorted(paths.items()):
        for q in QUERIES:
            qdir = cases_dir / f"case_{q}"
            mr, pr = case.load_mr(qdir), case.load_pr(qdir)
            times = []
            for _ in range(3):
                t = time.perf_counter()
                with Library(path) as lib:
                    att = attribute(mr, pr, lib)
                times.append(time.perf_counter() - t)
            t = time.perf_counter()
            cli = subprocess.run([sys.executable, "-m", "zen", "attribute", str(qdir), "--library", str(path), "--json"],
                                 capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
            cli_s = time.perf_counter() - t
            cli_ok = cli.returncode in (0, 5) and json.loads(cli.stdout)["attributed"] == att.attributed
            row = {"size": size, "query": q, "s": statistics.median(times), "cli_s": cli_s, "cli_ok": cli_ok,
                   "attributed": att.attributed, "ur": att.best().ur if att.best() else None,
                   "candidates": len(att.candidates), "full": sum(c.method == "algorithm-1" for c in att.candidates)}  # fmt: skip
            if size in reference:
                t = time.perf_counter()
                with Library(path) as lib:
                    ref = attribute(mr, pr, lib, reference=True)
                row["ref_s"] = time.perf_counter() - t
                row["identical"] = raw(ref) == raw(att) and ref.to_json() == att.to_json()
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def report(rows: list[dict], command: str, build_s: float | None, cases: int) -> str:
    lines = [
        SECTION,
        "",
        f"One run of `{command}` on {time.strftime('%Y-%m-%d')}: {platform.machine()}, {os.cpu_count()} cores (shared with "
        f"a background sweep), Python {platform.python_version()}. Library entries: {cases} real fingerprints recovered "
        "from images of torchvision, timm and transformers model processes, plus seeded perturbed copies of them (modules, "
        "hyper-parameters, tensor shapes and code changed) up to 1,000, all added with `Library.add`; past 1,000, written at "
        "the SQL level: one copy of each with a freshly perturbed architecture (same code as its source), then plain "
        "duplicates (new names) up to 10,000. "
        "Queries: real recovered cases (tvfork_resnet18_obf "
        "is an obfuscated fork of torchvision's ResNet-18); the library holds every real fingerprint, the queries' own "
        "included, so each query is attributed to itself at UR 1.0. `attribute()`: library opened and the query "
        "attributed, median of 3; CLI: one `zen attribute CASE --library DB --json` run end to end (interpreter start, "
        "case loading). "
        "Reference: the per-pair algorithm on fully decoded entries, as attribution ran before issue 16 (with the one-thread "
        "eigvalsh fix); identical = same attributed base and every score of every candidate equal to the last bit.",
        "",
        "| entries | query | attributed (UR) | candidates (full) | `attribute()` s | CLI s | reference s | identical |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ref = f"{r['ref_s']:.1f}" if "ref_s" in r else "-"
        ident = ("yes" if r["identical"] else "**no**") if "identical" in r else "-"
        ur = f" ({r['ur']:.3f})" if r["ur"] is not None else ""
        lines.append(f"| {r['size']:,} | {r['query']} | {r['attributed']}{ur} | {r['candidates']:,} ({r['full']}) | "
                     f"{r['s']:.2f} | {r['cli_s']:.2f} | {ref} | {ident} |")  # fmt: skip
    worst = {n: max(r["s"] for r in rows if r["size"] == n) for n in sorted({r["size"] for r in rows})}
    targets = {100: 1.0, 1000: 5.0, 10000: 30.0}
    lines += ["", "Targets (`attribute()`, slowest query): " + ", ".join(
        f"{n:,}: {worst[n]:.2f} s (≤ {targets[n]:g} s {'met' if worst[n] <= targets[n] else '**missed**'})"
        for n in worst if n in targets) + "."]  # fmt: skip
    if build_s is not None:
        lines.append(f"Building the libraries in this run (resumed where an earlier run stopped, if one did): {build_s:.0f} s.")
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    """Replace this benchmark's section of perf.md (or append it), keeping the others."""
    path = ROOT / "bench" / "results" / "perf.md"
    old = path.read_text() if path.exists() else ""
    start = old.find(SECTION)
    if start >= 0:
        nxt = old.find("\n## ", start + len(SECTION))
        old = old[:start] + (old[nxt + 1 :] if nxt >= 0 else "")
    path.write_text(old.rstrip("\n") + "\n\n" + text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=Path.home() / ".cache" / "zen" / "zoo-bench",
                    help="directory of real recovered cases (case_*); only read")  # fmt: skip
    ap.add_argument("--work", type=Path, default=None, help="where the libraries are built and kept")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--reference", type=int, nargs="*", default=[100, 1000], help="sizes also run by the reference")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args()
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "zen-bench-attribution-scale"
    work.mkdir(parents=True, exist_ok=True)
    cases = load_cases(args.cases)
    missing = [q for q in QUERIES if q not in cases]
    if missing:
        raise SystemExit(f"{args.cases} lacks the query cases {missing}")
    t = time.perf_counter()
    paths = build(work, cases, tuple(args.sizes))
    build_s = time.perf_counter() - t
    rows = measure(paths, args.cases, set(args.reference))
    command = "python bench/bench_attribution_scale.py --cases CASES " + " ".join(
        [f"--sizes {' '.join(map(str, args.sizes))}"] * (tuple(args.sizes) != SIZES)
        + [f"--reference {' '.join(map(str, args.reference))}"])  # fmt: skip
    text = report(rows, command.strip(), build_s if build_s > 60 else None, len(cases))
    print(text)
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
