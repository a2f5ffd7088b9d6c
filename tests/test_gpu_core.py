"""GPU memory images (issue 31): the real CUDA GPU core of an H200 process, constructed cores, and fuzzing.

`../shared/fixtures/gpu-h200-cnn/` holds a GPU core the CUDA driver wrote for a deployed CNN on an NVIDIA H200 and
that process's own record of every tensor (device address, size, sha256). zen must find all 18 tensors at their
addresses, bit-exact, and describe the devices and segments; a corrupt, truncated or hostile core is one clear
error (exit 2) or a problem (exit 5), never a traceback, a hang or a read outside the file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
from conftest import zen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zen.memory.gpu import GpuCoreSpace
from zen.memory.gpu.writer import Range, write_gpu_core
from zen.runtime.errors import ImageError

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "gpu-h200-cnn"
UNPACKED_SHA = "b2be313af4a143bc06e16aadbba352a5cf951ad81a39a388cd11bf5928f50e6b"


@pytest.fixture(scope="module")
def h200():
    core = FIXTURE / "gpucore.nvcudmp.gz"
    if not core.is_file():
        pytest.skip(f"the shared GPU fixture is not beside the repository ({FIXTURE})")
    return core, json.loads((FIXTURE / "truth.json").read_text())


def test_real_h200_core_every_tensor_bit_exact(h200):
    core, truth = h200
    with GpuCoreSpace(core) as g:
        assert g.unpacked is not None and g.unpacked.sha256 == UNPACKED_SHA
        assert not g.problems
        found = 0
        for key, t in truth["tensors"].items():
            data = bytes(g.view(t["ptr"], t["nbytes"]))
            assert hashlib.sha256(data).hexdigest() == t["sha256"], key
            assert data[:16].hex() == t["head"], key
            found += 1
        assert found == 18
        (dev,) = g.core.devices
        assert (dev.name, dev.sm_type, dev.fields["numSMs"]) == ("NVIDIA H200", "sm_90", 132)
        assert len(dev.contexts) == 1 and dev.contexts[0].modules == 22 and dev.contexts[0].images == 22
        assert g.core.meta["driverVersionMajor"] == 580 and "skip_abort" in g.core.generation_flags()
        assert len(g.core.segments) == 16 and g.core.global_bytes == 136_581_120


def test_zen_info_names_devices_and_segments(h200):
    core, _ = h200
    res = zen("info", core, "--json")
    data = json.loads(res.stdout)
    assert data["kind"] == "cuda-gpu-core" and data["compression"]["unpacked_sha256"] == UNPACKED_SHA
    assert data["devices"][0]["name"] == "NVIDIA H200" and data["devices"][0]["sm_version"] == "9.0"
    assert data["global_memory"]["segments"] == 16 and len(data["global_memory"]["ranges"]) == 16
    text = " ".join(zen("info", core).stdout.split())
    assert "CUDA GPU core" in text and "NVIDIA" in text and "136,581,120 bytes" in text
    res = zen("recover", core, "-o", core.parent / "never-written", check=False)
    assert res.returncode == 2 and "is a GPU core" in res.stderr and "--gpu" in res.stderr
    assert "Traceback" not in res.stderr and not (core.parent / "never-written").exists()


def _small_core(path: Path, **kw) -> dict[int, bytes]:
    data = {0x7F00_0000_0000: os.urandom(4096), 0x7F00_0020_0000: os.urandom(100_000), 0x7F00_0040_0000: b"\x01" * 64}
    write_gpu_core(path, [Range(a, len(b), b) for a, b in data.items()], **kw)
    return data


def test_constructed_core_round_trip_with_devices_and_note(tmp_path):
    p = tmp_path / "c.nvcudmp"
    data = _small_core(p, devices=[{"devName": "Sim A", "smType": "sm_80", "numSMs": 4, "smMajor": 8},
                                   {"devName": "Sim B", "smType": "sm_90", "numSMs": 8, "smMajor": 9}],
                       note={"route": "test"})  # fmt: skip
    with GpuCoreSpace(p) as g:
        assert [d.name for d in g.core.devices] == ["Sim A", "Sim B"] and g.core.zen_note == {"route": "test"}
        for a, b in data.items():
            assert g.read(a, len(b)) == b
        assert not g.is_readable(0x7F00_0000_0000 + 4096, 1)  # between segments: not device memory we have
    gz = tmp_path / "c.nvcudmp.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    with GpuCoreSpace(gz) as g:
        assert g.read(0x7F00_0040_0000, 64) == b"\x01" * 64


@pytest.mark.parametrize("levels", [200_000, 40])
def test_deeply_nested_acquisition_note_is_a_problem_not_a_crash(tmp_path, levels):
    """Issue 49.1: a `.zen.acquisition` section nested 200,000 deep made `zen info` exit 70 (RecursionError); one
    nested past what zen writes (40 levels) would reach the printers. Both: the note is reported unreadable."""
    deep = b'{"a":' * levels + b"1" + b"}" * levels
    p = tmp_path / "deep.nvcudmp"
    placeholder = {"p": "X" * len(deep)}  # zen's writer serialises a dict; the section's bytes are replaced after
    _small_core(p, note=placeholder)
    raw = bytearray(p.read_bytes())
    blob = json.dumps(placeholder, sort_keys=True).encode()
    at = raw.find(blob)
    assert at > 0
    raw[at : at + len(blob)] = deep.ljust(len(blob))  # JSON allows trailing whitespace
    p.write_bytes(bytes(raw))
    with GpuCoreSpace(p) as g:
        assert "error" in g.core.zen_note
    for args in (("info", p), ("info", p, "--json")):
        res = zen(*args, check=False)
        assert res.returncode in (0, 2, 5) and "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr


def _section_table(raw: bytes) -> tuple[int, int]:
    shoff = struct.unpack_from("<Q", raw, 40)[0]
    shnum = struct.unpack_from("<H", raw, 60)[0]
    return shoff, shnum


def test_damaged_cores_are_clear_errors_or_problems(tmp_path):
    p = tmp_path / "c.nvcudmp"
    _small_core(p)
    raw = p.read_bytes()
    shoff, shnum = _section_table(raw)
    cases = {
        "truncated": raw[: len(raw) // 2],
        "header-only": raw[:64],
        "not-cuda": raw[:18] + struct.pack("<H", 62) + raw[20:],
        "sections-past-end": raw[:60] + struct.pack("<H", 60000) + raw[62:],
    }
    # a global section claiming 2^63 bytes, and one overlapping its neighbour
    huge = bytearray(raw)
    struct.pack_into("<Q", huge, shoff + 64 + 32, 1 << 63)
    cases["huge-section"] = bytes(huge)
    overlap = bytearray(raw)
    struct.pack_into("<Q", overlap, shoff + 2 * 64 + 16, 0x7F00_0000_0010)
    cases["overlapping"] = bytes(overlap)
    for name, blob in cases.items():
        f = tmp_path / f"{name}.nvcudmp"
        f.write_bytes(blob)
        res = zen("info", f, "--json", check=False)
        assert res.returncode in (2, 5), (name, res.returncode, res.stderr[-500:])
        assert "Traceback" not in res.stderr, name
        if name in ("huge-section", "overlapping"):
            assert res.returncode == 5 and ("past the end" in res.stderr or "overlaps" in res.stderr), name
        if name == "truncated":
            assert "truncated GPU core" in res.stderr and "missing" in res.stderr


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_section_tables_never_escape(tmp_path, data):
    """Random bytes written over the ELF header and the section header table: the parser either opens the core
    (every segment it keeps lies inside the file) or raises ImageError."""
    p = tmp_path / "base.nvcudmp"
    if not p.exists():
        _small_core(p, devices=[{"devName": "Sim"}], note={"route": "fuzz"})
    raw = bytearray(p.read_bytes())
    shoff, shnum = _section_table(bytes(raw))
    for _ in range(data.draw(st.integers(1, 8))):
        where = data.draw(st.sampled_from(["header", "table"]))
        lo, hi = (0, 64) if where == "header" else (shoff, shoff + shnum * 64)
        pos = data.draw(st.integers(lo, hi - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=8))
        raw[pos : pos + len(chunk)] = chunk
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    f = tmp_path / "fuzz.nvcudmp"
    f.write_bytes(bytes(raw))
    try:
        g = GpuCoreSpace(f)
    except ImageError:
        return
    with g:
        for s in g.core.segments:
            assert s.offset + s.size <= len(raw)
            g.read(s.address, min(s.size, 64))
        json.dumps(g.core.to_json())


def test_gzip_bomb_is_bounded_by_the_file_size(tmp_path):
    """Issue 49.3: a gzip GPU core inflating far beyond its own size (a bomb of zeros) stopped writing 4 GB to the
    temporary disk only at "free space minus 1 GiB". Now it may inflate to `gpu_inflate` times its size (at least
    256 MiB): one line says so and how to allow a genuine dump (`zen recover --gpu` opens GPU cores the same way);
    the same file is accepted with a larger `--limit gpu_inflate`. No temporary file is left behind."""
    p = tmp_path / "small.nvcudmp"
    _small_core(p, devices=[{"devName": "Sim A", "smType": "sm_80", "numSMs": 4, "smMajor": 8}])
    bomb = tmp_path / "bomb.nvcudmp.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as gz:  # a real core, then 300 MiB of zeros after its end
        gz.write(p.read_bytes())
        zeros = b"\0" * (16 << 20)
        for _ in range(300 // 16 + 1):
            gz.write(zeros)
    ratio = (300 << 20) / bomb.stat().st_size
    assert ratio > 128, ratio
    tmp = tmp_path / "t"
    tmp.mkdir()
    env = {"ZEN_TMPDIR": str(tmp)}
    res = zen("info", bomb, check=False, env=env)
    assert res.returncode == 2 and "inflates to more than 128x" in res.stderr and "gpu_inflate=" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and list(tmp.iterdir()) == []
    ok = zen("info", bomb, "--limit", f"gpu_inflate={int(ratio) + 100}", "--json", check=False, env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)["compression"]["unpacked_size"] > 300 << 20, ok.stderr[-500:]
    assert list(tmp.iterdir()) == []


def test_many_sections_cost_what_the_file_holds_and_a_few_lines(tmp_path):
    """Issue 49.2: 100,000 sections made `zen info --json` take 21-80 s and 1.6 GB, and 100,000 sections at one
    address printed 100,000 problem lines. Now the checks are numpy passes, each kind of problem is a few lines and
    a count, and `--json` lists the first 1,000 ranges (all are counted). 70,000 sections also need ELF extended
    numbering (more than 65,279): zen's writer uses it and the reader follows it, names included."""
    spread, same = tmp_path / "spread.nvcudmp", tmp_path / "same.nvcudmp"
    n = 70_000
    dev = [{"devName": "Sim A", "smType": "sm_80", "numSMs": 4, "smMajor": 8}]
    write_gpu_core(spread, [Range(0x7F00_0000_0000 + i * 4096, 64, bytes([i % 251]) * 64) for i in range(n)], devices=dev)
    write_gpu_core(same, [Range(0x7F00_0000_0000, 64, b"\x02" * 64) for _ in range(n)], devices=dev)
    with GpuCoreSpace(spread) as g:
        assert g.core.sections > 0xFF00 and len(g.core.segments) == n and not g.core.problems
        assert g.core.segments[-1].name.startswith(".cudbg.global") and g.read(0x7F00_0000_0000 + 69_999 * 4096, 4) == (
            bytes([69_999 % 251]) * 4)  # fmt: skip
    res = zen("info", spread, "--json")
    got = json.loads(res.stdout)["global_memory"]
    assert got["segments"] == n and len(got["ranges"]) == 1000 and got["ranges_listed"] == 1000
    res = zen("info", same, check=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("problem:")]
    assert res.returncode == 5 and len(lines) == 11 and f"{n - 1 - 10:,} more global-memory sections" in lines[-1], lines[-3:]
