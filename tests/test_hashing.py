"""Two sha256 of the same bytes in one pass (zen.evidence.hashing, issue 50): always hashlib's digests.

The compiled pair (`zen.native._core.Sha256`, `update_pair`) is checked against hashlib on every length around the
block and padding boundaries, on streams out of step by every prefix length, on random splits, and where it is used:
a case's tensor file hashed in blocks that cut its header and its entries anywhere.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

from zen import native
from zen.evidence import hashing
from zen.represent import tensorfile

core = native.core
needs_pair = pytest.mark.skipif(core is None or not getattr(core, "sha256_ni", False),
                                reason=f"no compiled pair here ({hashing.why})")  # fmt: skip


def test_the_pair_is_used_where_the_cpu_has_sha_instructions():
    """A build that silently lost the pair would leave the tests below comparing hashlib with itself."""
    if core is None or not core.sha256_ni:
        pytest.skip(hashing.why)
    assert hashing.sha256 is core.Sha256 and hashing.update_both is core.update_pair
    assert hashing.why == "compiled pair (SHA instructions)"


@needs_pair
def test_one_stream_equals_hashlib_at_every_length_to_300_and_across_blocks():
    data = os.urandom(70_000)
    for n in [*range(301), 4095, 4096, 65_535, 65_536, 70_000]:
        assert core.Sha256(data[:n]).hexdigest() == hashlib.sha256(data[:n]).hexdigest(), n
        h = core.Sha256()
        for i in range(0, n, 37):  # fed in pieces that never line up with a block
            h.update(data[i : min(i + 37, n)])
        assert h.digest() == hashlib.sha256(data[:n]).digest(), n


@needs_pair
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_streams_out_of_step_equal_hashlib_on_random_splits(seed):
    r = random.Random(seed)
    for _ in range(400):
        pa, pb = os.urandom(r.randrange(0, 140)), os.urandom(r.randrange(0, 140))
        a, b, ra, rb = core.Sha256(pa), core.Sha256(pb), hashlib.sha256(pa), hashlib.sha256(pb)
        for _ in range(r.randrange(1, 7)):
            d = os.urandom(r.choice([r.randrange(0, 130), r.randrange(0, 9000)]))
            core.update_pair(a, b, memoryview(d))  # any contiguous buffer, as the writer's slices are
            ra.update(d)
            rb.update(d)
            if r.random() < 0.3:  # a digest midway leaves the stream as it was
                assert a.hexdigest() == ra.hexdigest()
        assert (a.hexdigest(), b.hexdigest()) == (ra.hexdigest(), rb.hexdigest())


@needs_pair
def test_copy_is_independent_and_one_object_twice_absorbs_twice():
    a = core.Sha256(b"abc")
    c = a.copy()
    c.update(b"def")
    assert a.hexdigest() == hashlib.sha256(b"abc").hexdigest()
    assert c.hexdigest() == hashlib.sha256(b"abcdef").hexdigest()
    assert (a.name, a.digest_size) == ("sha256", 32)
    core.update_pair(a, a, b"x" * 100)  # as two update() calls
    assert a.hexdigest() == hashlib.sha256(b"abc" + b"x" * 200).hexdigest()
    with pytest.raises(TypeError):
        core.update_pair(a, hashlib.sha256(), b"")  # only two of the pair's own hashers
    with pytest.raises(TypeError):
        a.update("text")  # bytes-like only, as hashlib


def test_a_pair_that_disagrees_with_hashlib_is_not_used(monkeypatch):
    """The check at import is what keeps a wrong digest out of a case: a core whose hasher is not sha256 is refused."""

    class Wrong:
        sha256_ni = True

        class Sha256:
            def __init__(self, data=b""):
                self.h = hashlib.sha256(data + b"!")

            def update(self, data):
                self.h.update(data)

            def hexdigest(self):
                return self.h.hexdigest()

            def digest(self):
                return self.h.digest()

        @staticmethod
        def update_pair(a, b, data):
            a.update(data)
            b.update(data)

    monkeypatch.setattr(native, "core", Wrong)
    sha, both, why = hashing._choose()
    assert sha is hashlib.sha256 and "disagreed" in why
    Wrong.sha256_ni = False
    assert "no SHA instructions" in hashing._choose()[2]
    monkeypatch.setattr(native, "core", type("Old", (), {"sha256_ni": True}))  # a core built before the pair
    assert "predates the pair" in hashing._choose()[2]
    monkeypatch.setattr(native, "core", None)
    assert hashing._choose()[0] is hashlib.sha256


def test_zen_pure_hashes_with_hashlib():
    out = subprocess.run([sys.executable, "-c", "from zen.evidence import hashing; print(hashing.why)"],
                         env={**os.environ, "ZEN_PURE": "1"}, capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "hashlib (the compiled core is not loaded)"


@pytest.mark.parametrize("block", [7, 64, 100, 4096, 16 << 20])
def test_a_tensor_file_read_in_any_blocks_gives_sha256_of_the_file_and_of_each_entry(tmp_path, monkeypatch, block):
    """read_tensor_file hashes the file and its entries in one pass: blocks that cut the header and the entries
    anywhere (7 bytes: every entry spans blocks; 16 MB: one block) give the plain sha256 of each."""
    r = np.random.default_rng(block)
    tensors = {
        f"t{i}": r.standard_normal(n).astype(dt)
        for i, (n, dt) in enumerate([(0, np.float32), (1, np.float16), (33, np.float32), (1000, np.int8), (517, np.float64)])
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    monkeypatch.setattr(tensorfile, "BLOCK", block)
    tf = tensorfile.read_tensor_file(path, reuse=False)
    raw = path.read_bytes()
    assert tf.sha256 == hashlib.sha256(raw).hexdigest()
    base = 8 + int.from_bytes(raw[:8], "little")
    for name, e in tf.entries.items():
        assert tf.digests[name] == hashlib.sha256(raw[base + e["start"] : base + e["end"]]).hexdigest(), name
    assert tf.digests["t1"] == hashlib.sha256(tensors["t1"].tobytes()).hexdigest()


@needs_pair
def test_a_hasher_busy_in_another_thread_is_refused_not_corrupted():
    """update releases the interpreter lock for large buffers: a second thread's update, digest or copy of the same
    hasher meanwhile is refused with a clear error, and the first thread's digest is still sha256 of its bytes."""
    import threading

    big = os.urandom(128 << 20)
    refused = []
    for _ in range(10):  # until the second call lands while the first hashes (~0.1 s of work; any machine load)
        h, started = core.Sha256(), threading.Event()

        def work(h=h, started=started):
            started.set()
            h.update(big)

        t = threading.Thread(target=work)
        t.start()
        started.wait()
        time.sleep(0.01)
        calls = (lambda h=h: h.update(b"x"), h.hexdigest, h.copy, lambda h=h: core.update_pair(core.Sha256(), h, b"x"))
        for call in calls:
            try:
                call()
            except RuntimeError as exc:
                refused.append(str(exc))
        t.join()
        if refused:
            assert h.hexdigest() == hashlib.sha256(big).hexdigest()
            break
    assert refused and all("another thread" in m or "two threads" in m for m in refused)


@pytest.mark.parametrize("n", [0, 1, 2047, 2048, 1 << 20, (1 << 22) + 3])
def test_meanwhile_is_the_sha256_of_the_bytes(n):
    """A case file's digest taken from the bytes written, in a thread (`hashing.Meanwhile`), is plain sha256."""
    from zen.evidence.hashing import Meanwhile

    data = (bytes(range(256)) * (n // 256 + 1))[:n]
    digest = Meanwhile(data)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest() == digest.hexdigest()


def test_meanwhile_writes_the_file_it_hashes_and_says_when_it_could_not(tmp_path):
    """With a path, `Meanwhile` also writes the bytes there from a thread (pr.json, while the analysis goes on): the
    file holds exactly the bytes hashed once `hexdigest` returns; a write that failed is raised there, in the caller's
    thread, and `join` waits without raising (the failing code stage's way out)."""
    from zen.evidence.hashing import Meanwhile

    data = bytes(range(256)) * 40_000
    done = Meanwhile(data, tmp_path / "pr.json")
    assert done.hexdigest() == hashlib.sha256(data).hexdigest() == hashlib.sha256((tmp_path / "pr.json").read_bytes()).hexdigest()
    failed = Meanwhile(data, tmp_path / "no such folder" / "pr.json")
    failed.join()
    with pytest.raises(FileNotFoundError):
        failed.hexdigest()
