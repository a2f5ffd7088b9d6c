"""The forensic report (issue 7) on a real case: a customised fork recovered from a process image,
attributed against the test library, diffed, rebuilt and verified bit-identical.

What the report states is checked against ground truth that does not come from zen: the image's
sha256 is recomputed from the file, the fork's added and changed functions are computed from the
fork's and the base's source (`ast`), and the verification must cite the hashes of the files it
compared. The HTML is rendered in headless Chromium and the screenshot is looked at.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import case_of, zen
from families import materialize

from zen.report import html as report_html
from zen.report import markdown as report_md

FORK, BASE, IMAGE = "convnet_se", "convnet", "convnet"


def _functions(path: Path) -> dict[str, str]:
    """qualname -> normalised AST of every function in a module file (what a fork edits)."""
    out: dict[str, str] = {}

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = ast.dump(child, include_attributes=False)
                walk(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(path.read_text()), "")
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def reported(base_library, family_images, hf_image, workdir, tmp_path_factory):
    """One verified reuse package and its HTML/Markdown reports for the SE fork."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    where = tmp_path_factory.mktemp("report")
    case_dir = case_of(FORK, IMAGE, family_images, hf_image, workdir)
    pkg = where / "rebuilt_se"
    zen("reuse", case_dir, "--base", BASE, "--library", base_library, "-o", pkg)
    io = torch.load(family_images[IMAGE][1].outdir / f"{FORK}.io.pt")
    save_file({"x": io["input"]}, str(where / "in.safetensors"))
    save_file({"x": io["output"]}, str(where / "want.safetensors"))
    materialize(BASE, where / "base-code")
    r = subprocess.run([sys.executable, "-m", "zen", "verify", str(pkg), "--inputs", str(where / "in.safetensors"),
                        "--expect", str(where / "want.safetensors")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(where / "base-code")})  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = {"case": case_dir, "pkg": pkg, "where": where}
    for suffix in ("html", "md"):
        zen("report", case_dir, "-o", where / f"report.{suffix}", "--library", base_library, "--reuse", pkg)
        out[suffix] = (where / f"report.{suffix}").read_text()
    out["json"] = json.loads((where / "report.json").read_text())
    return out


def test_report_states_ground_truth(reported, family_images):
    d = reported["json"]
    manifest = json.loads((reported["case"] / "manifest.json").read_text())
    image = Path(manifest["evidence"]["image"])
    assert d["evidence"]["sha256"] == _sha256(image)  # recomputed here, not copied from zen's manifest
    assert d["evidence"]["size"] == image.stat().st_size
    assert d["attribution"]["attributed"] == BASE and d["base"] == BASE

    src = reported["where"] / "src"
    materialize(FORK, src)
    materialize(BASE, src)
    fork, base = _functions(src / f"{FORK}.py"), _functions(src / f"{BASE}.py")
    added = {q for q in fork if q not in base}
    changed = {q for q in fork if q in base and fork[q] != base[q]}
    ops = {f["recovered"].split(":", 1)[1]: f["op"] for f in d["diff"]["functions"]}
    assert {q for q, op in ops.items() if op == "added"} == added
    assert {q for q, op in ops.items() if op == "changed"} == changed
    unchanged = set(fork) - added - changed - {"build"}  # build() makes the model; no model code calls it
    assert {f.split(":", 1)[1] for f in d["artefacts"]["identical_functions"]} == unchanged
    assert d["diff"]["unchanged"] == len(unchanged)
    assert d["diff"]["classes_added"] == [f"{FORK}.SEBlock"]
    assert set(d["artefacts"]["shared_classes"]) >= {"BasicBlock", "ConvNet"}

    v = d["verification"]
    assert v["problems"] == [] and v["reuse"]["evidence_sha256"] == d["evidence"]["sha256"]
    assert v["verify"]["results"] and all(r["equal"] is True for r in v["verify"]["results"])
    assert v["verify"]["inputs_sha256"] == _sha256(reported["where"] / "in.safetensors")
    assert v["verify"]["expect_sha256"] == _sha256(reported["where"] / "want.safetensors")


def test_html_is_self_contained_and_complete(reported):
    page = reported["html"]
    assert page.startswith("<!DOCTYPE html>") and "Content-Security-Policy" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", page, re.I)  # loads nothing
    assert "<script" not in page.lower()
    for section in ("Evidence", "Attribution", "Incriminating artefacts", "Changes relative to the base",
                    "Reuse verification", "Module tree", "Execution context"):  # fmt: skip
        assert section in page
    d = reported["json"]
    assert d["evidence"]["sha256"] in page and "bit-identical" in page
    if d["diff"]["functions"][0]["shown_as"] == "source":  # depyf present: the decompiled source diff is shown
        assert "+    out = self.se(self.conv2(out))" in page
    pngs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert pngs and all(base64.b64decode(p).startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    md = reported["md"]
    assert md.startswith("# zen forensic report") and d["evidence"]["sha256"] in md
    assert "bit-identical" in md and "## 5. Changes relative to the base" in md


def test_report_flags_a_package_changed_after_verification(reported, base_library, tmp_path):
    pkg = tmp_path / "rebuilt_se"
    shutil.copytree(reported["pkg"], pkg)
    with open(pkg / "weights.safetensors", "r+b") as fh:  # flip one byte of the last tensor's data
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    zen("report", reported["case"], "-o", tmp_path / "r.md", "--no-attribute", "--reuse", pkg)
    v = json.loads((tmp_path / "r.json").read_text())["verification"]
    assert v["problems"] == ["files changed since verification: weights.safetensors"]
    assert "files changed since verification" in (tmp_path / "r.md").read_text()


HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'`|*_[x](javascript:alert(3))\n```"


def _poison(value, depth=0):
    """Every string in the report data replaced by hostile text that keeps the original (to stay valid)."""
    if isinstance(value, str):
        return value + HOSTILE
    if isinstance(value, list):
        return [_poison(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _poison(v, depth + 1) for k, v in value.items()}
    return value


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)


def _fences_balanced(md: str) -> bool:
    """True when every code fence closes and every section heading lies outside fences."""
    fence = 0
    for line in md.splitlines():
        if fence == 0:
            m = re.fullmatch(r"(`{3,})\w*", line)
            fence = len(m.group(1)) if m else 0
        elif line == "`" * fence:
            fence = 0
        elif re.match(r"## \d\. ", line):
            return False
    return fence == 0


def _prose(md: str) -> str:
    """The Markdown with fenced blocks and code spans (CommonMark: equal backtick runs) removed."""
    out, fence = [], 0
    for line in md.splitlines():
        if fence == 0 and (m := re.fullmatch(r"(`{3,})\w*", line)):
            fence = len(m.group(1))
        elif fence and line == "`" * fence:
            fence = 0
        elif not fence:
            out.append(re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", line))
    return "\n".join(out)


def test_hostile_strings_from_an_image_are_escaped(reported):
    d = _poison(reported["json"])
    page = report_html.render(d, charts=False)
    parsed = _Tags()
    parsed.feed(page)
    assert parsed.tags <= {"html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "h3", "p", "a", "b", "ul",
                           "li", "table", "tr", "th", "td", "code", "pre", "span", "div", "img"}  # fmt: skip
    assert not any(a.startswith("on") for a in parsed.attrs) and "<script" not in page.lower()
    assert page.count("&lt;script&gt;") > 20  # the hostile text is shown, as text
    md = report_md.render(d)
    prose = _prose(md)  # inside code spans and fences text is literal in Markdown, so look outside them
    assert "<script" not in prose and "<img" not in prose and "&lt;script&gt;" in prose
    assert not re.search(r"(?<!\\)\]\(javascript:", prose)  # links cannot form: brackets are escaped
    assert _fences_balanced(md)
    for block in re.split(r"\n\n", md):  # tables keep their shape: unescaped pipes per row = the header's
        rows = [r for r in block.splitlines() if r.startswith("| ")]
        if rows:
            counts = {len(re.findall(r"(?<!\\)\|", r)) for r in rows}
            assert len(counts) == 1, rows[:3]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_html_renders_in_headless_chromium(reported, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    import matplotlib.image as mpimg
    import numpy as np

    page = tmp_path / "report.html"
    page.write_text(reported["html"])
    shot = tmp_path / "shot.png"
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2400", f"--screenshot={shot}",
            page.as_uri()]  # fmt: skip
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), r.stderr[-2000:]
    img = mpimg.imread(str(shot))[:, :, :3]
    assert img.shape[:2] == (2400, 1200)
    pixels = (img * 255).round().astype(np.int16)
    dark = (pixels.max(axis=2) < 80).mean()  # text
    assert 0.003 < dark < 0.3, dark
    heading_green = (np.abs(pixels - np.array([58, 111, 79])).max(axis=2) <= 6).sum()  # h2 rules and the UR bars
    assert heading_green > 2000, heading_green
    left, right = pixels[:, :40].std(), pixels[:, 100:1000].std()  # page margin is plain, content is not
    assert left < 5 < right
