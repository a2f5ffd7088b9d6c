"""Self-contained HTML forensic report: one file, inline CSS, charts embedded as PNG data URIs.

Every value from the case is escaped; the page loads nothing from anywhere.
"""

from __future__ import annotations

import base64
import json
from html import escape
from typing import Any

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1d2329;background:#f6f7f8}
main{max-width:1100px;margin:0 auto;padding:24px 32px 64px;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:2px solid #3a6f4f;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}.sub{color:#5b6670}
table{border-collapse:collapse;width:100%;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #d9dee3;padding:4px 7px;text-align:left;vertical-align:top}
th{background:#eef2f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f3f5f7;border:1px solid #e1e5e9;padding:8px;overflow-x:auto;white-space:pre}
.add{color:#1a7f37}.del{color:#b42318}.hunk{color:#6e7781}
.ok{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}
.kv td:first-child{width:210px;color:#5b6670}.box{border-left:4px solid #3a6f4f;background:#f3f8f5;padding:8px 12px}
.warn{border-left:4px solid #c27c0e;background:#fdf6ea;padding:8px 12px}
"""


# Defence in depth: even if a value escaped escaping, the page may run no script and load nothing.
CSP = ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
       'style-src \'unsafe-inline\'">')  # fmt: skip


def _t(v: Any) -> str:
    return escape("" if v is None else str(v))


def _kv(rows: list[tuple[str, Any]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><td>{_t(k)}</td><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _table(head: list[str], rows: list[list[Any]], num: set[int] | None = None) -> str:
    num = num or set()
    h = "".join(f"<th>{_t(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in num else ""}>{x}</td>' for i, x in enumerate(r)) + "</tr>"
                   for r in rows)  # fmt: skip
    return f"<table><tr>{h}</tr>{body}</table>"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_t(alt)}" style="max-width:100%" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _diff_block(lines: list[str]) -> str:
    out = []
    for line in lines:
        cls = "add" if line.startswith("+") and not line.startswith("+++") else "del" if line.startswith("-") and not \
            line.startswith("---") else "hunk" if line.startswith("@@") else ""  # fmt: skip
        out.append(f'<span class="{cls}">{_t(line)}</span>' if cls else _t(line))
    return "<pre>" + "\n".join(out) + "</pre>"


def _evidence(d: dict) -> str:
    e = d["evidence"]
    py, torch = e.get("python") or {}, e.get("torch") or {}
    compiled = e.get("source") == "compiled"
    source = "compiled executable" if compiled else "memory image"
    gone = " (not at this path now: moved or deleted; the sha256 below identifies the image)" if e.get("image_gone") else ""
    rows = [(source, f"<code>{_t(e['image'])}</code>{_t(gone)}"), ("size", f"{e['size']:,} bytes" if e.get("size") else ""),
            ("sha256", f"<code>{_t(e['sha256'])}</code>"), ("acquired", _t(e.get("acquired_at"))),
            ("acquisition", _t(f"{e.get('producer')} ({e.get('acquisition_mode') or 'foreign core'})")),
            ("process", _t(f"PID {e.get('pid')}: {e.get('command') or ''}")),
            ("Python", _t(f"{py.get('version')} (found via {', '.join(f'{k}: {v}' for k, v in (py.get('how') or {}).items())})")),
            ("torch", _t(torch.get("version"))), ("layout profiles", f"<code>{_t(json.dumps(e.get('profiles')))}</code>"),
            ("recovery status", _t(e.get("status"))), ("recovered by", _t(e.get("recovered_by"))),
            ("case directory", f"<code>{_t(e['case'])}</code>")]  # fmt: skip
    rows[5:5] = [(k, _t(v)) for k, v in e.get("system") or []]
    html = _integrity_banner(e) + _kv(rows)
    if compiled:
        html = (
            '<div class="box">Source: a <b>compiled executable</b> (TVM model library) decompiled by zen, not a '
            "process image: there is no Python code, so only the mathematical representation is compared.</div>" + html
        )
    if e.get("notes"):
        html += "<ul>" + "".join(f"<li>note: {_t(n)}</li>" for n in e["notes"]) + "</ul>"
    if e.get("problems"):
        html += '<div class="warn"><b>problems with the evidence</b><ul>' + "".join(
            f"<li>{_t(p)}</li>" for p in e["problems"]) + "</ul></div>"  # fmt: skip
    if e.get("files"):
        checks = (e.get("integrity") or {}).get("files") or {}
        rows = [[_t(k), f"<code>{_t(v)}</code>", _check(checks.get(k))] for k, v in sorted(e["files"].items())]
        rows += [[_t(k), "(not recorded)", _check(v)] for k, v in sorted(checks.items()) if k not in e["files"]]
        html += "<h3>case files (sha256, checked when this report was made)</h3>" + _table(["file", "sha256", "check"], rows)
        if (e.get("integrity") or {}).get("manifest_sha256"):
            html += f"<p>manifest.json sha256 <code>{_t(e['integrity']['manifest_sha256'])}</code></p>"
        sig = (e.get("integrity") or {}).get("signature") or {}
        if sig:
            mark = "ok" if sig.get("status") == "valid" else "bad"
            html += f'<p>signature: <span class="{mark}">{_t(sig.get("status"))}</span> ({_t(sig.get("reason"))})</p>'
    return html


def _check(v: str | None) -> str:
    if v == "verified":
        return '<span class="ok">verified</span>'
    return f'<span class="bad">{_t(v or "not checked")}</span>'


def _integrity_banner(e: dict) -> str:
    """A case that fails verification says so before anything else in the report."""
    integ = e.get("integrity") or {}
    if integ.get("verified", True):
        return ""
    items = "".join(f"<li>{_t(p)}</li>" for p in integ.get("problems", []))
    return (f'<div class="warn"><b class="bad">THE CASE FILES FAIL VERIFICATION (they do not match the manifest or '
            f"each other): what follows may not be what "
            f"zen recovered from the image.</b><ul>{items}</ul></div>")  # fmt: skip


def _summary(d: dict) -> str:
    s = d["summary"]
    rows = [("model", f"<code>{_t(s['root_class'])}</code> at {_t(s['root_address'])} "
                      f"(referenced from {_t(', '.join(s['referenced_from']) or 'nowhere')})"),
            ("deployed as", _t(s.get("deployed_as") or "eager")),
            ("tensors", f"{s['tensors']:,}"), ("layers (modules)", f"{s['layers']:,}"),
            ("weights (parameter elements)", f"{(s['weights'] or 0):,}"), ("dtypes", _t(s.get("dtypes"))),
            ("model functions / code objects", f"{s['functions']:,} / {s['code_objects']:,}"),
            ("model classes / modules", f"{s['classes']:,} / {s['modules']:,}"),
            ("tied weights", _t(s.get("tied") or "none"))]  # fmt: skip
    return _kv(rows)


def _attribution(d: dict, charts: bool) -> str:
    a = d["attribution"]
    if a is None:
        return "<p>No library was given: attribution not performed.</p>"
    html = f'<div class="box"><b>{_t(a["attributed"] or "not attributed")}</b> — {_t(a["explanation"])}</div>'
    n = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731  (PR/UR of a compiled model: not available)
    rows = [[_t(c["name"]), n(c["ur"]), n(c["mr"]), n(c["pr"]), _t(c.get("arch")), _t(c.get("ts")),
             _t(c.get("op")), _t(c.get("graph")), _t(c.get("cos")), _t(c.get("cls")), _t(c.get("exact", "-")),
             _t(c.get("matched", "-")), _t(c.get("added", "-")), _t(c["method"])] for c in a["candidates"][:20]]  # fmt: skip
    html += _table(["base model", "UR", "MR", "PR", "Arch", "TS", "OP", "graph", "COs", "CLS", "identical", "changed", "added",
                    "method"], rows, set(range(1, 13)))  # fmt: skip
    html += (f"<p class=sub>Library {_t(a['library'])} ({a['library_models']} models). UR = {a['weights']['ur']['mr']}·MR + "
             f"{a['weights']['ur']['pr']}·PR.</p>")  # fmt: skip
    if charts and a["candidates"]:
        from zen.report.charts import score_bars

        html += _img(score_bars(a["candidates"]), "similarity to each base model")
    return html


def _artefacts(d: dict) -> str:
    art = d.get("artefacts")
    if not art:
        return "<p>No base model to compare with.</p>"
    return _kv([("identical functions", f"{len(art['identical_functions'])}: " + _t(", ".join(art["identical_functions"][:60]))),
                ("classes also in the base", _t(", ".join(art["shared_classes"]) or "none")),
                ("modules also in the base", _t(", ".join(art["shared_modules"]) or "none"))])  # fmt: skip


def _changes(d: dict) -> str:
    df = d.get("diff")
    if not df:
        return "<p>No base model to compare with.</p>"
    if "error" in df:
        return f'<div class="warn">{_t(df["error"])}</div>'
    html = _kv([("changed functions", df["changed"]), ("added functions", df["added"] + df["added_class_methods"]),
                ("unchanged functions", df["unchanged"]), ("share of model code edited or added", f"{df['changed_percent']}%"),
                ("classes added", _t(", ".join(df["classes_added"]) or "none")),
                ("classes removed", _t(", ".join(df["classes_removed"]) or "none")),
                ("class attributes changed", _t(", ".join(df["class_attributes_changed"]) or "none")),
                ("module map (recovered → base)",
                 _t(", ".join(f"{k} → {v or 'new'}" for k, v in df["module_map"].items())))])  # fmt: skip
    for x in df.get("excluded", []):
        html += f'<div class="warn">excluded as corrupt: {_t(x["function"])}: {_t(x["reason"])}</div>'
    for f in df["functions"]:
        mark = "changed" if f["op"] == "changed" else "added"
        score = f" (match {f['score']})" if f.get("score") is not None else ""
        html += f"<h3>{mark}: <code>{_t(f['target'])}</code> ← <code>{_t(f['recovered'])}</code>{_t(score)}</h3>"
        if f.get("summary"):
            html += f"<p>{_t(f['summary'])}</p>"
        why = f" ({_t(f['note'])})" if f.get("note") else ""  # a listing because depyf's work limit was reached
        html += f"<p class=sub>{_t(f['shown_as'])} diff{why}</p>" + _diff_block(f["unified"])
    return html


def _verification(d: dict) -> str:
    v = d.get("verification")
    if v is None:
        return "<p>No reuse package was given.</p>"
    html = _kv([("package", f"<code>{_t(v['package'])}</code>"), ("mode", _t(v["reuse"].get("mode"))),
                ("base", _t(v["reuse"].get("base"))),
                ("patch sha256", f"<code>{_t(v['reuse'].get('patch_sha256'))}</code>")])  # fmt: skip
    for problem in v.get("problems", []):
        html += f'<div class="warn"><span class="bad">{_t(problem)}</span></div>'
    ver = v.get("verify")
    if ver is None:
        return html + f'<div class="warn">{_t(v.get("note"))}</div>'
    rows = []
    for r in ver["results"]:
        eq = r.get("equal")
        cell = '<span class="ok">bit-identical</span>' if eq else '<span class="bad">differs</span>' if eq is False else "-"
        rows.append(
            [_t(r["input"]), _t(r.get("shape")), _t(r.get("dtype")), cell, _t(r.get("error") or r.get("max_abs_diff", ""))]
        )
    html += _table(["input", "output shape", "dtype", "deployed vs rebuilt", "note"], rows)
    html += (f"<p class=sub>Verified {_t(ver.get('time'))} by {_t(ver.get('tool'))} in a separate process (it executed code "
             f"recovered from the image); inputs {_t(ver.get('inputs_sha256'))}, expected outputs "
             f"{_t(ver.get('expect_sha256'))} (sha256).</p>")  # fmt: skip
    return html


def _f(v: Any, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _fig(fig: dict | None, alt: str) -> str:
    if not fig:
        return ""
    return f'<img alt="{_t(alt)}" style="max-width:100%" src="data:image/png;base64,{_t(fig["png_base64"])}">'


def _problems(items: list) -> str:
    return "".join(f'<div class="warn"><span class="bad">{_t(p)}</span></div>' for p in items)


def _analysis(d: dict) -> str:
    """`zen analyze`: ART's attacks and Neural Cleanse on the rebuilt model (run in a child process)."""
    a = d["analysis"]
    s = a["subject"]
    html = _problems(a["problems"])
    html += _kv([("analysed", _t(f"{s.get('model')} ({s.get('kind')}: {s.get('case') or s.get('package')})")),
                 ("model", _t(f"{_f(a['classes'], '.0f')} classes, input {a['input_shape']}")),
                 ("inputs", _t(a["inputs"])), ("inputs sha256", f"<code>{_t(a['inputs_sha256'])}</code>"),
                 ("parameters", _t(", ".join(f"{k}={v}" for k, v in a["parameters"].items()))),
                 ("versions", _t(", ".join(f"{k} {v}" for k, v in a["versions"].items()))),
                 ("run", _t(f"{a['generated']} by {a['tool']}, in a child process: it executed code recovered from the "
                            "image"))])  # fmt: skip
    rob = a.get("robustness")
    if rob:
        lab = rob["labelled"]
        html += "<h3>robustness (FGSM, PGD)</h3>"
        rows = [["clean", "0", _f(rob["clean_accuracy"]), "", ""]] if lab else []
        rows += [[_t(str(r["attack"]).upper()), _f(r["eps"], "g"), _f(r["accuracy"] if lab else r["changed"]),
                  _f(r["max_linf"], ".4g"), _f(r["mean_l2"], ".4g")] for r in rob["rows"]]  # fmt: skip
        html += _table(["attack", "eps", "accuracy" if lab else "predictions changed", "max |δ|", "mean L2"], rows, {1, 2, 3, 4})
        html += _fig(rob.get("figure"), "accuracy against epsilon")
    bd = a.get("backdoor")
    if bd:
        flagged = ", ".join(bd["flagged"])
        verdict = (f'<span class="bad">backdoor suspected at class {_t(flagged)}</span>' if flagged else
                   '<span class="ok">no class flagged</span>')  # fmt: skip
        html += (f"<h3>hidden behaviour ({_t(bd['detector'])})</h3><div class=box>{verdict} (anomaly index above "
                 f"{_f(bd['threshold'], 'g')} with a trigger smaller than the median)</div>")  # fmt: skip
        html += _fig(bd.get("figure"), "anomaly index per class")
        for t in bd["triggers"]:
            html += _fig(t, f"reverse-engineered trigger, {t['label']}")
        rows = [[_t(c["class"]), _f(c["l1"], ".2f"), _f(c["anomaly_index"], ".2f"), '<span class="bad">flagged</span>'
                 if c["flagged"] else ""] for c in bd["classes"]]  # fmt: skip
        html += _table(["class", "trigger L1", "anomaly index", ""], rows, {1, 2})
    for p in a["load_problems"]:
        html += f'<div class="warn">not rebuildable: {_t(p)}</div>'
    return html


def _drift(d: dict) -> str:
    """`zen drift`: the weights of one model across memory snapshots (AiP Table 4)."""
    r = d["drift"]
    html = _problems(r["problems"])
    html += _table(["snapshot", "case", "acquired", "image sha256"], [[_f(s["index"], ".0f"), f"<code>{_t(s['case'])}</code>",
                   _t(s["acquired_at"]), f"<code>{_t(s['image_sha256'])}</code>"] for s in r["snapshots"]])  # fmt: skip
    first = lambda v: "never" if v is None else f"snapshot {v:.0f}"  # noqa: E731
    rows = [[_t(x["name"]), _f(x["elements"], ",.0f"), _f(x["l2"], ".4g"), _f(x["relative"], ".4g"), _f(x["cosine"], ".6f"),
             "-" if x["changed"] is None else f"{100 * x['changed']:.1f}%", first(x["first_changed"])]
            for x in [r["model_drift"]] + r["layers"] + r["counters"]]  # fmt: skip
    html += ("<p class=sub>Last snapshot against the first; layers aggregate their floating-point tensors, integer tensors "
             "(counters) follow them.</p>")  # fmt: skip
    html += _table(["layer / tensor", "elements", "L2", "relative", "cosine", "elements changed", "first changed"], rows,
                   {1, 2, 3, 4, 5})  # fmt: skip
    html += _fig(r.get("figure"), "weight drift timeline")
    for h in r["hyperparameters_changed"]:
        html += f"<p>hyper-parameter changed: {_t(h)}</p>"
    html += f"<p>optimizer: {_t(r['optimizer'])}</p>"
    return html


def _modules(d: dict) -> str:
    rows = [[_t(m["path"]), f"<code>{_t(m['class'])}</code>", _t(", ".join(f"{k}={v}" for k, v in m["hyperparameters"].items())),
             _t(", ".join(m["parameters"] + m["buffers"]))] for m in d["modules"]]  # fmt: skip
    note = "" if d["modules_total"] <= len(rows) else f"<p class=sub>first {len(rows)} of {d['modules_total']} modules</p>"
    return _table(["path", "class", "hyper-parameters", "tensors"], rows) + note


def _context(d: dict) -> str:
    ctx = d.get("context") or {}
    deps = ctx.get("dependencies") or {}
    used = set(deps.get("used_by_model") or [])
    rows = [[_t(k), _t(v.get("version")), "yes" if k in used else "", _t(v.get("modules_loaded")), _t(v.get("version_from"))]
            for k, v in sorted((deps.get("packages") or {}).items())]  # fmt: skip
    rt, hw = ctx.get("runtime") or {}, ctx.get("hardware") or {}
    html = _kv([("runtime", _t(", ".join(f"{k}: {v}" for k, v in rt.items()))),
                ("hardware", _t(", ".join(f"{k}: {v}" for k, v in hw.items())))])  # fmt: skip
    if rows:
        html += _table(["package", "version", "used by the model", "modules loaded", "version from"], rows, {3})
    if d.get("requirements"):
        html += "<h3>requirements.txt</h3><pre>" + _t("\n".join(d["requirements"])) + "</pre>"
    return html or "<p>No execution context recorded.</p>"


def render(d: dict, *, charts: bool = True) -> str:
    title = f"zen forensic report: {d['summary']['root_class']}"
    sections = [("Evidence", _evidence(d)), ("Recovered model (unified representation)", _summary(d)),
                ("Attribution", _attribution(d, charts)), ("Incriminating artefacts", _artefacts(d)),
                ("Changes relative to the base (Algorithm 2)", _changes(d)), ("Reuse verification", _verification(d)),
                ("Module tree (mathematical representation)", _modules(d)), ("Execution context", _context(d))]  # fmt: skip
    if d.get("analysis"):
        sections.insert(6, ("White-box analysis (ART)", _analysis(d)))
    if d.get("drift"):
        sections.insert(7 if d.get("analysis") else 6, ("Weight drift across snapshots", _drift(d)))
    nav = " · ".join(f'<a href="#s{i}">{_t(name)}</a>' for i, (name, _) in enumerate(sections))
    body = "".join(f'<h2 id="s{i}">{i + 1}. {_t(name)}</h2>{html}' for i, (name, html) in enumerate(sections))
    head = f'<head><meta charset="utf-8">{CSP}<title>{_t(title)}</title><style>{CSS}</style></head>'
    intro = (f"<p class=sub>generated {_t(d['generated'])} by {_t(d['tool'])}; nothing recovered from the image was "
             "executed to produce this report</p>")  # fmt: skip
    page = f"<main><h1>{_t(title)}</h1>{intro}<p>{nav}</p>{body}</main>"
    return f'<!DOCTYPE html><html lang="en">{head}<body>{page}</body></html>\n'
