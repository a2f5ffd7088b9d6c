"""SHA-256 for two digests of the same bytes: a tensor's own and its file's.

Every byte of a case's tensor files is hashed twice where it is written (`represent.safetensors_io`: the tensor's
sha256 for mr.json, the file's for the manifest) and again where a case is checked (`represent.tensorfile`). The
digests stay the plain sha256 an investigator gets from `sha256sum` or `hashlib`; what changes is how they are
computed. One SHA-256 stream is a chain of dependent rounds, so on a CPU with the SHA instructions hashlib's two
streams cost two chains, while the compiled core's `update_pair` interleaves the rounds of both and takes about
the time of one (GPT-2's 500 MB of tensors: 0.98 s of CPU → 0.52 s on this project's machine).

`sha256()` and `update_both()` are the compiled pair where the core is built, the CPU has the SHA extensions and
the pair agrees with hashlib on the checks below (run once, at import: a few hundred bytes); hashlib otherwise,
and `why` says which.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

from zen import native

# lengths either side of SHA-256's block and padding boundaries, and two streams out of step by these prefixes
_CHECK_LENGTHS = (0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 1000, 4099)
_CHECK_PREFIXES = ((0, 0), (3, 61), (64, 9), (72, 0))


def _hashlib_both(a, b, data) -> None:
    a.update(data)
    b.update(data)


def _agrees(core) -> bool:
    """The compiled pair gives hashlib's digests on every boundary case, one stream and two."""
    data = bytes(range(256)) * 17
    for n in _CHECK_LENGTHS:
        if core.Sha256(data[:n]).hexdigest() != hashlib.sha256(data[:n]).hexdigest():
            return False
    for pa, pb in _CHECK_PREFIXES:
        a, b = core.Sha256(data[:pa]), core.Sha256(data[1 : 1 + pb])
        ra, rb = hashlib.sha256(data[:pa]), hashlib.sha256(data[1 : 1 + pb])
        for n in _CHECK_LENGTHS:
            core.update_pair(a, b, data[7 : 7 + n])
            _hashlib_both(ra, rb, data[7 : 7 + n])
        if (a.digest(), b.digest()) != (ra.digest(), rb.digest()):
            return False
    return True


def _choose() -> tuple[Callable, Callable, str]:
    core = native.core
    if core is None:
        return hashlib.sha256, _hashlib_both, "hashlib (the compiled core is not loaded)"
    if not hasattr(core, "update_pair"):  # a core built before the pair existed
        return hashlib.sha256, _hashlib_both, "hashlib (the compiled core predates the pair; bash install.sh rebuilds it)"
    if not core.sha256_ni:
        return hashlib.sha256, _hashlib_both, "hashlib (this CPU has no SHA instructions)"
    if not _agrees(core):  # never expected; a digest that could differ from sha256sum's must not be recorded
        return hashlib.sha256, _hashlib_both, "hashlib (the compiled pair disagreed with it at its check)"
    return core.Sha256, core.update_pair, "compiled pair (SHA instructions)"


# sha256(data=b"") -> a hasher; update_both(a, b, data): a.update(data); b.update(data), for two hashers of sha256()
sha256, update_both, why = _choose()


class Meanwhile:
    """The sha256 of bytes in memory, computed by a thread while the caller goes on (hashlib releases the GIL on
    buffers of more than 2 KiB). For a case file zen has just written from those bytes: GPT-2's pr.json (22.6 MB)
    was read back and hashed in recovery's last single-core phase, 0.036 s of it.

    With `path`, another thread also writes the bytes there (a write releases the GIL too): on this project's
    2-core VM a 22.6 MB file took 0.08-0.11 s to write into fresh page-cache pages, the analysis then waiting on
    it instead of going on to its last steps. `hexdigest()` waits for both and raises what the write raised;
    `join()` only waits (for a caller that is failing anyway and must not leave a file being written behind)."""

    def __init__(self, data: bytes, path: Path | None = None) -> None:
        self._h = hashlib.sha256()
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._h.update, args=(data,), name="zen-file-sha256", daemon=True)]
        if path is not None:
            self._threads.append(threading.Thread(target=self._write, args=(path, data), name="zen-file-write",
                                                  daemon=True))  # fmt: skip
        for t in self._threads:
            t.start()

    def _write(self, path: Path, data: bytes) -> None:
        try:
            path.write_bytes(data)
        except BaseException as exc:  # raised in the caller's thread, by hexdigest()
            self._error = exc

    def join(self) -> None:
        for t in self._threads:
            t.join()

    def hexdigest(self) -> str:
        self.join()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()
