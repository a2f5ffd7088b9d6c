"""The zoo benchmark's results page (bench/results/zoo.md) from its state, for bench/zoo.py."""

from __future__ import annotations

from pathlib import Path

from zoo_models import TIES  # beside this file

TV_VERSION, TIMM_VERSION = "0.28.0", "1.0.29"  # the zoo's pinned side installs (bench/zoo.py installs them)
LIBS = ("torchvision", "timm", "transformers")


def _verdict(r: dict | None) -> str:
    if not r:
        return "-"
    if "error" in r:
        return f"FAIL: {r['error'][:160]}"
    return "identical" if r.get("equal") else "DIFFERS"


def _problems(r: dict) -> list[str]:
    return sorted(set((r.get("reuse_base") or {}).get("problems", []) + (r.get("reuse_sc") or {}).get("problems", [])))


def _values(r: dict) -> str:
    """attribute values equal to the deployed ones / compared, in the worse of the two rebuilds"""
    runs = [x for x in (r.get("reuse_base"), r.get("reuse_sc")) if x]
    pairs = [(x.get("values_checked") or 0, len(x.get("values_differ") or [])) for x in runs]
    n, bad = max(pairs, key=lambda p: p[1], default=(0, 0))
    return f"{n - bad}/{n}" if n else "-"


def write_md(state: dict, out: Path, meta: dict, pending: list[str] = ()) -> None:
    """bench/results/zoo.md from the per-model rows (and the catalogue entries not run yet)."""
    rows = list(state.values())
    ran = [r for r in rows if "reuse_base" in r]
    both = [r for r in ran if r["reuse_base"].get("equal") and r["reuse_sc"].get("equal")]
    attributed = [r for r in ran if r.get("attribution")]
    att = [r for r in attributed if (r["attribution"].get("attributed") == r["name"] or r["attribution"].get("twin"))
           and (r["attribution"].get("ur") or 0) >= 0.99]  # fmt: skip
    margins = sorted(r["attribution"]["margin"] for r in att if r["attribution"].get("margin") is not None)
    count = {lib: sum(1 for r in rows if r["library"] == lib) for lib in LIBS}
    lines = ["# Model zoo sweep (issue 15)", "",
             f"Run {meta['date']} on {meta['machine']}; torch {meta['torch']}, torchvision {TV_VERSION}, timm {TIMM_VERSION}, "
             f"transformers {meta['transformers']}. `python bench/zoo.py`; results accumulate in a state file across runs; "
             f"the models' end-to-end times sum to {sum(r.get('total_s') or 0 for r in rows) / 60:.0f} min "
             "(on a machine shared with other jobs: times are not comparable between rows).", "",
             "## Totals", "", "| | models |", "|---|---|",
             f"| in the catalogue | {len(rows) + len(pending)} |",
             f"| run | {len(rows)} ({', '.join(f'{k}: {v}' for k, v in count.items())}) |",
             f"| deployed, imaged and recovered | {len(ran)} |",
             f"| every state_dict tensor bit-exact | {sum(1 for r in ran if r.get('exact') == r.get('tensors'))} |",
             f"| `--base` rebuild bit-identical | {sum(1 for r in ran if r['reuse_base'].get('equal'))} |",
             f"| self-contained rebuild bit-identical | {sum(1 for r in ran if r['reuse_sc'].get('equal'))} |",
             f"| both bit-identical | {len(both)} |",
             f"| attributed to itself (or to its identical twin) with UR >= 0.99 | {len(att)} of {len(attributed)} |",
             f"| runner-up margin (UR): min / median | {margins[0] if margins else 0:.3f} / "
             f"{margins[len(margins) // 2] if margins else 0:.3f} |",
             f"| not rebuilt (skipped, or failed before reuse) | {len(rows) - len(ran)} |", "",
             "## Failures and causes", ""]  # fmt: skip
    for r in rows:
        if r in both:
            continue
        bad = [k for k in ("reuse_base", "reuse_sc") if not r.get(k, {}).get("equal")]
        cause = r.get("error") or "; ".join(f"{k[6:]}: {_verdict(r[k])}" for k in bad)
        lines.append(f"- `{r['name']}`: {cause}")
    for r in attributed:
        a = r["attribution"]
        if a.get("attributed") != r["name"] or (a.get("ur") or 0) < 0.99:
            why = f"its twin: {a['twin']}" if a.get("twin") else "not a twin"
            lines.append(f"- `{r['name']}`: attributed to `{a.get('attributed')}` (UR {a.get('ur')}, "
                         f"runner-up `{a.get('runner_up')}`, margin {a.get('margin')}); {why}. "
                         f"{TIES.get(r['name'], '')}")  # fmt: skip
    lines += ["", "## Per model", "", "| model | params (M) | modules | code objects | tensors exact | `--base` | self-contained "
              "| "
              "values equal | problems | attributed (UR) | runner-up (margin) | recover s | total s |",
              "|" + "---|" * 13]  # fmt: skip
    for r in rows:
        a = r.get("attribution") or {}
        cells = [r["name"], f"{(r.get('parameters') or 0) / 1e6:.2f}", r.get("modules", "-"), r.get("code_objects", "-"),
                 f"{r.get('exact', '-')}/{r.get('tensors', '-')}", _verdict(r.get("reuse_base")).split(":")[0],
                 _verdict(r.get("reuse_sc")).split(":")[0], _values(r), len(_problems(r)),
                 f"{a.get('attributed') or '-'} ({a.get('ur', '-')})", f"{a.get('runner_up') or '-'} ({a.get('margin', '-')})",
                 r.get("recover_s", "-"), r.get("total_s", "-")]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    notes = [f"- `{r['name']}`: " + "; ".join(p[:200] for p in _problems(r)[:3]) for r in rows if _problems(r)]
    if notes:
        lines += ["", "## Values reported as not rebuildable (problem entries)", ""] + notes
    if pending:
        lines += [
            "",
            f"## Not run yet ({len(pending)}; `python bench/zoo.py` resumes with them)",
            "",
            ", ".join(f"`{n}`" for n in pending),
        ]
    out.write_text("\n".join(lines) + "\n")
