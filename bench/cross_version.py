"""Cross-version evaluation (issues 8, 17): the same models deployed under CPython 3.11 and another minor.

    python bench/cross_version.py [--minor 3.8|3.9|3.10|3.12|3.13|3.14] [--python PATH] [--work DIR] [--out DIR]

Every family scenario (bases and customised forks) is deployed twice by `bench/families/deploy.py`:
under 3.11 and under the other minor with its pinned torch (`tools/torch-venv.sh MINOR`: torch 2.13.0,
2.4.1 on 3.8/3.9). Each process is imaged, recovered and attributed by zen running on 3.11, in both
directions: against a library of the three family bases built from 3.11 processes (`zen library
build`), and against one built from the other minor's processes (the bases' cases of that minor,
`zen library add`). Reported per model and library: the base each image is attributed to, the UR/MR/PR
against the right base, and the score drop the version change causes (the same library, the image of
the other version); tensors bit-exact against the state_dict the other-version process wrote, and the
IBSS of each model function with its own 3.11 compilation (identical source). `zen reuse` on a case of
the other minor must refuse (rebuilding needs an interpreter of the image's version); the message is
recorded.

Writes bench/results/cross_version.md and .json (3.13), cross_version_<minor>.md and .json otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from families import FAMILIES  # noqa: E402
from rapidfuzz import fuzz  # noqa: E402
from run_families import BASE_OF, deploy_and_image, scores_against_every_base, weights_bit_exact, zen  # noqa: E402

from zen.attribute.pr_similarity import views  # noqa: E402
from zen.represent import case  # noqa: E402

SCENARIOS = [v for vs in FAMILIES.values() for v in vs]


def recover(name: str, python: str, label: str, work: Path) -> dict:
    """Deploy `name` under `python`, image and recover it; the case is kept for attribution."""
    image, truth, _ = deploy_and_image(name, work, python, label)
    case_dir = work / f"{name}{label}-case"
    try:
        t = time.perf_counter()
        zen("recover", image, "-o", case_dir, "--model", hex(truth["model_id"]), ok=(0, 5))
        took = time.perf_counter() - t
    finally:
        image.unlink(missing_ok=True)
    manifest = case.load_manifest(case_dir)
    exact, total = weights_bit_exact(case_dir, work / f"{name}{label}-process" / "state.safetensors")
    return {
        "python": manifest["python"]["version"],
        "debug_offsets": manifest["python"].get("debug_offsets"),
        "tensors_bit_exact": f"{exact}/{total}",
        "recover_s": round(took, 2),
        "case": case_dir,
    }


def attribute(case_dir: Path, base: str, lib: Path) -> dict:
    att = json.loads(zen("attribute", case_dir, "--library", lib, "--json", "--no-optimal").stdout)
    right = next((c for c in att["candidates"] if c["name"] == base), {})
    return {
        "attributed": att["attributed"],
        "correct": att["attributed"] == base,
        "ur": right.get("ur"),
        "mr": right.get("mr"),
        "pr": right.get("pr"),
        "runner_up": next(((c["name"], c["ur"]) for c in att["candidates"] if c["name"] != base), None),
        "components": scores_against_every_base(case_dir, lib).get(base),
    }


def library_of(cases: dict[str, Path], lib: Path) -> None:
    """A library of the family bases from their cases (recovered from processes of one version)."""
    for base in sorted(FAMILIES):
        zen("library", "add", cases[base], "--name", base, "--library", lib, "--replace")


def listing_similarity(a: Path, b: Path) -> dict:
    """IBSS of each model code object with the same-named one of the other case, as compared by
    attribution (3.11 comprehensions spliced into their callers)."""
    la, lb = _listings(a), _listings(b)
    keys = sorted(set(la) & set(lb))
    scores = [1.0 if la[k] == lb[k] else fuzz.ratio(la[k], lb[k]) / 100 for k in keys]
    worst = sorted(zip(scores, keys))[:3]
    return {
        "code_objects": len(keys),
        "identical": sum(s == 1.0 for s in scores),
        "mean_ibss": round(sum(scores) / len(scores), 4) if scores else None,
        "min_ibss": round(min(scores), 4) if scores else None,
        "worst": [(k, round(s, 4)) for s, k in worst if s < 1.0],
    }


def _listings(case_dir: Path) -> dict[str, str]:
    """qualname -> the listing attribution compares (3.11 comprehensions spliced into their caller)."""
    return {v.rec.qualname: v.text for v in views(case.load_pr(case_dir))}


def reuse_refusal(case_dir: Path, lib: Path, base: str, work: Path) -> str:
    r = zen("reuse", case_dir, "--base", base, "--library", lib, "-o", work / "refused-package", check=False)
    if r.returncode == 0:
        return "UNEXPECTED: reuse of another version's case succeeded under 3.11"
    text = " / ".join(line.strip() for line in (r.stderr or r.stdout).strip().splitlines())
    return f"exit {r.returncode}: " + text.replace(str(work), "<work>")


def _direction(rows: list[dict], lib: str, first: str, second: str, v: str) -> list[str]:
    """One table: every model's image of version `first` (the library's own) and of `second`, against `lib`."""
    names = {"3.11": "3.11", "other": v}
    drops = [r["ur_drop"][lib] for r in rows if r["ur_drop"][lib] is not None]
    ok = sum(r[second]["against"][lib]["correct"] for r in rows)
    lines = [
        f"### Library built from {names[first]} processes, models deployed on {names[second]}",
        "",
        f"Attributed to the right base: **{ok}/{len(rows)}** from {names[second]} images "
        f"({sum(r[first]['against'][lib]['correct'] for r in rows)}/{len(rows)} from {names[first]} images, "
        f"the library's own version). UR against the right base drops by {min(drops):.4f} to {max(drops):.4f} "
        f"(mean {sum(drops) / len(drops):.4f}) when the model runs {names[second]} instead of {names[first]}.",
        "",
        f"| model | base | {names[first]} image → | UR | MR | PR | {names[second]} image → | UR | MR | PR | UR drop |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r[first]["against"][lib], r[second]["against"][lib]
        lines.append(
            f"| {r['model']} | {r['base']} | {a['attributed']} | {a['ur']} | {a['mr']} | {a['pr']} | "
            f"{b['attributed']} | {b['ur']} | {b['mr']} | {b['pr']} | {r['ur_drop'][lib]} |"
        )
    return lines + [""]


def write(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    v = meta["minor"]
    stem = "cross_version" if v == "3.13" else f"cross_version_{v.replace('.', '')}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")
    lines = [
        f"# Cross-version evaluation: the same models under CPython 3.11 and {v}, attributed both ways",
        "",
        f"Generated by `bench/cross_version.py --minor {v}` on {meta['date']} ({meta['machine']}); zen ran on Python "
        f"{meta['zen_python']}, the {v} processes on {meta['python_other']} with torch {meta['torch_other']} "
        f"(3.11: torch {meta['torch_311']}). Two libraries of the three family bases: one built from 3.11 processes "
        f"(`zen library build`), one from the bases' {v} processes (`zen library add`). Total {meta['seconds']} s.",
        "",
        *_direction(rows, "3.11-library", "3.11", "other", v),
        *_direction(rows, "other-library", "other", "3.11", v),
        f"### Recovery from the {v} images",
        "",
        f"| model | tensors bit-exact ({v}) | IBSS 3.11↔{v} mean (identical/total) | recover s (3.11 / {v}) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        a, b, s = r["3.11"], r["other"], r["listings"]
        lines.append(
            f"| {r['model']} | {b['tensors_bit_exact']} | {s['mean_ibss']} ({s['identical']}/{s['code_objects']}) | "
            f"{a['recover_s']} / {b['recover_s']} |"
        )
    lines += [
        "",
        "MR (architecture, weights, operators, and the data-flow graph decoded from `forward` with the target",
        "version's own opcode tables) does not depend on the interpreter version. PR compares version-normalised",
        "listings (pre-3.11 and 3.12+ instruction sets mapped to 3.11's shape; 3.11 comprehensions spliced into",
        "their caller as 3.12+ inlines them), so identical source gives identical listings where the compilers",
        "agree; what is left of a drop comes from listings that differ after normalisation and from fuzzy",
        "pairs of *different* functions (a fork's new code against the base's).",
        "",
        f"Lowest-IBSS model functions (3.11 vs {v}, identical source):",
        "",
    ]
    lowest: dict[str, float] = {}
    for r in rows:
        for q, score in r["listings"]["worst"]:
            lowest[q] = min(score, lowest.get(q, 1.0))
    worst = sorted(lowest.items(), key=lambda w: w[1])[:8]
    lines += [f"- `{q}`: {s}" for q, s in worst] or ["- none"]
    lines += ["", f"`zen reuse` on a {v} case under zen's 3.11: {meta['reuse_refusal']}", ""]
    (out / f"{stem}.md").write_text("\n".join(lines))


def torch_python(minor: str, given: str | None) -> str:
    if given:
        return given
    r = subprocess.run(["bash", str(ROOT / "tools" / "torch-venv.sh"), minor], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: no CPython {minor} with torch (tools/torch-venv.sh {minor} failed):\n{r.stderr[-2000:]}")
    return r.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minor", default="3.13", choices=["3.8", "3.9", "3.10", "3.12", "3.13", "3.14"],
                    help="the other CPython version (default 3.13)")  # fmt: skip
    ap.add_argument("--python", help="a CPython of that version with torch (default: tools/torch-venv.sh MINOR)")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temp dir, removed afterwards)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--only", nargs="*", help="run only these scenario models (the family bases are always run)")
    ap.add_argument("--keep", action="store_true", help="keep the cases in --work (for a closer look)")
    args = ap.parse_args()
    py_other = torch_python(args.minor, args.python)
    probe = subprocess.run([py_other, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0 or not probe.stdout.startswith(args.minor + "."):
        sys.exit(f"error: {py_other} is not a CPython {args.minor} with torch: {(probe.stdout + probe.stderr)[-500:]}")
    version_other, torch_other = probe.stdout.split()
    import torch

    work = args.work or Path(tempfile.mkdtemp(prefix="zen-xv-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    libs = {"3.11-library": work / "library-311.sqlite", "other-library": work / "library-other.sqlite"}
    zen("library", "build", ROOT / "bench" / "families" / "recipes.toml", "--library", libs["3.11-library"], "--replace")
    names = list(dict.fromkeys([*sorted(FAMILIES), *(args.only or SCENARIOS)]))
    names = [n for n in SCENARIOS if n in names]
    rows, refusal, tag = [], "", "-py" + args.minor.replace(".", "")
    try:
        for name in names:
            row = {"model": name, "base": BASE_OF[name], "3.11": recover(name, sys.executable, "-py311", work)}
            row["other"] = recover(name, py_other, tag, work)
            row["listings"] = listing_similarity(row["3.11"]["case"], row["other"]["case"])
            if not refusal:
                refusal = reuse_refusal(row["other"]["case"], libs["3.11-library"], row["base"], work)
            print(f"{name}: recovered ({row['other']['tensors_bit_exact']} tensors bit-exact from {args.minor})", flush=True)
            rows.append(row)
        library_of({r["model"]: r["other"]["case"] for r in rows}, libs["other-library"])
        for row in rows:
            for side in ("3.11", "other"):
                row[side]["against"] = {k: attribute(row[side]["case"], row["base"], lib) for k, lib in libs.items()}
            row["ur_drop"] = {}
            for lib, (own, foreign) in (("3.11-library", ("3.11", "other")), ("other-library", ("other", "3.11"))):
                a, b = row[own]["against"][lib]["ur"], row[foreign]["against"][lib]["ur"]
                row["ur_drop"][lib] = round(a - b, 4) if a is not None and b is not None else None
            print(f"{row['model']}: " + ", ".join(f"{side} image vs {lib} -> {row[side]['against'][lib]['attributed']} "
                                                   f"(UR {row[side]['against'][lib]['ur']})"
                                                   for side in ("3.11", "other") for lib in libs), flush=True)  # fmt: skip
    finally:
        for row in rows:
            for side in ("3.11", "other"):
                kept = row[side].pop("case", None)
                if kept and not args.keep:
                    shutil.rmtree(kept, ignore_errors=True)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {platform.system()}",
        "zen_python": platform.python_version(),
        "torch_311": torch.__version__,
        "minor": args.minor,
        "python_other": version_other,
        "torch_other": torch_other,
        "seconds": round(time.perf_counter() - t0, 1),
        "reuse_refusal": refusal,
    }
    write(rows, meta, args.out)
    print(f"wrote results for {args.minor} into {args.out}")
    return 0 if all(r[s]["against"][lib]["correct"] for r in rows for s in ("3.11", "other") for lib in libs) else 1


if __name__ == "__main__":
    sys.exit(main())
