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

Reuse rests on the ctime: only where the file system keeps one that the kernel sets on every change and no user
can set back (`CTIME_KEPT`: ext4, xfs, btrfs, tmpfs, ...). FAT and exFAT store no ctime (Linux derives it from the
mtime, which `touch -d` sets back), NTFS through FUSE reports what the driver chooses: evidence on such a drive, a
common way to carry it, is hashed by every command, as is a file whose file system cannot be told.

Stdlib only (sqlite3): the store is one small database under the user cache directory; a broken or unwritable
cache only costs a recomputation, never an error.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path

_SCHEMA = ("CREATE TABLE IF NOT EXISTS digests (dev INTEGER, ino INTEGER, size INTEGER, mtime_ns INTEGER, "
           "ctime_ns INTEGER, path TEXT, sha256 TEXT, computed_at TEXT, tool TEXT, "
           "PRIMARY KEY (dev, ino, size, mtime_ns, ctime_ns))")  # fmt: skip
_TENSOR_SCHEMA = ("CREATE TABLE IF NOT EXISTS tensor_files (dev INTEGER, ino INTEGER, size INTEGER, mtime_ns INTEGER, "
                  "ctime_ns INTEGER, path TEXT, sha256 TEXT, tensors TEXT, computed_at TEXT, tool TEXT, "
                  "PRIMARY KEY (dev, ino, size, mtime_ns, ctime_ns))")  # fmt: skip
# Checks that are a pure function of content (a parsed manifest against its JSON Schema), by the sha256 of the
# content's canonical JSON: no stat and no ctime are involved, so they hold on any file system
_CHECKED_SCHEMA = ("CREATE TABLE IF NOT EXISTS checked (what TEXT, sha256 TEXT, computed_at TEXT, tool TEXT, "
                   "PRIMARY KEY (what, sha256))")  # fmt: skip
_KEY = "dev=? AND ino=? AND size=? AND mtime_ns=? AND ctime_ns=?"


HASH_BLOCK = 16 << 20  # bytes read per call: few calls, each of which gives up the GIL and must take it back


def file_sha256(path: Path | str) -> str:
    """The sha256 of a file's bytes, read sequentially in large blocks (what `sha256sum` prints).

    The buffer is an anonymous map no larger than the file: its pages are zeroed by the kernel as the first read
    fills them, with the GIL released. A 16 MB bytearray per file was zero-filled by Python with the GIL held
    (~8,000 page faults of `zen attribute`'s case check, taken from the thread parsing pr.json meanwhile), however
    small the file."""
    import hashlib
    import mmap
    import stat

    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        st = os.fstat(fh.fileno())
        size = max(1, min(HASH_BLOCK, st.st_size)) if stat.S_ISREG(st.st_mode) else HASH_BLOCK
        with mmap.mmap(-1, size) as buf:
            view = memoryview(buf)
            try:
                while n := fh.readinto(view):
                    h.update(view[:n])
            finally:
                view.release()  # (the map cannot be closed while a view of it exists)
    return h.hexdigest()


# File systems whose inodes carry a ctime the kernel updates on every change of data or metadata, which no user
# can set (utime sets atime and mtime only): a changed file always has a new stat key
CTIME_KEPT = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "zfs", "jfs", "nilfs2", "reiserfs",
                        "tmpfs", "ramfs", "overlay", "nfs", "nfs4"})  # fmt: skip


def file_system(path: Path | str) -> str | None:
    """The type of the file system holding `path`, or None where it cannot be told."""
    try:
        st = os.stat(path)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    return mount_type(lines, f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", os.path.realpath(path))


def mount_type(mountinfo: list[str], dev: str, real: str) -> str | None:
    """From the lines of /proc/self/mountinfo: the type of the mount of device `dev` ("major:minor"), else of the
    longest mount point above the path `real` (an overlay's files report the device beneath it)."""
    best, best_len = None, -1
    for line in mountinfo:
        f = line.split()
        sep = f.index("-", 6) if "-" in f[6:] else -1
        if sep < 0 or len(f) <= sep + 1:
            continue
        if f[2] == dev:
            return f[sep + 1]
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f[4])  # a space is written \040
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > best_len:
            best, best_len = f[sep + 1], len(point)
    return best


def reusable(path: Path | str) -> bool:
    """Whether a digest recorded under this file's stat may stand for its bytes (see the module's docstring)."""
    return file_system(path) in CTIME_KEPT


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
        con.execute(_CHECKED_SCHEMA)
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
    row = _fetch("digests", "sha256, computed_at, tool", path, key)
    if row is None or key is None:
        return None
    return {"sha256": row[0], "how": f"computed on {row[1]} by {row[2]}, file unchanged since", "computed_at": row[1],
            "by": row[2], "stat": dict(zip(("device", "inode", "size", "mtime_ns", "ctime_ns"), key))}  # fmt: skip


def remember(path: Path | str, sha256: str, key: tuple | None) -> None:
    """Record a digest computed while the file had stat `key` (taken before hashing): nothing is recorded if the
    file changed meanwhile."""
    _store("digests", path, key, (sha256,))


def _store(table: str, path: Path | str, key: tuple | None, values: tuple) -> None:
    """One row of `table`: the stat key, the path (a note), `values`, when and by which zen; nothing where the file
    changed since `key` was taken or its file system keeps no trustworthy ctime."""
    from zen import __version__

    if key is None or stat_key(path) != key or not reusable(path):
        return
    con = _connect()
    if con is None:
        return
    row = (*key, _text(path), *values, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), f"zen {__version__}")
    try:
        with con:
            con.execute(f"INSERT OR REPLACE INTO {table} VALUES ({','.join('?' * len(row))})", row)
    except sqlite3.Error:
        pass
    finally:
        con.close()


def _fetch(table: str, columns: str, path: Path | str, key: tuple | None) -> tuple | None:
    """The row of `table` recorded for this file state, or None."""
    con = _connect() if key is not None and reusable(path) else None
    if con is None:
        return None
    try:
        with con:
            return con.execute(f"SELECT {columns} FROM {table} WHERE {_KEY}", key).fetchone()
    except sqlite3.Error:
        return None
    finally:
        con.close()


def lookup_tensor_file(path: Path | str, key: tuple | None) -> dict | None:
    """What `remember_tensor_file` recorded for the tensor file `path` with stat `key` (`stat_key`, or the fstat of
    the open file): {"sha256", "tensors": name -> sha256, "how", ...}; None if nothing is recorded for that state."""
    import json

    row = _fetch("tensor_files", "sha256, tensors, computed_at, tool", path, key)
    if row is None:
        return None
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

    # ensure_ascii (json's default): a tensor name read from an image may hold a lone surrogate (its escape is stored)
    _store("tensor_files", path, key, (sha256, json.dumps(tensors, sort_keys=True)))


def passed(what: str, sha256: str) -> bool:
    """Whether content with this sha256 passed the check `what` (a name that changes with the check's rules)."""
    con = _connect()
    if con is None:
        return False
    try:
        with con:
            return con.execute("SELECT 1 FROM checked WHERE what=? AND sha256=?", (what, sha256)).fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        con.close()


def remember_passed(what: str, sha256: str) -> None:
    """Record that content with this sha256 passed the check `what`."""
    from zen import __version__

    con = _connect()
    if con is None:
        return
    try:
        with con:
            con.execute("INSERT OR REPLACE INTO checked VALUES (?,?,?,?)",
                        (what, sha256, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), f"zen {__version__}"))  # fmt: skip
    except sqlite3.Error:
        pass
    finally:
        con.close()
