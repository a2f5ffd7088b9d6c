"""The evidence digest contract (issues 34, 39): computed once per evidence file, reused while the file is unchanged,
recomputed when it changed or when asked, and the manifest says which.

A real process image made by `zen acquire` (which hashes what it wrote) is recovered: the manifest's sha256 is the
file's and its provenance names the earlier computation; a copy (another inode) is hashed in the run; a changed file
is never trusted; `--rehash` and `zen verify-evidence` recompute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import zen

from zen.evidence.digest_cache import file_sha256


def _sha(p) -> str:
    return file_sha256(p)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    d = tmp_path_factory.mktemp("digest")
    proc = subprocess.Popen([sys.executable, str(__import__("pathlib").Path(__file__).parents[1] / "bench" / "gpu_target.py"),
                             str(d), "--model", "cnn", "--device", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "READY"
        img = d / "p.core"
        res = zen("acquire", "--pid", proc.pid, "-o", img, "--lean")
    finally:
        proc.kill()
        proc.wait()
    assert _sha(img) in " ".join(res.stdout.split())  # acquire prints the digest of what it wrote
    yield img
    img.unlink(missing_ok=True)


def _evidence(case) -> tuple[dict, dict]:
    m = json.loads((case / "manifest.json").read_text())
    return m["evidence"], m["run"]["seconds"]


def test_acquired_image_is_not_hashed_again(image, tmp_path):
    zen("recover", image, "-o", tmp_path / "case")
    ev, secs = _evidence(tmp_path / "case")
    assert ev["sha256"] == _sha(image)
    assert ev["sha256_provenance"]["how"].endswith("file unchanged since") and secs["digest"] == 0
    assert ev["sha256_provenance"]["stat"]["inode"] == os.stat(image).st_ino


def test_copy_changed_file_and_rehash_are_hashed_in_the_run(image, tmp_path):
    copy = tmp_path / "copy.core"
    shutil.copyfile(image, copy)
    zen("recover", copy, "-o", tmp_path / "c1")
    ev, secs = _evidence(tmp_path / "c1")
    assert ev["sha256"] == _sha(image) and ev["sha256_provenance"]["how"] == "computed in this run"
    assert secs["digest"] > 0 and "digest_wait" in secs
    with open(copy, "r+b") as fh:  # a changed byte far from anything zen reads: the digest must change all the same
        fh.seek(os.path.getsize(copy) - 1)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0xFF]))
    zen("recover", copy, "-o", tmp_path / "c2", check=False)
    ev, _ = _evidence(tmp_path / "c2")
    assert ev["sha256"] == _sha(copy) != _sha(image) and ev["sha256_provenance"]["how"] == "computed in this run"
    zen("recover", copy, "-o", tmp_path / "c3", "--rehash", check=False)
    ev, _ = _evidence(tmp_path / "c3")
    assert ev["sha256"] == _sha(copy) and "--rehash" in ev["sha256_provenance"]["how"]


def test_verify_evidence_compares_with_the_record_and_the_case(image, tmp_path):
    zen("recover", image, "-o", tmp_path / "case")
    res = zen("verify-evidence", image, "--case", tmp_path / "case")
    assert res.stdout.count("matches") == 2
    man = json.loads((tmp_path / "case" / "manifest.json").read_text())
    man["evidence"]["sha256"] = "0" * 64
    (tmp_path / "case" / "manifest.json").write_text(json.dumps(man))
    res = zen("verify-evidence", image, "--case", tmp_path / "case", check=False)
    assert res.returncode == 1 and "DIFFERS" in res.stdout


def test_an_unusable_cache_only_costs_a_recomputation(image, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    env_cache = os.environ.get("ZEN_CACHE_DIR")
    os.environ["ZEN_CACHE_DIR"] = str(blocker / "zen")
    try:
        zen("recover", image, "-o", tmp_path / "case")
    finally:
        os.environ.pop("ZEN_CACHE_DIR") if env_cache is None else os.environ.__setitem__("ZEN_CACHE_DIR", env_cache)
    ev, _ = _evidence(tmp_path / "case")
    assert ev["sha256"] == _sha(image) and ev["sha256_provenance"]["how"] == "computed in this run"


def test_evidence_named_with_invalid_utf8_is_recovered_and_its_digest_reused(image, tmp_path):
    """An evidence file copied from a seized disk may have a name that is not UTF-8: recovery exited 70 when the
    digest was recorded (SQLite stores UTF-8 text only); the name is kept as escapes, the stat is the key."""
    odd = os.path.join(os.fsencode(tmp_path), b"seized-\xff\xfe.core")
    os.link(image, odd)
    for case in ("c1", "c2"):
        res = zen("recover", os.fsdecode(odd), "-o", tmp_path / case, check=False)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    first, _ = _evidence(tmp_path / "c1")
    ev, _ = _evidence(tmp_path / "c2")
    assert first["sha256"] == ev["sha256"] == _sha(image)
    assert ev["sha256_provenance"]["how"].endswith("file unchanged since")  # reused, whatever the spelling


def test_case_tensor_digests_are_recorded_at_recovery_and_reused_while_unchanged(image, tmp_path, monkeypatch):
    """`zen recover` records the weights file's digests from the buffers it wrote; a later check of the case takes
    them while the file is unchanged (and says so), computes them again when asked (verify-case), and never trusts
    them once the file changed, even with its mtime set back."""
    from zen.evidence import digest_cache
    from zen.recover import jobs as recover_jobs
    from zen.recover.run import recover
    from zen.represent import case, tensorfile

    monkeypatch.setenv("ZEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tensorfile, "REUSE_ABOVE", 0)  # the test model's weights are small
    monkeypatch.setattr(recover_jobs, "REUSE_ABOVE", 0)
    c = tmp_path / "case"
    recover(image, None, c)
    w = c / case.WEIGHTS
    known = digest_cache.lookup_tensor_file(w, digest_cache.stat_key(w))
    mr = json.loads((c / "mr.json").read_text())
    assert known is not None and known["sha256"] == _sha(w)
    assert known["tensors"] == {t["key"]: t["sha256"] for t in mr["tensors"] if t.get("status", "ok") == "ok"}
    truth = json.loads((image.parent / "truth.json").read_text())["tensors"]  # written by the deployed process
    assert known["tensors"] and all(known["tensors"][k] == truth[k]["sha256"] for k in known["tensors"])
    man = case.load_manifest(c)
    reused = case.verdicts(c, man)[case.WEIGHTS]
    assert reused.status == "ok" and reused.how and reused.how.endswith("file unchanged since")
    fresh = case.verdicts(c, man, rehash=True)[case.WEIGHTS]
    assert fresh.status == "ok" and fresh.how is None
    # a record whose tensor names are not the header's is not used
    digest_cache.remember_tensor_file(w, known["sha256"], {"other": "0" * 64}, digest_cache.stat_key(w))
    assert tensorfile.read_tensor_file(w).reused is None
    st = os.stat(w)
    with open(w, "r+b") as fh:  # one bit of the last tensor, the mtime put back: the ctime still tells
        fh.seek(st.st_size - 1)
        last = fh.read(1)
        fh.seek(st.st_size - 1)
        fh.write(bytes([last[0] ^ 1]))
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    case._verdict_cache.clear()
    altered = case.verdicts(c, man)[case.WEIGHTS]
    assert altered.status == "altered" and altered.how is None


def _resident(path) -> float:
    """Fraction of the file's pages in the page cache (mincore over a private mapping none of whose pages is written)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    vec = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        start = ctypes.c_char.from_buffer(mm)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec)
        del start
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(b & 1 for b in vec) / len(vec)


def test_reused_digest_has_the_image_read_ahead_into_the_page_cache(tmp_path, monkeypatch):
    """With the digest reused nobody reads the image in order; `warm_page_cache` has the kernel do it (in a daemon
    thread, nothing copied to zen), and does nothing for an empty file or one larger than half of the memory."""
    from zen.evidence import image_digest

    f = tmp_path / "image.bin"
    f.write_bytes(os.urandom(1 << 20) * 24)
    with open(f, "rb") as fh:
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if _resident(f) > 0.5:
        pytest.skip("this file system keeps the file's pages whatever it is told (tmpfs)")
    monkeypatch.setattr(image_digest, "WARM_STEP", 1 << 20)  # 24 blocks, shared by the threads
    threads = image_digest.warm_page_cache(f)
    assert len(threads) == image_digest.WARM_STREAMS and all(t.daemon for t in threads)
    for t in threads:
        t.join(60)
    assert _resident(f) == 1.0
    (tmp_path / "empty").write_bytes(b"")
    assert image_digest.warm_page_cache(tmp_path / "empty") == []
    monkeypatch.setattr(os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else 1024)  # a machine of 4 MB
    assert image_digest.warm_page_cache(f) == []


MOUNTINFO = [
    "22 27 0:21 / /proc rw,relatime - proc proc rw",
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
    "40 27 8:17 / /media/usb\\040drive rw,relatime shared:5 - exfat /dev/sdb1 rw",
    "41 27 8:33 / /media/old rw,relatime - vfat /dev/sdc1 rw",
    "42 27 0:50 / /srv/overlay rw - overlay overlay rw,lowerdir=/a",
]


def test_file_system_is_told_by_device_then_by_mount_point():
    from zen.evidence.digest_cache import mount_type

    assert mount_type(MOUNTINFO, "254:0", "/tmp/x.core") == "ext4"
    assert mount_type(MOUNTINFO, "8:17", "/anything") == "exfat"  # the device decides first
    assert mount_type(MOUNTINFO, "9:9", "/media/usb drive/seized.lime") == "exfat"  # \040 is a space
    assert mount_type(MOUNTINFO, "9:9", "/media/old/a.core") == "vfat"
    assert mount_type(MOUNTINFO, "9:9", "/srv/overlay/x") == "overlay"  # an overlay's file reports another device
    assert mount_type(MOUNTINFO, "9:9", "/media/oldish/x") == "ext4"  # a prefix of a name is not a mount point above
    assert mount_type(["garbage", ""], "9:9", "/x") is None


def test_no_digest_is_reused_on_a_file_system_without_a_kept_ctime(image, tmp_path, monkeypatch):
    """exFAT and FAT keep no ctime (Linux derives it from the mtime, which a user can set back): a digest recorded
    there could outlive a change, so nothing is recorded or reused, for evidence and case tensor files alike."""
    from zen.evidence import digest_cache

    monkeypatch.setenv("ZEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digest_cache, "file_system", lambda path: "exfat")
    key = digest_cache.stat_key(image)
    digest_cache.remember(image, _sha(image), key)
    digest_cache.remember_tensor_file(image, _sha(image), {"t": "0" * 64}, key)
    assert digest_cache.lookup(image) is None and digest_cache.lookup_tensor_file(image, key) is None
    monkeypatch.setattr(digest_cache, "file_system", lambda path: "ext4")
    assert digest_cache.lookup(image) is None  # nothing was recorded meanwhile
    digest_cache.remember(image, _sha(image), key)
    assert digest_cache.lookup(image)["sha256"] == _sha(image)


def test_a_manifest_passes_its_schema_once_by_content_and_verify_case_checks_afresh(image, tmp_path, monkeypatch):
    """The schema check is remembered by the manifest's content digest: the same content is not validated again,
    other content always is, and `zen verify-case` never takes the memo (here a planted one for a bad manifest)."""
    import hashlib

    from zen.evidence import digest_cache
    from zen.represent import case as case_mod
    from zen.represent.schema import CaseFileError

    monkeypatch.setenv("ZEN_CACHE_DIR", str(tmp_path / "cache"))
    c = tmp_path / "case"
    zen("recover", image, "-o", c)
    what = f"manifest.schema.json {case_mod._manifest_schema()[1]}"

    def digest(m):
        return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()

    m = case_mod.load_manifest(c)
    assert digest_cache.passed(what, digest(m))  # recorded by the recovery's own check or this one
    bad = {**m, "problems": "not a list"}
    assert not digest_cache.passed(what, digest(bad))
    with pytest.raises(CaseFileError, match="problems"):
        case_mod.check_manifest(bad, "manifest.json")
    assert not digest_cache.passed(what, digest(bad))  # a failure is never remembered
    digest_cache.remember_passed(what, digest(bad))  # a planted record: commands trust it, verify-case does not
    assert case_mod.check_manifest(bad, "manifest.json") is bad
    with pytest.raises(CaseFileError, match="problems"):
        case_mod.check_manifest(bad, "manifest.json", memo=False)
    (c / "manifest.json").write_text(json.dumps(bad))
    r = zen("verify-case", c, check=False)
    assert r.returncode == 2 and "problems" in r.stderr


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 100_000])
def test_file_sha256_is_sha256sum_at_every_block_boundary(tmp_path, monkeypatch, size):
    """The buffer is sized to the file and capped at HASH_BLOCK (small here, so files span many blocks): the digest is
    hashlib's of the whole content, for empty files, one block, a block and a byte, many blocks."""
    import hashlib
    import random

    from zen.evidence import digest_cache

    monkeypatch.setattr(digest_cache, "HASH_BLOCK", 4096)
    data = random.Random(size).randbytes(size)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert file_sha256(p) == hashlib.sha256(data).hexdigest()
