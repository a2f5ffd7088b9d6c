"""Cross-version evaluation (issue 8): the same models deployed under CPython 3.11 and 3.13 (or 3.14).

    python bench/cross_version.py [--minor 3.13|3.14] [--python PATH] [--work DIR] [--out bench/results]

A library of the three family bases is built as usual (zen's own 3.11). Every family scenario
(bases and customised forks) is then deployed twice by `bench/families/deploy.py`: under 3.11 and
under a 3.13 (or 3.14) with torch 2.13.0 (`tools/torch-venv.sh 3.13`). Each process is imaged, recovered and
attributed by zen running on 3.11. Reported per model: the base each image is attributed to, the
UR/MR/PR against the right base from each image and the score drop the version change causes,
tensors bit-exact against the state_dict the 3.13 process wrote, and the IBSS of each model
function with its own 3.11 compilation (identical source). `zen reuse` on a 3.13 case must refuse
(rebuilding needs an interpreter of the image's version) and the message is recorded.

Writes bench/results/cross_version.md and .json (3.13), cross_version_314.md and .json (3.14).
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


def recover_and_attribute(name: str, python: str, label: str, work: Path, lib: Path) -> dict:
    image, truth, _ = deploy_and_image(name, work, python, label)
    case_dir = work / f"{name}{label}-case"
    try:
        t = time.perf_counter()
        zen("recover", image, "-o", case_dir, "--model", hex(truth["model_id"]), ok=(0, 5))
        took = time.perf_counter() - t
    finally:
        image.unlink(missing_ok=True)
    att = json.loads(zen("attribute", case_dir, "--library", lib, "--json", "--no-optimal").stdout)
    base = BASE_OF[name]
    right = next((c for c in att["candidates"] if c["name"] == base), {})
    manifest = case.load_manifest(case_dir)
    exact, total = weights_bit_exact(case_dir, work / f"{name}{label}-process" / "state.safetensors")
    return {
        "python": manifest["python"]["version"],
        "debug_offsets": manifest["python"].get("debug_offsets"),
        "attributed": att["attributed"],
        "correct": att["attributed"] == base,
        "ur": right.get("ur"),
        "mr": right.get("mr"),
        "pr": right.get("pr"),
        "runner_up": next(((c["name"], c["ur"]) for c in att["candidates"] if c["name"] != base), None),
        "components": scores_against_every_base(case_dir, lib).get(base),
        "tensors_bit_exact": f"{exact}/{total}",
        "recover_s": round(took, 2),
        "case": case_dir,
    }


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


def write(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "cross_version" if meta["minor"] == "3.13" else f"cross_version_{meta['minor'].replace('.', '')}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")
    ok11 = sum(r["3.11"]["correct"] for r in rows)
    ok13 = sum(r["other"]["correct"] for r in rows)
    v = meta["minor"]
    drops = [r["ur_drop"] for r in rows if r["ur_drop"] is not None]
    lines = [
        f"# Cross-version evaluation: the same models under CPython 3.11 and {v}",
        "",
        f"Generated by `bench/cross_version.py` on {meta['date']} ({meta['machine']}); zen ran on Python "
        f"{meta['zen_python']}, the {v} processes on {meta['python_other']} with torch {meta['torch_other']}. "
        f"Library: the three family bases, built from 3.11 processes. Total {meta['seconds']} s.",
        "",
        f"**Attributed to the right base: {ok11}/{len(rows)} from 3.11 images, {ok13}/{len(rows)} from {v} images.** "
        f"UR against the right base drops by {min(drops):.4f} to {max(drops):.4f} "
        f"(mean {sum(drops) / len(drops):.4f}) when the deployed process runs {v} instead of 3.11.",
        "",
        f"| model | base | 3.11 → | UR | MR | PR | {v} → | UR | MR | PR | UR drop | tensors bit-exact ({v}) | "
        f"IBSS 3.11↔{v} mean (identical/total) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b, s = r["3.11"], r["other"], r["listings"]
        lines.append(
            f"| {r['model']} | {r['base']} | {a['attributed']} | {a['ur']} | {a['mr']} | {a['pr']} | {b['attributed']} | "
            f"{b['ur']} | {b['mr']} | {b['pr']} | {r['ur_drop']} | {b['tensors_bit_exact']} | "
            f"{s['mean_ibss']} ({s['identical']}/{s['code_objects']}) |"
        )
    lines += [
        "",
        "MR (architecture, weights, operators, and the data-flow graph decoded from `forward` with the target",
        "version's own opcode tables) does not depend on the interpreter version. PR compares version-normalised",
        "listings (3.13's superinstructions, CALL_KW, SET_FUNCTION_ATTRIBUTE, ... mapped back; 3.11 comprehensions",
        "spliced into their caller as 3.12+ inlines them), so identical source gives identical listings; what is",
        "left of a drop comes from fuzzy pairs of *different* functions (a fork's new code against the base's),",
        "whose similarity is not exactly version-independent.",
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minor", default="3.13", choices=["3.13", "3.14"], help="the other CPython version (default 3.13)")
    ap.add_argument("--python", help="a CPython of that version with torch 2.13.0 (default: tools/torch-venv.sh)")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temp dir, removed afterwards)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--only", nargs="*", help="run only these scenario models")
    ap.add_argument("--keep", action="store_true", help="keep the cases in --work (for a closer look)")
    args = ap.parse_args()
    py_other = args.python or subprocess.run(["bash", str(ROOT / "tools" / "torch-venv.sh"), args.minor], check=True,
                                         capture_output=True, text=True).stdout.strip().splitlines()[-1]  # fmt: skip
    probe = subprocess.run([py_other, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    work = args.work or Path(tempfile.mkdtemp(prefix="zen-xv-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lib = work / "library.sqlite"
    zen("library", "build", ROOT / "bench" / "families" / "recipes.toml", "--library", lib, "--replace")
    rows, refusal = [], ""
    try:
        for name in args.only or SCENARIOS:
            row = {"model": name, "base": BASE_OF[name]}
            row["3.11"] = recover_and_attribute(name, sys.executable, "-py311", work, lib)
            row["other"] = recover_and_attribute(name, py_other, "-py" + args.minor.replace(".", ""), work, lib)
            a, b = row["3.11"], row["other"]
            row["ur_drop"] = round(a["ur"] - b["ur"], 4) if a["ur"] is not None and b["ur"] is not None else None
            row["listings"] = listing_similarity(a["case"], b["case"])
            if not refusal:
                refusal = reuse_refusal(b["case"], lib, row["base"], work)
            for side in (a, b):
                kept = side.pop("case")
                if not args.keep:
                    shutil.rmtree(kept, ignore_errors=True)
            print(
                f"{name}: 3.11 -> {a['attributed']} (UR {a['ur']}), {args.minor} -> {b['attributed']} (UR {b['ur']})", flush=True
            )
            rows.append(row)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {platform.system()}",
        "zen_python": platform.python_version(),
        "minor": args.minor,
        "python_other": probe[0],
        "torch_other": probe[1],
        "seconds": round(time.perf_counter() - t0, 1),
        "reuse_refusal": refusal,
    }
    write(rows, meta, args.out)
    print(f"wrote results for {args.minor} into {args.out}")
    return 0 if all(r["3.11"]["correct"] and r["other"]["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
