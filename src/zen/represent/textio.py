"""Writing text that came from an image, losslessly.

Strings read from an image (file names, module names, attribute names) may hold bytes that are
not valid UTF-8; zen carries them as lone surrogates (Python's `surrogateescape`). A strict UTF-8
writer crashes on them. Written with `backslashreplace`, a lone surrogate inside JSON text becomes
its own JSON escape (`\\udcff`), which `json.loads` reads back as the same code point: the file is
valid UTF-8 and valid JSON, and nothing is lost. In Markdown or plain text the escape is shown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_text(path: Path | str, text: str) -> None:
    """Write `text` as UTF-8, escaping lone surrogates instead of failing on them."""
    Path(path).write_bytes(text.encode("utf-8", "backslashreplace"))


def write_json(path: Path | str, data: Any, **kwargs: Any) -> None:
    """json.dumps (non-ASCII kept readable) written with `write_text`, newline-terminated."""
    kwargs.setdefault("ensure_ascii", False)
    write_text(path, json.dumps(data, **kwargs) + "\n")
