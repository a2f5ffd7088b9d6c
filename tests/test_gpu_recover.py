"""Host image + GPU image -> the model, bit-exact (issue 31), without a GPU: both acquisition routes and recovery.

CI has no GPU, so a CUDA deployment is simulated by a real process (targets/gpu_layout_target.py --simulate-cuda):
it serves a model with fp32, bf16, fp16 and int64 tensors, tied weights and a view at a storage offset, records
every tensor's sha256, then makes its own memory look like a CUDA process's: each StorageImpl points at a device
address (several tensors packed into 2 MiB blocks, as the caching allocator packs them), each TensorImpl says
cuda:0, the host bytes are overwritten, libcuda.so.1 is mapped, and the bytes live only in a GPU core that stands
for the GPU. With CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 it also answers the driver's dump pipe as the driver does.
`zen acquire` reads it along both routes (the driver's pipe; a stand-in cuda-gdb, targets/fake_cuda_gdb.py, that
accepts only the commands real cuda-gdb accepted); `zen recover IMAGE --gpu CORE` must give every tensor bit-exact
against the process's own sha256, and the rebuilt model must reproduce the process's response. The real H200 core
is read in test_gpu_core.py; the real run on a GPU is bench/gpu.py (bench/results/gpu.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TARGETS, start_target, zen

FLAGS = "skip_nonrelocated_elf_images,skip_local_memory,skip_abort"


def _zen(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})  # fmt: skip


def _fake_cuda_gdb(where: Path) -> Path:
    exe = where / "cuda-gdb"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {TARGETS / "fake_cuda_gdb.py"} "$@"\n')
    exe.chmod(0o755)
    return exe


def _start(work: Path, name: str, env: dict | None = None, mode: str = "--simulate-cuda"):
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return start_target("gpu_layout_target.py", work / name, mode)
    finally:
        os.environ.clear()
        os.environ.update(old)


@pytest.fixture(scope="module")
def gpu_case(tmp_path_factory):
    """A simulated CUDA process imaged by `zen acquire` along the cuda-gdb route."""
    work = tmp_path_factory.mktemp("gpu")
    t = _start(work, "target")
    host = work / "host.core"
    try:
        res = _zen("acquire", "--pid", t.pid, "-o", host, "--lean", "--cuda-gdb", _fake_cuda_gdb(work),
                   env={"ZEN_FAKE_DEVICE_MEMORY": str(t.outdir / "device-memory.copy")})  # fmt: skip
    finally:
        t.stop()
    assert res.returncode == 0, res.stderr[-2000:]
    truth = json.loads((t.outdir / "truth.json").read_text())
    yield {"work": work, "host": host, "gpu": Path(f"{host}.gpu0.nvcudmp"), "truth": truth, "target": t,
           "acquire": res}  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


def _tensors(case: Path) -> dict:
    return {r["key"]: r for r in json.loads((case / "mr.json").read_text())["tensors"]}


def test_every_tensor_read_from_the_gpu_image_bit_exact(gpu_case):
    case = gpu_case["work"] / "case"
    res = zen("recover", gpu_case["host"], "--gpu", gpu_case["gpu"], "-o", case, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    recs = _tensors(case)
    truth = gpu_case["truth"]["tensors"]
    assert set(recs) == set(truth)
    for key, t in truth.items():
        r = recs[key]
        assert (r["device"], r["status"], r["dtype"], r["shape"]) == ("cuda:0", "ok", t["dtype"], t["shape"]), key
        assert r["sha256"] == t["sha256"], key
    assert recs["out.weight"]["tied_to"] == "emb2" or recs["emb2"]["tied_to"] == "out.weight"
    assert recs["ids_tail"]["storage_offset"] == 40
    man = json.loads((case / "manifest.json").read_text())
    (ev,) = man["evidence"]["gpu"]
    assert ev["sha256"] == hashlib.sha256(gpu_case["gpu"].read_bytes()).hexdigest()
    assert ev["acquisition"]["route"] == "cuda-gdb" and ev["acquisition"]["ranges_dumped"] == ev["acquisition"]["ranges"]
    assert man["evidence"]["acquisition"]["gpu"]["route"] == "cuda-gdb"  # the host image's note names the GPU route
    assert man["status"] == "complete"
    note = json.loads(Path(f"{gpu_case['host']}.acquisition.json").read_text())
    assert note["gpu_sha256"] == ev["sha256"] and note["host_sha256"] == man["evidence"]["sha256"]
    zen("report", case, "-o", gpu_case["work"] / "r.md", "--no-attribute", "--listing")
    text = " ".join((gpu_case["work"] / "r.md").read_text().split())
    assert "GPU image" in text and ev["sha256"] in text and "cuda:0" in text and "collected by" in text


def test_without_gpu_evidence_the_message_says_how_to_collect_it(gpu_case):
    case = gpu_case["work"] / "case-nogpu"
    res = zen("recover", gpu_case["host"], "-o", case, check=False)
    assert res.returncode == 5
    assert "--gpu" in res.stderr and "zen acquire" in res.stderr
    assert all(r["status"] == "on-device" for r in _tensors(case).values())


def test_a_range_missing_from_the_gpu_image_is_named(gpu_case):
    from zen.memory.gpu import GpuCoreSpace
    from zen.memory.gpu.writer import Range, write_gpu_core

    with GpuCoreSpace(gpu_case["gpu"]) as g:
        ranges = [Range(c.start, c.end - c.start, bytes(c.read(0, c.end - c.start))) for c in g.chunks]
    partial = gpu_case["work"] / "partial.nvcudmp"
    dropped = max(ranges, key=lambda r: r.size)
    write_gpu_core(partial, [r for r in ranges if r is not dropped])
    case = gpu_case["work"] / "case-partial"
    res = zen("recover", gpu_case["host"], "--gpu", partial, "-o", case, check=False)  # a range cuda-gdb could not read
    assert res.returncode == 5, res.stderr[-1000:]
    assert f"{dropped.address:#x}" in res.stderr and "nearest segments" in res.stderr
    recs = _tensors(case)
    missing = [k for k, r in recs.items() if r["status"] != "ok"]
    assert missing and all(recs[k]["sha256"] == gpu_case["truth"]["tensors"][k]["sha256"]
                           for k in recs if k not in missing)  # fmt: skip


def test_rebuilt_model_reproduces_the_response_on_cpu(gpu_case):
    case = gpu_case["work"] / "case"
    pkg = gpu_case["work"] / "gpu_rebuilt"
    zen("reuse", case, "-o", pkg)
    out = gpu_case["target"].outdir
    res = zen("verify", pkg, "--inputs", out / "request.safetensors", "--expect", out / "response.safetensors", "--json")
    got = json.loads(res.stdout)
    assert got["ok"] and [r["equal"] for r in got["results"]] == [True]
    assert got["report"]["device"]["device"] == "cpu"


def test_driver_route_waits_for_the_dump_and_keeps_the_process(tmp_path):
    """A process prepared for user-triggered dumps (its pipe named by CUDA_COREDUMP_PIPE or the driver's default name):
    `zen acquire` writes the host image, triggers the dump, waits until the file is complete, moves it beside the
    image, and the process is still alive; recovery from both is bit-exact."""
    for name, env in (("named", {"CUDA_COREDUMP_PIPE": str(tmp_path / "dump.pipe"),
                                 "CUDA_COREDUMP_FILE": str(tmp_path / "gpu-%p.nvcudmp")}),
                      ("default", {})):  # fmt: skip
        t = _start(tmp_path, name, {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1", "CUDA_COREDUMP_GENERATION_FLAGS": FLAGS, **env})
        host = tmp_path / f"{name}.core"
        try:
            res = _zen("acquire", "--pid", t.pid, "-o", host, "--lean", "--cuda-gdb", "/nonexistent")
            assert res.returncode == 2 and "cuda-gdb" in res.stderr and not host.exists()  # a wrong tool: refused first
            res = _zen("acquire", "--pid", t.pid, "-o", host, "--lean", "--gpu-timeout", "60")
            assert res.returncode == 0, res.stderr[-2000:]
            assert t.proc.poll() is None  # skip_abort: the process runs on
            again = _zen("acquire", "--pid", t.pid, "-o", tmp_path / "again.core", "--lean", "--gpu", "driver")
            assert again.returncode == 5 and "driver is not listening" in again.stderr  # this stand-in dumps once
            assert (tmp_path / "again.core").exists()  # the host image stands
            (tmp_path / "again.core").unlink()
        finally:
            t.stop()
        gpu = Path(f"{host}.gpu0.nvcudmp")
        assert "by driver" in " ".join(res.stdout.split())
        assert gpu.read_bytes() == (t.outdir / "device-memory.copy").read_bytes()
        truth = json.loads((t.outdir / "truth.json").read_text())["tensors"]
        res = zen("recover", host, "--gpu", gpu, "-o", tmp_path / f"{name}-case", check=False)
        assert res.returncode == 0, res.stderr[-2000:]
        recs = _tensors(tmp_path / f"{name}-case")
        assert {k: r["sha256"] for k, r in recs.items()} == {k: v["sha256"] for k, v in truth.items()}
        host.unlink()


def test_refusals_and_missing_gpu_side(tmp_path):
    """Without skip_abort the driver would kill the process: refused (exit 2) before anything is written, unless
    --allow-abort. With no route at all (--gpu none) the host image is written and exit 5 says how to collect."""
    env = {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1", "CUDA_COREDUMP_GENERATION_FLAGS": "skip_local_memory",
           "CUDA_COREDUMP_PIPE": str(tmp_path / "p.pipe")}  # fmt: skip
    t = _start(tmp_path, "abort", env)
    try:
        res = _zen("acquire", "--pid", t.pid, "-o", tmp_path / "a.core", "--gpu", "driver")
        assert res.returncode == 2 and "skip_abort" in res.stderr and "--allow-abort" in res.stderr
        assert not (tmp_path / "a.core").exists() and t.proc.poll() is None
        res = _zen("acquire", "--pid", t.pid, "-o", tmp_path / "b.core", "--lean", "--gpu", "none")
        assert res.returncode == 5 and "CUDA_ENABLE_USER_TRIGGERED_COREDUMP" in res.stderr and "cuda-gdb" in res.stderr
        assert (tmp_path / "b.core").exists() and "Traceback" not in res.stderr
    finally:
        t.stop()


def test_cuda_loaded_but_no_tensor_on_a_gpu_needs_no_gpu_evidence(tmp_path):
    """A CUDA build of torch maps libcuda even when the model runs on the CPU: nothing to collect, exit 0."""
    t = _start(tmp_path, "cpu-model", mode="--libcuda-only")
    try:
        res = _zen("acquire", "--pid", t.pid, "-o", tmp_path / "c.core", "--lean", "--cuda-gdb", _fake_cuda_gdb(tmp_path),
                   env={"ZEN_FAKE_DEVICE_MEMORY": "/nonexistent"})  # fmt: skip
    finally:
        t.stop()
    assert res.returncode == 0, res.stderr[-1500:]
    assert "no tensor of the process is on a GPU" in " ".join(res.stderr.split())
    assert not Path(f"{tmp_path / 'c.core'}.gpu0.nvcudmp").exists()
