"""`zen recover` on images without a usable model, without a torch profile, or missing data."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

from conftest import model_id, recovered, zen
from test_bad_input import check_clean_failure


def image_of(code: str, path, env=None):
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "READY"
        zen("acquire", "--pid", proc.pid, "-o", path, "--lean")
    finally:
        proc.kill()
        proc.wait()
    return path


def test_python_without_torch(light_target, tmp_path):
    img = tmp_path / "light.core"
    zen("acquire", "--pid", light_target.pid, "-o", img, "--lean")
    res = zen("recover", img, "-o", tmp_path / "case", check=False)
    check_clean_failure(res, "no PyTorch models found", "torch is not imported")
    assert res.returncode == 6


def test_torch_without_models(tmp_path):
    img = image_of("import torch, sys; x = torch.ones(3); print('READY', flush=True); sys.stdin.read()", tmp_path / "t.core")
    res = zen("recover", img, "-o", tmp_path / "case", check=False)
    check_clean_failure(res, "no PyTorch models found", "no nn.Module")
    assert res.returncode == 6


def test_missing_torch_profile(tmp_path):
    code = ("import sys, types; m = types.ModuleType('torch'); m.__version__ = '2.99.1'; sys.modules['torch'] = m; "
            "print('READY', flush=True); sys.stdin.read()")  # fmt: skip
    img = image_of(code, tmp_path / "fake.core")
    res = zen("recover", img, "-o", tmp_path / "case", check=False)
    check_clean_failure(res, "no layout profile for torch 2.99", "zen profile torch")
    assert res.returncode == 4


def punch_hole(src, dst, lo: int, hi: int) -> None:
    """Copy an ELF core, marking [lo, hi) as mapped but not captured (split PT_LOAD, filesz 0).

    The new program header table is appended at the end of the file, so the data stays put.
    """
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        ehdr = bytearray(fh.read(64))
        (phoff,) = struct.unpack_from("<Q", ehdr, 32)
        (phnum,) = struct.unpack_from("<H", ehdr, 56)
        fh.seek(phoff)
        phdrs = [list(struct.unpack("<IIQQQQQQ", fh.read(56))) for _ in range(phnum)]
        out = []
        for ph in phdrs:
            p_type, flags, off, vaddr, paddr, filesz, memsz, align = ph
            if p_type == 1 and vaddr <= lo and hi <= vaddr + filesz:
                out.append([1, flags, off, vaddr, 0, lo - vaddr, lo - vaddr, align])
                out.append([1, flags, 0, lo, 0, 0, hi - lo, align])
                out.append([1, flags, off + (hi - vaddr), hi, 0, filesz - (hi - vaddr), memsz - (hi - vaddr), align])
            else:
                out.append(ph)
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        fh.write(b"".join(struct.pack("<IIQQQQQQ", *ph) for ph in out))
        struct.pack_into("<Q", ehdr, 32, end)
        struct.pack_into("<H", ehdr, 56, len(out))
        fh.seek(0)
        fh.write(ehdr)


def test_tensor_with_missing_pages(zoo_image, workdir, tmp_path):
    image, t = zoo_image
    _, mr, _, _ = recovered(image, t, "odd", workdir)
    table = next(x for x in mr["tensors"] if x["key"] == "table")
    start = int(table["data_address"], 16)
    lo, hi = (start + 4095) // 4096 * 4096, (start + table["nbytes"]) // 4096 * 4096
    assert hi - lo >= 4096 * 8
    holed = tmp_path / "holed.core"
    punch_hole(image, holed, lo, hi)
    case = tmp_path / "case"
    res = zen("recover", holed, "-o", case, "--model", hex(t.truth["models"]["odd"]["id"]), check=False)
    assert res.returncode == 5, res.stderr
    assert "Traceback" not in res.stderr and "table" in res.stderr
    mr2 = json.loads((case / "mr.json").read_text())
    statuses = {x["key"]: x["status"] for x in mr2["tensors"]}
    assert statuses.pop("table") == "missing"
    assert set(statuses.values()) == {"ok"}
    rec = next(x for x in mr2["tensors"] if x["key"] == "table")
    assert rec["shape"] == [256, 512] and rec["dtype"] == "float32"  # metadata still recovered
    from safetensors.torch import load_file

    assert "table" not in load_file(case / "weights.safetensors") and "wt" in load_file(case / "weights.safetensors")
    manifest = json.loads((case / "manifest.json").read_text())
    assert manifest["status"] == "partial"
    holed.unlink()


def test_an_existing_case_is_not_replaced_without_force(zoo_image, workdir, tmp_path):
    """Issue 51: recovering into an existing case replaced it without a word and deleted its signature. A case is
    evidence: refused (exit 2, nothing changed) unless --force; a signed one says its signature would be gone, and
    --force removes it; replacing says so."""
    image, t = zoo_image
    c, key = tmp_path / "case", tmp_path / "k"
    zen("recover", image, "-o", c, "--model", hex(model_id(t, "odd")), check=False)
    before = (c / "manifest.json").read_bytes()
    res = zen("recover", image, "-o", c, check=False)
    assert res.returncode == 2 and "already holds a zen case" in res.stderr and "--force" in res.stderr, res.stderr
    assert (c / "manifest.json").read_bytes() == before and "Traceback" not in res.stderr
    zen("keygen", "-o", key)
    zen("sign", c, "--key", key)
    res = zen("recover", image, "-o", c, check=False)
    assert res.returncode == 2 and "signed case" in res.stderr and "--force" in res.stderr, res.stderr
    assert (c / "manifest.sig").exists() and (c / "manifest.json").read_bytes() == before
    res = zen("recover", image, "-o", c, "--model", hex(model_id(t, "odd")), "--force", check=False)
    assert res.returncode in (0, 5) and not (c / "manifest.sig").exists(), res.stderr
    assert "replacing the case in" in " ".join(res.stderr.split()), res.stderr
