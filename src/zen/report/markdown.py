"""Markdown forensic report: the same content as the HTML one, for text tools and review systems.

Values from the case are untrusted (names, strings and code come from the image): text is
HTML-escaped and stripped of Markdown syntax that could change the page, code spans and fences
are made longer than any backtick run inside them, so a hostile name can neither inject markup
nor break out of a table or a code block.
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any


class Md(str):
    """Already-formatted Markdown (built from escaped parts); `_table` leaves it alone."""


def _txt(v: Any) -> str:
    text = escape("" if v is None else str(v), quote=False).replace("\n", " ").replace("\r", " ")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", text)


def _code(v: Any) -> Md:
    text = ("" if v is None else str(v)).replace("\n", " ").replace("\r", " ").replace("|", "\\|")
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return Md(f"{ticks} {text} {ticks}")


def _fence(lang: str, lines: list[str]) -> list[str]:
    longest = max((len(m) for line in lines for m in re.findall(r"`{3,}|~{3,}", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + lang, *lines, fence, ""]


def _cell(v: Any) -> str:
    return v if isinstance(v, Md) else _txt(v)


def _na(v: Any) -> Any:
    """PR-side scores are None for a model decompiled from an executable: not available, not 0."""
    return "n/a" if v is None else v


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(x) for x in r) + " |" for r in rows]
    return out + [""]


def render(d: dict) -> str:
    e, s = d["evidence"], d["summary"]
    py = e.get("python") or {}
    lines = [f"# zen forensic report: {_txt(s['root_class'])}", "",
             f"Generated {_txt(d['generated'])} by {_txt(d['tool'])}; nothing recovered from the image was executed "
             "to produce it.", "",
             "## 1. Evidence", ""]  # fmt: skip
    integ = e.get("integrity") or {}
    if not integ.get("verified", True):
        lines += ["**THE CASE FILES FAIL VERIFICATION (they do not match the manifest or each other): what follows may not be "
                  "what zen recovered from the "
                  "image.**", ""] + [f"- **{_txt(p)}**" for p in integ.get("problems", [])] + [""]  # fmt: skip
    if e.get("source") == "compiled":
        lines += [
            "Source: a **compiled executable** (TVM model library) decompiled by zen, not a process image: there is "
            "no Python code, so only the mathematical representation is compared.",
            "",
        ]
    source = "compiled executable" if e.get("source") == "compiled" else "memory image"
    gone = " (not at this path now: moved or deleted; the sha256 below identifies the image)" if e.get("image_gone") else ""
    lines += _table(["", ""], [[source, _code(e["image"]) + gone], ["size", f"{e.get('size') or 0:,} bytes"],
                               ["sha256", _code(e["sha256"])], ["acquired", e.get("acquired_at")],
                               ["acquisition", f"{e.get('producer')} ({e.get('acquisition_mode') or 'foreign core'})"],
                               ["process", f"PID {e.get('pid')}: {e.get('command') or ''}"],
                               ["Python", py.get("version")], ["torch", (e.get("torch") or {}).get("version")],
                               ["layout profiles", _code(json.dumps(e.get("profiles")))], ["status", e.get("status")],
                               ["case", _code(e["case"])]] + [[k, v] for k, v in e.get("system") or []])  # fmt: skip
    for n in e.get("notes") or []:
        lines.append(f"- note: {_txt(n)}")
    for p in e.get("problems") or []:
        lines.append(f"- problem: {_txt(p)}")
    checks = integ.get("files") or {}
    if checks:
        lines += ["", "Case files (sha256 from the manifest; checked when this report was made):", ""]
        lines += _table(["file", "sha256", "check"], [[k, _code((e.get("files") or {}).get(k) or "(not recorded)"), v]
                                                      for k, v in sorted(checks.items())])  # fmt: skip
        lines += ["", f"manifest.json sha256 {_code(integ.get('manifest_sha256') or '?')}", ""]
        sig = integ.get("signature") or {}
        if sig:
            lines += ["", f"signature: **{_txt(sig.get('status'))}** ({_txt(sig.get('reason'))})"]
    lines += ["## 2. Recovered model", ""]
    lines += _table(["", ""], [["model", Md(f"{_code(s['root_class'])} at {_txt(s['root_address'])}")],
                               ["deployed as", s.get("deployed_as") or "eager"], ["tensors", s["tensors"]],
                               ["layers", s["layers"]], ["weights", f"{s['weights'] or 0:,}"],
                               ["functions / code objects", f"{s['functions']} / {s['code_objects']}"],
                               ["classes / modules", f"{s['classes']} / {s['modules']}"]])  # fmt: skip
    a = d.get("attribution")
    lines += ["## 3. Attribution", ""]
    if a is None:
        lines += ["No library was given.", ""]
    else:
        lines += [f"**{_txt(a['attributed'] or 'not attributed')}**: {_txt(a['explanation'])}", ""]
        lines += _table(["base model", "UR", "MR", "PR", "COs", "CLS", "identical", "changed", "added", "method"],
                        [[c["name"], _na(c["ur"]), c["mr"], _na(c["pr"]), _na(c.get("cos")), _na(c.get("cls")),
                          c.get("exact", "-"), c.get("matched", "-"), c.get("added", "-"), c["method"]]
                         for c in a["candidates"][:20]])  # fmt: skip
    art = d.get("artefacts")
    lines += ["## 4. Incriminating artefacts", ""]
    if art:
        same = art["identical_functions"]
        lines += [f"- identical functions ({len(same)}): {_txt(', '.join(same[:60]))}",
                  f"- classes also in the base: {_txt(', '.join(art['shared_classes']) or 'none')}",
                  f"- modules also in the base: {_txt(', '.join(art['shared_modules']) or 'none')}", ""]  # fmt: skip
    df = d.get("diff")
    lines += ["## 5. Changes relative to the base", ""]
    if df and "error" not in df:
        added = df["added"] + df["added_class_methods"]
        lines += [f"{df['changed']} changed, {added} added, {df['unchanged']} unchanged "
                  f"functions ({df['changed_percent']}% of the model code edited or added); classes added: "
                  f"{_txt(', '.join(df['classes_added']) or 'none')}; "
                  f"removed: {_txt(', '.join(df['classes_removed']) or 'none')}.", ""]  # fmt: skip
        for f in df["functions"]:
            lines += [f"### {_txt(f['op'])}: {_code(f['target'])} <- {_code(f['recovered'])}", ""]
            if f.get("summary"):
                lines += [_txt(f["summary"]), ""]
            if f.get("note"):  # a listing because depyf's work limit was reached
                lines += [_txt(f["note"]), ""]
            lines += _fence("diff", f["unified"])
    elif df:
        lines += [_txt(df["error"]), ""]
    v = d.get("verification")
    lines += ["## 6. Reuse verification", ""]
    for problem in (v or {}).get("problems", []):
        lines += [f"**warning: {_txt(problem)}**", ""]
    if v and v.get("verify"):
        lines += _table(["input", "shape", "dtype", "deployed vs rebuilt"],
                        [[r["input"], r.get("shape"), r.get("dtype"),
                          {True: "bit-identical", False: "DIFFERS"}.get(r.get("equal"), r.get("error", "-"))]
                         for r in v["verify"]["results"]])  # fmt: skip
    elif v:
        lines += [_txt(v.get("note", "")), ""]
    n = 7
    if d.get("analysis"):
        lines += [f"## {n}. White-box analysis (ART)", "", *_analysis(d["analysis"])]
        n += 1
    if d.get("drift"):
        lines += [f"## {n}. Weight drift across snapshots", "", *_drift(d["drift"])]
        n += 1
    lines += [f"## {n}. Module tree", ""]
    lines += _table(["path", "class", "hyper-parameters"],
                    [[m["path"], _code(m["class"]), ", ".join(f"{k}={x}" for k, x in m["hyperparameters"].items())]
                     for m in d["modules"]])  # fmt: skip
    if d.get("requirements"):
        lines += [f"## {n + 1}. Execution context (requirements.txt)", "", *_fence("", d["requirements"])]
    return "\n".join(lines) + "\n"


def _f(v: Any, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _figures(folder: str, figs: list) -> list[str]:
    """Figures are files beside the JSON (checked against its hashes); Markdown names them rather than embeds."""
    names = [f["name"] for f in figs if f]
    return [f"Figures in {_code(folder)}: " + ", ".join(_code(n) for n in names), ""] if names else []


def _analysis(a: dict) -> list[str]:
    s = a["subject"]
    lines = [f"**warning: {_txt(p)}**" for p in a["problems"]] + [""] if a["problems"] else []
    lines += _table(["", ""], [["analysed", f"{s.get('model')} ({s.get('kind')}: {s.get('case') or s.get('package')})"],
                               ["inputs", a["inputs"]], ["inputs sha256", _code(a["inputs_sha256"])],
                               ["parameters", ", ".join(f"{k}={v}" for k, v in a["parameters"].items())],
                               ["run", f"{a['generated']} by {a['tool']}, in a child process (executed recovered "
                                       "code)"]])  # fmt: skip
    rob, figs = a.get("robustness"), []
    if rob:
        lab = rob["labelled"]
        rows = [["clean", "0", _f(rob["clean_accuracy"]), ""]] if lab else []
        rows += [[str(r["attack"]).upper(), _f(r["eps"], "g"), _f(r["accuracy"] if lab else r["changed"]),
                  _f(r["max_linf"], ".4g")] for r in rob["rows"]]  # fmt: skip
        lines += _table(["attack", "eps", "accuracy" if lab else "predictions changed", "max abs delta"], rows)
        figs.append(rob.get("figure"))
    bd = a.get("backdoor")
    if bd:
        flagged = ", ".join(bd["flagged"])
        lines += [
            f"**{'backdoor suspected at class ' + _txt(flagged) if flagged else 'no class flagged'}** by "
            f"{_txt(bd['detector'])} (anomaly index above {_f(bd['threshold'], 'g')}).",
            "",
        ]
        lines += _table(["class", "trigger L1", "anomaly index", "flagged"],
                        [[c["class"], _f(c["l1"], ".2f"), _f(c["anomaly_index"], ".2f"), "yes" if c["flagged"] else ""]
                         for c in bd["classes"]])  # fmt: skip
        figs += [bd.get("figure"), *bd["triggers"]]
    return lines + _figures(a["dir"], figs)


def _drift(r: dict) -> list[str]:
    lines = [f"**warning: {_txt(p)}**" for p in r["problems"]] + [""] if r["problems"] else []
    lines += _table(["snapshot", "case", "acquired", "image sha256"], [[_f(s["index"], ".0f"), _code(s["case"]), s["acquired_at"],
                    _code(s["image_sha256"])] for s in r["snapshots"]])  # fmt: skip
    lines += _table(["layer / tensor", "elements", "L2", "relative", "cosine", "changed", "first changed"],
                    [[x["name"], _f(x["elements"], ",.0f"), _f(x["l2"], ".4g"), _f(x["relative"], ".4g"),
                      _f(x["cosine"], ".6f"), "-" if x["changed"] is None else f"{100 * x['changed']:.1f}%",
                      "never" if x["first_changed"] is None else f"snapshot {x['first_changed']:.0f}"]
                     for x in [r["model_drift"]] + r["layers"] + r["counters"]])  # fmt: skip
    lines += [f"- hyper-parameter changed: {_txt(h)}" for h in r["hyperparameters_changed"]]
    lines += [f"Optimizer: {_txt(r['optimizer'])}", ""]
    return lines + _figures(r["dir"], [r.get("figure")])
