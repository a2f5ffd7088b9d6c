"""The evaluation suite (issue 7): ZEN's Tables II, III and VI and Fig. 3 from our own runs.

    python bench/run_families.py [--work DIR] [--out bench/results] [--only NAME ...]

1. A Base Model Library is built the way an investigator builds one: `zen library build` deploys
   each base model of `bench/families/recipes.toml` and transformers GPT-2/Llama
   (`recipes/transformers.toml`) in its own process, images it, recovers it and adds it.
2. Every scenario model (bases, customised forks, transformers/peft derivatives) is deployed in
   its own process by `bench/families/deploy.py`, which serves one request and writes the request,
   the response and its state_dict; zen images it (`zen acquire --lean`), recovers it, attributes
   it, diffs it against its base, rebuilds it (`zen reuse --base`) and runs the served request on
   the rebuilt model (`zen verify`, with only the base's code importable).
3. Writes bench/results/families.md (Tables II, III, VI), families.json and families_heatmap.png.

Each check compares zen's output with what the deployed process wrote about itself.
"""

from __future__ import annotations

import argparse
import json
import os
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

from families import FAMILIES, VARIANTS, materialize  # noqa: E402
from families.hf import HF  # noqa: E402

from zen.attribute.algorithm import UR_WEIGHTS, compare, primary_modules  # noqa: E402
from zen.attribute.mr_similarity import WEIGHTS as MR_WEIGHTS  # noqa: E402
from zen.attribute.pr_similarity import views  # noqa: E402
from zen.library.store import Library  # noqa: E402
from zen.represent import case  # noqa: E402

DEPLOY = ROOT / "bench" / "families" / "deploy.py"
BASE_OF = {**{v: VARIANTS[v].base for vs in FAMILIES.values() for v in vs},
           "gpt2": "gpt2", "llama": "llama", "lora": "gpt2", "mistral": "llama", "qwen2": "llama"}  # fmt: skip
BASES = sorted(FAMILIES) + ["gpt2", "llama"]
SCENARIOS = [v for vs in FAMILIES.values() for v in vs] + HF


def zen(*args, env: dict | None = None, check: bool = True, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True, timeout=1200,
                       env=env)  # fmt: skip
    if check and r.returncode not in ok:
        raise RuntimeError(f"zen {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def build_library(lib: Path) -> float:
    t = time.perf_counter()
    zen("library", "build", ROOT / "bench" / "families" / "recipes.toml", "--library", lib)
    zen("library", "build", ROOT / "recipes" / "transformers.toml", "--only", "gpt2", "--only", "llama", "--library", lib)
    return time.perf_counter() - t


def deploy_and_image(name: str, work: Path, python: str = sys.executable, label: str = "") -> tuple[Path, dict, float]:
    """Start the deployed process (under `python`), image it while it waits for requests, stop it."""
    out = work / f"{name}{label}-process"
    proc = subprocess.Popen([python, str(DEPLOY), name, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError(f"deploying {name} failed:\n{proc.stderr.read()[-3000:]}")
        image = work / f"{name}{label}.core"
        t = time.perf_counter()
        zen("acquire", "--pid", proc.pid, "-o", image, "--lean")
        return image, json.loads((out / "truth.json").read_text()), time.perf_counter() - t
    finally:
        proc.stdin.close()
        proc.wait(30)


def weights_bit_exact(case_dir: Path, state: Path) -> tuple[int, int]:
    """(tensors equal byte for byte, tensors in the process's state_dict)."""
    from safetensors import safe_open

    equal = 0
    with safe_open(str(state), "pt") as want, safe_open(str(case_dir / case.WEIGHTS), "pt") as got:
        keys = set(got.keys())
        for k in want.keys():
            if k in keys:
                a, b = want.get_tensor(k), got.get_tensor(k)
                equal += a.dtype == b.dtype and a.shape == b.shape and a.contiguous().view(-1).view_as(a).equal(b)
        return equal, len(list(want.keys()))


def scores_against_every_base(case_dir: Path, lib: Path) -> dict[str, dict]:
    """MR/PR/UR and components of the model against every base (Table III), not only code-sharing ones."""
    mr, pr = case.load_mr(case_dir), case.load_pr(case_dir)
    delta = views(pr, primary_modules(mr))
    with Library(lib, create=False) as library:
        out = {}
        for entry in library.entries():
            c = compare(mr, entry, delta).to_json()
            out[entry.name] = {k: c.get(k) for k in ("mr", "pr", "ur", "arch", "ts", "op", "graph", "cos", "cls")}
        return out


def run_one(name: str, work: Path, lib: Path) -> dict:
    base = BASE_OF[name]
    row: dict = {"model": name, "expected_base": base, "kind": "base" if name == base else "customised",
                 "changes": list(VARIANTS[name].changes) if name in VARIANTS else []}  # fmt: skip
    image, truth, t_acq = deploy_and_image(name, work)
    proc_dir = work / f"{name}-process"
    try:
        case_dir = work / f"{name}-case"
        t = time.perf_counter()
        zen("recover", image, "-o", case_dir, "--model", hex(truth["model_id"]), ok=(0, 5))  # 5: partial, see status
        row["time_recover_s"] = round(time.perf_counter() - t, 2)
    finally:
        image.unlink(missing_ok=True)
    row["time_acquire_s"] = round(t_acq, 2)
    mr, pr = case.load_mr(case_dir), case.load_pr(case_dir)
    manifest = case.load_manifest(case_dir)
    row["recovery_status"], row["recovery_problems"] = manifest.get("status"), manifest.get("problems", [])
    row["class"], row["class_recovered"] = truth["class"], mr.root.cls
    row["tensors"], row["tensors_in_process"] = mr.summary.get("state_dict_entries"), truth["tensors"]
    row["weights"], row["weights_in_process"] = mr.summary.get("parameter_elements"), truth["parameters"]
    row["tensors_bit_exact"], _ = weights_bit_exact(case_dir, proc_dir / "state.safetensors")
    row["functions"], row["code_objects"] = pr.counts["model"]["functions"], pr.counts["model"]["code_objects"]
    row["classes"] = pr.counts["model"]["classes"]
    t = time.perf_counter()
    att = json.loads(zen("attribute", case_dir, "--library", lib, "--json", "--no-optimal").stdout)
    row["time_attribute_s"] = round(time.perf_counter() - t, 2)
    row["attributed"] = att["attributed"]
    row["attribution_correct"] = att["attributed"] == base
    row["scores"] = scores_against_every_base(case_dir, lib)
    d = json.loads(zen("diff", case_dir, "--base", base, "--library", lib, "--json", "--listing").stdout)
    row["changed"], row["added"] = d["changed"], d["added"] + len(d.get("methods_added", []))
    row["unchanged"], row["classes_added"] = d["unchanged"], d["classes_added"]
    total = row["changed"] + row["added"] + row["unchanged"]
    row["changed_percent"] = round(100.0 * (row["changed"] + row["added"]) / total, 1) if total else 0.0
    pkg = work / f"rebuilt_{name}"
    zen("reuse", case_dir, "--base", base, "--library", lib, "-o", pkg)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if base in VARIANTS:  # only the base family's module is importable, never the fork's
        env["PYTHONPATH"] = str(materialize(base, work / f"base-code-{base}").parent)
    t = time.perf_counter()
    v = zen("verify", pkg, "--inputs", proc_dir / "request.safetensors", "--expect", proc_dir / "response.safetensors",
            "--json", env=env, check=False)  # fmt: skip
    row["time_verify_s"] = round(time.perf_counter() - t, 2)
    try:
        results = json.loads(v.stdout)["results"]
        row["outputs_identical"] = bool(results) and all(r.get("equal") is True for r in results)
    except (json.JSONDecodeError, KeyError):
        row["outputs_identical"], row["verify_error"] = False, v.stderr[-2000:]
    shutil.rmtree(pkg, ignore_errors=True)
    return row


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def table_ii(rows: list[dict]) -> list[str]:
    out = ["## Table II: recovered models, attribution and reuse", "",
           "| model | tensors | weights | bit-exact tensors | attributed base | correct | COs edited | COs added | "
           "classes | functions | % changed | deployed vs post-zen outputs |", "|" + "---|" * 12]  # fmt: skip
    for r in rows:
        out.append(f"| {r['model']} | {r['tensors']} | {r['weights']:,} | {r['tensors_bit_exact']}/{r['tensors_in_process']} | "
                   f"{r['attributed']} | {'yes' if r['attribution_correct'] else 'NO'} | {r['changed']} | {r['added']} | "
                   f"{r['classes']} | {r['functions']} | {r['changed_percent']} | "
                   f"{'identical' if r['outputs_identical'] else 'DIFFERENT'} |")  # fmt: skip
    return out + [""]


def table_iii(rows: list[dict], bases: list[str]) -> list[str]:
    out = ["## Table III: MR / PR similarity of each customised model to every base", "",
           "| model | " + " | ".join(bases) + " |", "|" + "---|" * (len(bases) + 1)]  # fmt: skip
    for r in rows:
        if r["kind"] != "customised":
            continue
        cells = []
        for b in bases:
            s = r["scores"].get(b, {})
            cell = f"{_f(s.get('mr'))} / {_f(s.get('pr'))}"
            cells.append(f"**{cell}**" if b == r["attributed"] else cell)
        out.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    mr_w = " + ".join(f"{w}·{k}" for k, w in MR_WEIGHTS.items())
    return out + ["", f"Bold: the attributed base (highest UR = {UR_WEIGHTS['mr']}·MR + {UR_WEIGHTS['pr']}·PR). "
                      f"MR = {mr_w}; PR = mean(Attr, IBSS) over the code objects matched by Algorithm 1.", ""]  # fmt: skip


def table_vi(rows: list[dict]) -> list[str]:
    out = [
        "## Table VI: score components against the attributed base",
        "",
        "| model | base | UR | MR | PR | Arch | TS | OP | graph | COs | CLS |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        s = r["scores"].get(r["attributed"] or "", {})
        out.append(f"| {r['model']} | {r['attributed']} | " + " | ".join(_f(s.get(k)) for k in
                   ("ur", "mr", "pr", "arch", "ts", "op", "graph", "cos", "cls")) + " |")  # fmt: skip
    return out + [""]


def write_results(rows: list[dict], bases: list[str], out: Path, meta: dict) -> None:
    from zen.report.charts import heatmap

    out.mkdir(parents=True, exist_ok=True)
    matrix = [[r["scores"].get(b, {}).get("ur") or 0.0 for b in bases] for r in rows]
    (out / "families_heatmap.png").write_bytes(
        heatmap(matrix, [r["model"] for r in rows], bases, "UR similarity of each deployed model to each base (Fig. 3)")
    )
    ok_att = sum(r["attribution_correct"] for r in rows)
    ok_out = sum(r["outputs_identical"] for r in rows)
    exact = sum(r["tensors_bit_exact"] for r in rows), sum(r["tensors_in_process"] for r in rows)
    lines = ["# Evaluation families: ZEN Tables II, III, VI and Fig. 3 from our own runs", "",
             f"Generated by `python bench/run_families.py` on {meta['date']} ({meta['machine']}; Python {meta['python']}, "
             f"torch {meta['torch']}). Library: {len(bases)} bases built with `zen library build` in "
             f"{meta['library_s']:.0f} s. Total {meta['total_s']:.0f} s.", "",
             f"**{ok_att}/{len(rows)} models attributed to the right base; {ok_out}/{len(rows)} rebuilt models reproduce "
             f"the deployed response bit for bit; {exact[0]}/{exact[1]} tensors bit-exact.**", "",
             "Every model ran in its own process (`bench/families/deploy.py`), was imaged with `zen acquire --lean`, "
             "recovered, attributed against the library, diffed against its base, rebuilt with `zen reuse --base` "
             "and run by `zen verify` in a fresh process where only the base's code was importable.", ""]  # fmt: skip
    lines += table_ii(rows) + table_iii(rows, bases) + table_vi(rows)
    selfs = [(r["model"], r["scores"].get(r["model"], {})) for r in rows if r["kind"] == "base"]
    lines += ["Bases against their own library entry (built by `zen library build` from another process running the "
              "same model): " + ", ".join(f"{m} UR {_f(s.get('ur'))}" for m, s in selfs) + ". Below 1.00 means the two "
              "processes held different model-code closures (see the PR components).", ""]  # fmt: skip
    lines += [
        "## Fig. 3: UR heatmap",
        "",
        "![UR heatmap](families_heatmap.png)",
        "",
        "## Times (s)",
        "",
        "| model | acquire | recover | attribute | verify (fresh process) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['model']} | {r['time_acquire_s']} | {r['time_recover_s']} | {r['time_attribute_s']} | "
              f"{r['time_verify_s']} |" for r in rows]  # fmt: skip
    (out / "families.md").write_text("\n".join(lines) + "\n")
    (out / "families.json").write_text(json.dumps({"meta": meta, "bases": bases, "rows": rows}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temp dir, removed afterwards)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--only", nargs="*", help="run only these scenario models")
    ap.add_argument("--render", type=Path, help="only rewrite the tables from a families.json of an earlier run")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        write_results(saved["rows"], saved["bases"], args.out, saved["meta"])
        return 0
    import torch

    work = args.work or Path(tempfile.mkdtemp(prefix="zen-families-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lib = work / "library.sqlite"
    lib.unlink(missing_ok=True)
    print("building the library ...", flush=True)
    lib_s = build_library(lib)
    rows = []
    for name in args.only or SCENARIOS:
        print(f"{name}: deploy, image, recover, attribute, diff, reuse, verify ...", flush=True)
        r = run_one(name, work, lib)
        print(f"  attributed {r['attributed']} ({'ok' if r['attribution_correct'] else 'WRONG'}); outputs "
              f"{'identical' if r['outputs_identical'] else 'DIFFERENT'}; {r['tensors_bit_exact']}/{r['tensors_in_process']} "
              "tensors bit-exact", flush=True)  # fmt: skip
        rows.append(r)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(), "torch": torch.__version__, "library_s": round(lib_s, 1),
            "total_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    write_results(rows, BASES, args.out, meta)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r["model"] for r in rows if not (r["attribution_correct"] and r["outputs_identical"])]
    print(f"wrote {args.out / 'families.md'}" + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
