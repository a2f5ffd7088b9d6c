"""Evidence digests computed once per evidence file, and reused while the file is unchanged.

Investigators check zen's sha256 with `sha256sum`, so the digest of an image stays the plain sha256 of its bytes;
what changes is how often it is computed. A digest zen computed (while acquiring, or while recovering) is kept in
zen's cache keyed by the file's identity and state: device, inode, size, mtime_ns and ctime_ns. Any write to the
file changes its mtime or ctime (ctime cannot be set back by a user), so a file whose stat changed is hashed
again and never trusted; `--rehash` forces a fresh digest and `zen verify-evidence IMAGE` recomputes and compares.
The manifest says which: "computed in this run" or "computed on DATE by zen VERSION, file unchanged since".

The same holds for the tensor files of a case (weights.safetensors: GBs for a large model). `zen recover` records
the file's sha256 and every tensor's, computed from the buffers it wrote, for the file as it left the writer; a later
command that checks the case against its manifest and mr.json takes them from here while the file is unchanged
instead of reading and hashing it twice again. `zen verify-case` and `zen sign` always recompute.

Stdlib only (sqlite3): the store is one small database under the user cache directory; a broken or unwritable
cache only costs a recomputation, never an error.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

_SCHEMA = ("CREATE TABLE IF NOT EXISTS digests (dev INTEGER, ino INTEGER, size INTEGER, mtime_ns INTEGER, "
           "ctime_ns INTEGER, path TEXT, sha256 TEXT, computed_at TEXT, tool TEXT, "
           "PRIMARY KEY (dev, ino, size, mtime_ns, ctime_ns))")  # fmt: skip
_TENSOR_SCHEMA = ("CREATE TABLE IF NOT EXISTS tensor_files (dev INTEGER, ino INTEGER, size INTEGER, mtime_ns INTEGER, "
                  "ctime_ns INTEGER, path TEXT, sha256 TEXT, tensors TEXT, computed_at TEXT, tool TEXT, "
                  "PRIMARY KEY (dev, ino, size, mtime_ns, ctime_ns))")  # fmt: skip
_KEY = "dev=? AND ino=? AND size=? AND mtime_ns=? AND ctime_ns=?"


def file_sha256(path: Path | str) -> str:
    """The sha256 of a file's bytes, read sequentially in large blocks (what `sha256sum` prints)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(16 << 20)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def cache_file() -> Path:
    base = os.environ.get("ZEN_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "zen")
    return Path(base) / "digests.sqlite"


def stat_key(path: Path | str) -> tuple[int, int, int, int, int] | None:
    """(device, inode, size, mtime_ns, ctime_ns) of a regular file, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _connect() -> sqlite3.Connection | None:
    try:
        f = cache_file()
        f.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(str(f), timeout=5)
        con.execute(_SCHEMA)
        con.execute(_TENSOR_SCHEMA)
        return con
    except (OSError, sqlite3.Error):
        return None


def _text(path: Path | str) -> str:
    """The file's absolute path as UTF-8 text (SQLite stores no other): a name that is not valid UTF-8 (evidence
    copied from a seized disk may have one) keeps its bytes as escapes. The path is a note; the stat is the key."""
    return os.fsencode(Path(path).resolve()).decode("utf-8", "backslashreplace")


def lookup(path: Path | str) -> dict | None:
    """The digest recorded for this file in its present state, with its provenance; None if there is none."""
    key = stat_key(path)
    con = _connect() if key is not None else None
    if con is None:
        return None
    try:
        with con:
            row = con.execute("SELECT sha256, computed_at, tool, path FROM digests WHERE dev=? AND ino=? AND size=? "
                              "AND mtime_ns=? AND ctime_ns=?", key).fetchone()  # fmt: skip
    except sqlite3.Error:
        return None
    finally:
        con.close()
    if row is None:
        return None
    return {"sha256": row[0], "how": f"computed on {row[1]} by {row[2]}, file unchanged since", "computed_at": row[1],
            "by": row[2], "stat": dict(zip(("device", "inode", "size", "mtime_ns", "ctime_ns"), key))}  # fmt: skip


def remember(path: Path | str, sha256: str, key: tuple | None) -> None:
    """Record a digest computed while the file had stat `key` (taken before hashing): nothing is recorded if the
    file changed meanwhile."""
    from zen import __version__

    if key is None or stat_key(path) != key:
        return
    con = _connect()
    if con is None:
        return
    try:
        with con:
            con.execute("INSERT OR REPLACE INTO digests VALUES (?,?,?,?,?,?,?,?,?)",
                        (*key, _text(path), sha256, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         f"zen {__version__}"))  # fmt: skip
    except sqlite3.Error:
        pass
    finally:
        con.close()


def lookup_tensor_file(key: tuple | None) -> dict | None:
    """What `remember_tensor_file` recorded for a tensor file with stat `key` (`stat_key`, or the fstat of the open
    file): {"sha256", "tensors": name -> sha256, "how", ...}; None if nothing is recorded for that state."""
    con = _connect() if key is not None else None
    if con is None:
        return None
    try:
        with con:
            row = con.execute(f"SELECT sha256, tensors, computed_at, tool FROM tensor_files WHERE {_KEY}", key).fetchone()
    except sqlite3.Error:
        return None
    finally:
        con.close()
    if row is None:
        return None
    import json

    try:
        tensors = json.loads(row[1])
    except ValueError:
        return None
    if type(tensors) is not dict or not all(type(v) is str for v in tensors.values()):
        return None
    return {"sha256": row[0], "tensors": tensors, "how": f"computed on {row[2]} by {row[3]}, file unchanged since",
            "computed_at": row[2], "by": row[3]}  # fmt: skip


def remember_tensor_file(path: Path | str, sha256: str, tensors: dict[str, str], key: tuple | None) -> None:
    """Record a tensor file's sha256 and each tensor's (name -> sha256), computed while the file had stat `key`:
    nothing is recorded if the file has changed since."""
    import json

    from zen import __version__

    if key is None or stat_key(path) != key:
        return
    con = _connect()
    if con is None:
        return
    try:
        with con:
            # ensure_ascii: a tensor name read from an image may hold a lone surrogate (its escape is stored)
            con.execute("INSERT OR REPLACE INTO tensor_files VALUES (?,?,?,?,?,?,?,?,?,?)",
                        (*key, _text(path), sha256, json.dumps(tensors, sort_keys=True),
                         time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), f"zen {__version__}"))  # fmt: skip
    except sqlite3.Error:
        pass
    finally:
        con.close()
