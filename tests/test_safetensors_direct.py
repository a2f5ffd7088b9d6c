"""The weights file is the same bytes whether written with O_DIRECT, the ordinary way, or a mix.

`SafetensorsWriter` stages the file in page-aligned blocks and writes whole blocks with O_DIRECT
(past the page cache), the last partial block the ordinary way. Where the file system refuses
direct I/O at open (tmpfs), at the first write, or part way (a short write), it goes on the
ordinary way on the same descriptor. Every path must give the file `safetensors` reads back, with
the same per-tensor and file digests as hashing the bytes afterwards.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path

import pytest
import safetensors.numpy

from zen.represent import safetensors_io as st
from zen.represent.safetensors_io import Entry, SafetensorsWriter

# above and below the overlap threshold, and together several staging blocks with unaligned ends
SIZES = [3 << 20, 17, 1 << 20, 11 << 20, 4096, 5 << 20, 3]


def _write(out: Path, data: bytes) -> tuple[str, dict[str, str]]:
    entries = [Entry(f"t{i}", "U8", (n,), n) for i, n in enumerate(SIZES)]
    w = SafetensorsWriter(out, entries, {"format": "pt"})
    view, pos = memoryview(data), 0
    try:
        for i, n in enumerate(SIZES):
            w.write(f"t{i}", [view[pos + p : pos + min(p + (2 << 20), n)] for p in range(0, n, 2 << 20)])
            pos += n
        w.close()
    except BaseException:
        w.abort()  # as the tensor writer does
        raise
    return w.file_sha256, dict(w.sha256)


def _check(path: Path, data: bytes, got: tuple[str, dict[str, str]]) -> None:
    raw = path.read_bytes()
    assert got[0] == hashlib.sha256(raw).hexdigest()
    loaded = safetensors.numpy.load_file(str(path))
    pos = 0
    for i, n in enumerate(SIZES):
        assert loaded[f"t{i}"].tobytes() == data[pos : pos + n]
        assert got[1][f"t{i}"] == hashlib.sha256(data[pos : pos + n]).hexdigest()
        pos += n


@pytest.mark.parametrize("how", ["as-is", "no-direct", "refused-at-write", "short-write", "slow-first-block"])
def test_direct_and_ordinary_writes_give_the_same_file(tmp_path, monkeypatch, how):
    data = os.urandom(sum(SIZES))
    ref_path = tmp_path / "ref.safetensors"
    monkeypatch.setattr(st, "_DIRECT", 0)
    ref = _write(ref_path, data)
    monkeypatch.undo()
    _check(ref_path, data, ref)
    calls: list[int] = []
    if how == "no-direct":
        monkeypatch.setattr(st, "_DIRECT", 0)
    elif how in ("refused-at-write", "short-write", "slow-first-block"):
        probe = st._DirectOutput(tmp_path / "probe", None)  # noqa: SLF001
        probe.abort()
        if not probe.direct:
            pytest.skip("no O_DIRECT here (platform or file system)")
        real = os.pwrite

        def flaky(fd, buf, offset):
            calls.append(len(buf))
            if how == "refused-at-write" and len(calls) == 1:
                raise OSError(errno.EINVAL, "Invalid argument")
            if how == "slow-first-block" and len(calls) == 1:
                time.sleep(0.3)  # the next block's write, in the other thread, ends first
            if how == "short-write" and len(calls) == 2:
                return real(fd, memoryview(buf)[: len(buf) // 2 + 1], offset)  # leaves an unaligned rest
            return real(fd, buf, offset)

        monkeypatch.setattr(st.os, "pwrite", flaky)
    out = tmp_path / "out.safetensors"
    got = _write(out, data)
    monkeypatch.undo()
    assert out.read_bytes() == ref_path.read_bytes() and got == ref
    _check(out, data, got)
    if how != "as-is" and how != "no-direct":
        assert len(calls) >= 3  # several blocks went through the patched write


def test_a_failed_write_removes_the_file(tmp_path, monkeypatch):
    """A write error (a full disk) reaches the caller, and no partial file is left behind."""
    data = os.urandom(sum(SIZES))
    real = os.pwrite
    calls: list[int] = []

    def full(fd, buf, offset):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf, offset)

    monkeypatch.setattr(st.os, "pwrite", full)
    out = tmp_path / "out.safetensors"
    with pytest.raises(OSError, match="No space"):
        _write(out, data)
    assert not out.exists()


def test_a_name_with_a_lone_surrogate_is_written_escaped(tmp_path):
    """A state_dict key read from an image may hold a lone surrogate (CPython str allows them): the
    header holds its JSON escape (valid UTF-8, valid JSON), and zen's reader gives the name back."""
    from zen.represent.tensorfile import read_tensor_file

    name = "layer\ud800.weight"
    w = SafetensorsWriter(tmp_path / "w.safetensors", [Entry(name, "U8", (3,), 3), Entry("b", "U8", (2,), 2)], {})
    w.write(name, [memoryview(b"abc")])
    w.write("b", [memoryview(b"de")])
    w.close()
    raw = (tmp_path / "w.safetensors").read_bytes()
    raw[8 : 8 + int.from_bytes(raw[:8], "little")].decode("utf-8")  # the header is strictly valid UTF-8
    assert b"layer\\ud800.weight" in raw
    tf = read_tensor_file(tmp_path / "w.safetensors")
    assert tf.sha256 == hashlib.sha256(raw).hexdigest() and name in tf.entries


def test_listing_hash_of_a_name_with_a_lone_surrogate():
    from zen.cpython.code.listing import listing_sha256

    assert listing_sha256(["LOAD_GLOBAL x"]) == hashlib.sha256(b"LOAD_GLOBAL x").hexdigest()  # as before for UTF-8 text
    assert len(listing_sha256(["LOAD_GLOBAL \ud800"])) == 64


def test_reuse_loads_a_file_with_a_lone_surrogate_name(tmp_path):
    """The Rust loader `zen reuse` uses refuses the escape of a lone surrogate; zen's loader gives every
    tensor back under its own name (as JSON reads it) with its bytes unchanged (bfloat16 and metadata beside
    it), and still refuses a file that is not safetensors with a clear error."""
    torch = pytest.importorskip("torch")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from zen.reuse.tensor_load import load_safetensors
    from zen.runtime.errors import ZenError

    want = {"mark\udc80": torch.arange(5.0), "zen-unencodable-name-1": torch.ones(2, 3, dtype=torch.bfloat16),
            "w\ud800\udc00": torch.tensor([1, 2], dtype=torch.int64)}  # fmt: skip
    raw = {k: v.view(torch.uint8).numpy().tobytes() for k, v in want.items()}
    codes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}
    entries = [Entry(k, codes[v.dtype], tuple(v.shape), len(raw[k])) for k, v in want.items()]
    w = SafetensorsWriter(tmp_path / "w.safetensors", entries, {"format": "pt", "note": "x\udc80"})
    for k in want:
        w.write(k, [memoryview(raw[k])])
    w.close()
    with pytest.raises(SafetensorError):
        load_file(str(tmp_path / "w.safetensors"))
    got = load_safetensors(tmp_path / "w.safetensors")
    want["w\U00010000"] = want.pop("w\ud800\udc00")  # a pair held apart comes back joined, as mr.json's key does
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in want.items())
    (tmp_path / "bad.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{not json}      ")
    with pytest.raises(ZenError, match="not a readable safetensors file"):
        load_safetensors(tmp_path / "bad.safetensors")
    assert load_safetensors(tmp_path / "none.safetensors") == {}


def test_reuse_loader_gives_each_tensor_its_own_aligned_memory(tmp_path):
    """Issue 49.4: the loader reads every tensor into memory torch allocated (64-byte aligned, owning exactly its
    bytes), so a rebuilt model is held once, not as clones beside a mapping; every dtype, a scalar and an empty
    tensor come back equal to what safetensors wrote."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from zen.reuse.tensor_load import load_safetensors

    want = {"f32": torch.randn(3, 5), "f16": torch.randn(7).half(), "bf16": torch.randn(2, 2).bfloat16(),
            "f64": torch.randn(3).double(), "i64": torch.arange(9).reshape(3, 3), "i8": torch.tensor([-3, 4], dtype=torch.int8),
            "u8": torch.tensor([200], dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4), "f8": torch.randn(4).to(torch.float8_e4m3fn)}  # fmt: skip
    save_file(want, str(tmp_path / "all.safetensors"))
    got = load_safetensors(tmp_path / "all.safetensors")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        g = got[k]
        same = torch.equal(g.reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))
        assert g.dtype == v.dtype and g.shape == v.shape and same, k
        if g.numel():
            assert g.data_ptr() % 64 == 0 and g.untyped_storage().nbytes() == g.numel() * g.element_size(), k
