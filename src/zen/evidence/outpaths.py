"""Output paths: a command writes where it is told, into a directory that already exists.

`zen report -o /nonexistent-dir/r.html` used to create `/nonexistent-dir` at the filesystem root: a typo became a
new directory in an unexpected place, on an investigator's machine. Every command that writes checks the parent
of its output first (before any work), and a missing one is a clear error with the command to create it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from zen.runtime.errors import ZenError


def require_parent(path: Path | str | None, what: str = "the output") -> Path | None:
    """`path` unchanged when its parent directory exists (or path is None); else a ZenError (exit 2)."""
    if path is None:
        return None
    p = Path(path)
    parent = p.absolute().parent
    if not parent.is_dir():
        kind = "is not a directory" if parent.exists() else "does not exist"
        raise ZenError(f"the directory for {what} ({p}) {kind}: {parent}",
                       f"create it first: mkdir -p {shlex.quote(str(parent))}")  # fmt: skip
    return p
