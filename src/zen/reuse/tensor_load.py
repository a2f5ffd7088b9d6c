"""A case's safetensors file as torch tensors, whatever names the image gave its tensors.

Why not `safetensors.torch.load_file` alone: a state_dict key read from an image may hold a lone
surrogate (a CPython str allows one; a module can register a buffer under such a name), and zen writes
it as its JSON escape (`\\udc80`), which Python's json reads back losslessly. The Rust loader's JSON
parser refuses that escape and the whole file with it. Such a file is loaded with its header rewritten:
every key that is not valid UTF-8 gets a placeholder name for the Rust loader and its own name back
afterwards; the tensor bytes are the file's, unchanged. This path reads the file into memory at once
(twice its size at the peak), which only such a file pays.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from zen.runtime.errors import ZenError


def load_safetensors(path: Path) -> dict:
    """name -> torch tensor for every tensor of `path` (`{}` when there is no such file)."""
    path = Path(path)
    if not path.is_file():
        return {}
    from safetensors.torch import load, load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for a bad file
        first = exc
    renamed = _renamed(path)
    if renamed is None:
        raise ZenError(f"{path} is not a readable safetensors file: {first}", "recover the case again") from None
    data, names = renamed
    try:
        loaded = load(data)
    except Exception as exc:  # noqa: BLE001
        raise ZenError(f"{path} is not a readable safetensors file: {exc}", "recover the case again") from None
    return {names.get(k, k): v for k, v in loaded.items()}


def _renamed(path: Path) -> tuple[bytes, dict[str, str]] | None:
    """(the file with a header the Rust loader reads, placeholder -> real name), or None when renaming
    would not help (the header is not a well-formed one, or every key is already valid UTF-8)."""
    from zen.represent.tensorfile import TensorFileError, read_header

    with open(path, "rb") as fh:
        try:
            entries, _meta, base = read_header(path, fh, os.fstat(fh.fileno()).st_size)
        except TensorFileError:
            return None
        names: dict[str, str] = {}
        fixed: dict[str, object] = {}
        for i, (key, e) in enumerate(entries.items()):
            name = key
            if not _utf8(key):
                name = f"zen-unencodable-name-{i}"
                while name in entries or name in fixed:
                    name += "_"
                names[name] = key
            fixed[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [e["start"], e["end"]]}
        if not names:
            return None
        blob = json.dumps(fixed, separators=(",", ":")).encode("ascii")  # __metadata__ left out: not tensors
        blob += b" " * (-len(blob) % 8)
        fh.seek(base)
        return struct.pack("<Q", len(blob)) + blob + fh.read(), names


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
