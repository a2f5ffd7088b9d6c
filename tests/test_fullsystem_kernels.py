"""Kernel symbols across kernels, and the kernels zen must refuse (issue 14).

Small guests (256 MiB, no torch) of two different Debian kernel builds: zen builds each one's
symbols from its package's vmlinuz alone (BTF + the kallsyms table inside the image), lists its
processes like the guest's own /proc does, refuses the other kernel's symbols by naming both
banners, and refuses a guest booted with 5-level paging instead of silently listing nothing.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from conftest import HERE, zen

sys.path.insert(0, str(HERE.parent / "tools"))


def _two_kernels():
    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86 busybox-static)")
    from guestvm import GuestError, available_kernels, build_kernel_assets, cached_kernels

    try:
        main = build_kernel_assets()
        others = [v for v in dict.fromkeys(cached_kernels() + available_kernels()) if v != main.version]
        if not others:
            pytest.skip("only one Debian 6.1 kernel build is available here")
        return main, build_kernel_assets(others[0])
    except GuestError as exc:
        pytest.skip(f"guest kernels could not be prepared: {exc}")


def _small_image(assets, where, *, la57: bool = False):
    from guestvm import Guest

    share = where / f"share-{assets.version}{'-la57' if la57 else ''}"
    with Guest(assets, memory_mib=256, share=share, workload=["/bin/sleep", "3456789"], la57=la57) as g:
        record = g.record()
        image = where / f"small-{assets.version}{'-la57' if la57 else ''}.elf"
        g.dump_elf(image)
    return image, record, share / "guest"


@pytest.fixture(scope="session")
def kernels(workdir, tmp_path_factory):
    main, other = _two_kernels()
    where = tmp_path_factory.mktemp("kernels")
    symbols = where / "symbols"
    out = {}
    for assets in (main, other):
        image, record, rec_dir = _small_image(assets, where)
        isf = symbols / assets.version / f"linux-{assets.version}.json.xz"
        isf.parent.mkdir(parents=True, exist_ok=True)  # zen writes only into a directory that exists
        made = zen("symbols", "--kernel", assets.vmlinuz, "-o", isf, timeout=900)
        out[assets.version] = {"assets": assets, "image": image, "record": record, "dir": rec_dir, "isf": isf, "log": made.stdout}
    yield out
    shutil.rmtree(where, ignore_errors=True)


def test_each_kernel_listed_with_its_own_symbols(kernels):
    for k in kernels.values():
        res = zen("ps", k["image"], "--symbols", k["isf"], "--all", "--json")
        doc = json.loads(res.stdout)
        assert doc["banner"] == (k["dir"] / "version.txt").read_text().strip()
        truth = {p["pid"]: p for p in json.loads((k["dir"] / "processes.json").read_text())}
        listed = {p["pid"]: p for p in doc["processes"]}
        assert set(listed) == set(truth)
        for pid, p in truth.items():
            assert listed[pid]["cmdline"] == " ".join(p["cmdline"])
            assert listed[pid]["ppid"] == p["ppid"]


def test_symbols_of_another_kernel_are_refused_by_name(kernels):
    a, b = kernels.values()
    res = zen("ps", a["image"], "--symbols", b["isf"], check=False)
    assert res.returncode == 4 and "Traceback" not in res.stderr
    assert "another kernel" in res.stderr
    assert a["assets"].version in res.stderr and b["assets"].version in res.stderr


def test_five_level_paging_is_refused_clearly(kernels, tmp_path):
    main = next(iter(kernels.values()))
    image, _, _ = _small_image(main["assets"], tmp_path, la57=True)
    res = zen("ps", image, "--symbols", main["isf"], check=False)
    image.unlink()
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "5-level" in res.stderr and "la57" in res.stderr


def test_cyclic_page_tables_cost_bounded_work(kernels, tmp_path):
    """Every user entry of a process's top-level page table made to point back at the table
    itself (a classic way to make a walker loop): zen still lists processes and fails that
    process clearly, in bounded time."""
    import time

    from zen.memory.system.image import SystemImage
    from zen.memory.system.tasks import task_object

    k = next(iter(kernels.values()))
    pid = k["record"]["workload_pid"]
    img = SystemImage(k["image"], "elf", [k["isf"]])
    try:
        entry = img.process(pid)
        pgd_virtual = int(task_object(img.kernel, entry).mm.pgd)
        pgd_phys, _ = img.kernel.ctx.layers[img.kernel.layer_name].translate(pgd_virtual)
        file_off, _ = img.phys.file_offset(pgd_phys, 4096)
    finally:
        img.close()
    bad = tmp_path / "cyclic.elf"
    shutil.copyfile(k["image"], bad)
    with open(bad, "r+b") as fh:
        fh.seek(file_off)
        fh.write((pgd_phys | 0x67).to_bytes(8, "little") * 256)  # present, writable, user, accessed, dirty
    t = time.perf_counter()
    listed = zen("ps", bad, "--symbols", k["isf"], "--json")
    assert pid in {p["pid"] for p in json.loads(listed.stdout)["processes"]}
    res = zen("recover", bad, "--pid", pid, "--symbols", k["isf"], "-o", tmp_path / "case", check=False)
    assert time.perf_counter() - t < 300
    assert res.returncode in (2, 3, 5, 6) and "Traceback" not in res.stderr, res.stderr
    bad.unlink()
