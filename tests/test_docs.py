"""The README says what is true (issue 51): the commands `zen --help` lists, the caches the code makes under
~/.cache/zen, the Python versions install.sh names, and the test command `.ci/run` runs. Each check reads the
source of truth (the CLI, the code, the scripts) rather than a list kept beside the README, so a new command or
cache that the README does not mention fails here, not in a newcomer's first hour."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import zen

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_command_in_help_is_in_the_readme():
    listed = re.findall(r"^│ (\w[\w-]*)\s", zen("--help").stdout, flags=re.M)
    assert len(listed) > 15, listed
    missing = [c for c in listed if f"`zen {c}" not in README]
    assert not missing, f"commands in `zen --help` the README's table does not name: {missing}"


def _cache_names() -> set[str]:
    """Directories and files the code, tools and scripts put under the user cache dir's zen/."""
    names: set[str] = set()
    for p in [*ROOT.glob("src/**/*.py"), *ROOT.glob("tools/**/*.py"), *ROOT.glob("tools/*.sh"), *ROOT.glob("bench/*.py"),
              *ROOT.glob("tests/*.py"), ROOT / "install.sh", ROOT / ".ci" / "run"]:  # fmt: skip
        text = p.read_text(errors="replace")
        if "XDG_DATA_HOME" in text and ".cache" not in text:
            continue  # ~/.local/share (the library, profiles): data, not a cache
        names |= set(re.findall(r'\.cache\}?/zen/([A-Za-z][\w.-]*?)(?=[/"\s.)]|$)', text))
        for line in text.splitlines():
            if "cache" in line.lower() or "CACHE" in line:
                names |= {m for m in re.findall(r'"zen"\s*/\s*"([\w.-]+)"', line) if m not in ("library.sqlite", "profiles")}
    return names


def test_every_cache_is_in_the_readme():
    names = _cache_names()
    assert {"guest", "pythons", "tf-venv", "kernels", "zoo-site", "symbols"} <= names, names  # the scan still works
    missing = sorted(n for n in names if f"{n}/" not in README and f"zen/{n}" not in README)
    assert not missing, f"caches under ~/.cache/zen the README does not list: {missing}"


def test_install_and_readme_name_the_same_tested_pythons():
    said = re.search(r"\(tested on ([^)]*)\)", (ROOT / "install.sh").read_text())
    assert said, "install.sh names the Python versions it was tested on"
    assert f"tested on {said.group(1)}" in " ".join(README.split()), f"README does not say 'tested on {said.group(1)}'"


def test_ci_runs_the_readme_test_command():
    command = re.search(r"^\s*(\.venv/bin/python -m pytest[^\n`]*)", (ROOT / ".ci" / "run").read_text(), flags=re.M)
    assert command and command.group(1).strip() in README, "the README gives the test command .ci/run runs"
