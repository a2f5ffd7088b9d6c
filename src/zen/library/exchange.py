"""Export and import: a library's entries as one JSON document, to share or to move a library.

An export names each entry with its metadata, MR, PR, UR and rebuilt code (base64 of the
compressed code.marshal's contents). It is the format `zen library export` writes, a `zen serve`
returns from `/export` and accepts at `/import`, so an export from an investigator's SQLite file
imports into a team's PostgreSQL library unchanged, and back.

An import comes from elsewhere: every model is checked against the MR/PR/UR schema (the case-file
readers of zen.represent.schema, bounded) before anything is added, and then all are added, each
in its own write transaction.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zen.library.errors import LibraryError
from zen.represent import textio
from zen.represent.mr import ModelMR
from zen.represent.pr import ProgrammaticRepresentation, UnifiedRepresentation

EXPORT_KIND = "zen-library-export"


def export_data(lib: Any, names: Iterable[str] | None = None) -> dict[str, Any]:
    items = [e.export() for e in lib.entries(names)]
    if names is not None:
        missing = sorted(set(names) - {i["name"] for i in items})
        if missing:
            from zen.library.errors import NotFound

            raise NotFound(f"no model named {missing[0]!r} in {lib.path}", "`zen library list` shows the names")
    for item in items:
        code = lib.code(item["name"])
        item["code_marshal"] = base64.b64encode(code).decode() if code else None
    return {"format": 1, "kind": EXPORT_KIND, "models": items}


def export_file(lib: Any, path: Path, names: Iterable[str] | None = None) -> int:
    data = export_data(lib, None if names is None else list(names))
    textio.write_json(path, data)
    return len(data["models"])


def read_export(path: Path) -> Any:
    """An export file parsed with bounded nesting (it must be a regular file)."""
    from zen.represent.schema import MAX_BLOB_STRING, CaseFileError, parse_json

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise LibraryError(f"{path} is not a regular file")
    except OSError as exc:
        raise LibraryError(f"cannot read library export {path}: {exc.strerror}") from None
    try:
        return parse_json(Path(path), max_string=MAX_BLOB_STRING)
    except CaseFileError as exc:
        raise LibraryError(f"cannot read library export {path}: {exc}") from None


def checked_models(data: Any, where: str) -> list[tuple]:
    """Every model of a parsed export, checked: (name, mr, pr, ur, meta, notes, code)."""
    from zen.represent.schema import CaseFileError, check_depth, check_record

    if type(data) is not dict or data.get("kind") != EXPORT_KIND or data.get("format") != 1:
        raise LibraryError(f"{where} is not a zen library export")
    models = data.get("models")
    if type(models) is not list:
        raise LibraryError(f"{where}: `models` is not a list")
    checked = []
    for i, item in enumerate(models):
        at = f"{Path(where).name}: models[{i}]"
        try:
            if type(item) is not dict or type(item.get("name")) is not str or not item["name"]:
                raise CaseFileError(f"{at}: expected an object with a `name`")
            for key, cls in (("mr", ModelMR), ("pr", ProgrammaticRepresentation), ("ur", UnifiedRepresentation)):
                check_record(item.get(key), cls, f"{at}.{key}", ("kind", "format"))
                check_depth(item[key], f"{at}.{key}")  # only code_marshal may be long: the records keep the case limit
            mr, pr, ur = (ModelMR.from_json(item["mr"]), ProgrammaticRepresentation.from_json(item["pr"]),
                          UnifiedRepresentation.from_json(item["ur"]))  # fmt: skip
            blob = item.get("code_marshal")
            code = base64.b64decode(blob, validate=True) if isinstance(blob, str) and blob else None
        except (CaseFileError, ValueError, TypeError, KeyError, binascii.Error) as exc:
            raise LibraryError(f"{where} is not a valid library export: {exc}") from None
        meta = {k: item.get(k) if isinstance(item.get(k), str) else None for k in ("source_sha256", "python", "torch", "created")}
        checked.append((item["name"], mr, pr, ur, meta, str(item.get("notes") or ""), code))
    return checked


def import_data(lib: Any, data: Any, where: str, *, replace: bool = False, who: str | None = None) -> list[str]:
    """Add the models of a parsed export (all checked first, then added)."""
    names = []
    for name, mr, pr, ur, meta, notes, code in checked_models(data, where):
        lib.add(name, mr, pr, ur, source_sha256=meta["source_sha256"], python=meta["python"], torch=meta["torch"],
                notes=notes, replace=replace, created=meta["created"], code=code, who=who, action="import")  # fmt: skip
        names.append(name)
    return names


def import_file(lib: Any, path: Path, *, replace: bool = False, who: str | None = None) -> list[str]:
    return import_data(lib, read_export(path), str(path), replace=replace, who=who)
