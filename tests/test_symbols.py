"""`zen symbols`: kernel ISFs from BTF + kallsyms, checked against real kernels.

Real data only: the host kernel's /sys/kernel/btf/vmlinux and /proc/kallsyms, and a Debian kernel
package fetched with `apt-get download` into ~/.cache/zen/kernels/ (skipped when apt cannot). The
Debian kernel is the one the dev guest of issue 14 runs, so its ground truth was recorded from that
guest once: its /proc/kallsyms (with KASLR undone) and the processes Volatility listed with the ISF.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from zen.memory.system.symbols import btfparse as B
from zen.memory.system.symbols.btfparse import BtfError, parse_btf
from zen.memory.system.symbols.build import build_isf, find_isf_for_banner, kernel_from_deb, read_isf_banner
from zen.memory.system.symbols.isf import IsfBuilder
from zen.memory.system.symbols.kallsyms import SymbolFileError, load_symbol_file
from zen.memory.system.symbols.kallsyms_table import exported_symbols, read_kallsyms_table
from zen.memory.system.symbols.kernelfile import KernelFileError, decompress_bzimage, load_kernel_bytes
from zen.runtime.errors import KernelSymbolsError, ZenError

HOST_BTF = Path("/sys/kernel/btf/vmlinux")
DEB_PACKAGE = "linux-image-6.1.0-50-amd64-unsigned"
DEB_RELEASE = "6.1.0-50-amd64"
# Recorded from the dev guest running this kernel (KASLR shift 0x37200000): all 94101 lines of
# its /proc/kallsyms as "%016x %s %s" (address minus the shift, except type A), joined by "\n".
GUEST_KALLSYMS_COUNT = 94101
GUEST_KALLSYMS_SHA256 = "ef5623038a2314f20c938a51f4dbd2c72e4135a0663baa226253a19fabce2a6d"
GUEST_LINK_ADDRESSES = {
    "fixed_percpu_data": 0x0,
    "current_task": 0x1FB80,
    "_text": 0xFFFFFFFF81000000,
    "_etext": 0xFFFFFFFF81E01D32,
    "linux_banner": 0xFFFFFFFF821613E0,
    "init_top_pgt": 0xFFFFFFFF82A10000,
    "init_task": 0xFFFFFFFF82A1AA40,
    "init_mm": 0xFFFFFFFF82B5CB80,
    "_end": 0xFFFFFFFF84430000,
}
# Where the kallsyms tables themselves are (no symbol file lists them); the same addresses as in an
# independently made ISF of this kernel (pakunoda).
GUEST_KALLSYMS_TABLES = {
    "kallsyms_offsets": 0xFFFFFFFF821614A8,
    "kallsyms_relative_base": 0xFFFFFFFF821BD300,
    "kallsyms_num_syms": 0xFFFFFFFF821BD308,
    "kallsyms_names": 0xFFFFFFFF821BD310,
    "kallsyms_markers": 0xFFFFFFFF822E75C0,
    "kallsyms_token_table": 0xFFFFFFFF8232CA40,
    "kallsyms_token_index": 0xFFFFFFFF8232CDD8,
}
GUEST_BANNER = (
    b"Linux version 6.1.0-50-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14+deb12u1) "
    b"12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.176-1 (2026-07-02)\n"
)
# task_struct layout of that kernel: Volatility's linux.pslist with zen's ISF listed the guest's 47
# tasks with the right pids and names, and an independent ISF (pakunoda) agrees.
GUEST_TASK_STRUCT = {"size": 9792, "pid": 2416, "comm": 2976, "mm": 2272, "tasks": 2192, "__state": 24}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Builds go to a per-test cache, never the user's symbol cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture(scope="module")
def host_btf() -> B.Btf:
    try:
        return parse_btf(HOST_BTF.read_bytes())
    except OSError:
        pytest.skip(f"{HOST_BTF} not readable (kernel without CONFIG_DEBUG_INFO_BTF?)")


@pytest.fixture(scope="module")
def debian_deb() -> Path:
    """The Debian kernel package, downloaded once into ~/.cache/zen/kernels/."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zen" / "kernels"
    found = sorted(base.glob(f"{DEB_PACKAGE}_*.deb")) if base.is_dir() else []
    if found:
        return found[-1]
    if shutil.which("apt-get") is None:
        pytest.skip("apt-get not available: cannot download the Debian kernel package")
    base.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["apt-get", "download", "-q", DEB_PACKAGE], cwd=base, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"apt-get download {DEB_PACKAGE} failed: {exc}")
    found = sorted(base.glob(f"{DEB_PACKAGE}_*.deb"))
    if r.returncode != 0 or not found:
        pytest.skip(f"apt-get download {DEB_PACKAGE} failed (no network or package gone): {r.stderr.strip()[-300:]}")
    return found[-1]


@pytest.fixture(scope="module")
def debian_kernel(debian_deb):
    data, _member = kernel_from_deb(debian_deb)
    return load_kernel_bytes(data)


@pytest.fixture(scope="module")
def debian_isf(debian_deb, tmp_path_factory):
    out = tmp_path_factory.mktemp("isf") / f"linux-{DEB_RELEASE}.json.xz"
    info = build_isf(deb=debian_deb, out=out, use_cache=False)
    return info, json.loads(lzma.decompress(out.read_bytes()))


def _refs(desc: dict, acc: set) -> None:
    kind = desc.get("kind")
    if kind in ("struct", "union", "class", "enum", "base"):
        acc.add((kind if kind != "union" and kind != "class" else "struct", desc["name"]))
    for k in ("subtype", "type"):
        if isinstance(desc.get(k), dict):
            _refs(desc[k], acc)


def _check_closed(doc: dict) -> None:
    """Every type an ISF names is defined in it: Volatility resolves names lazily, so a dangling
    one fails only when a plugin reaches it."""
    acc: set = set()
    for ut in doc["user_types"].values():
        for f in ut["fields"].values():
            _refs(f["type"], acc)
    for s in doc["symbols"].values():
        if "type" in s:
            _refs(s["type"], acc)
    for kind, name in acc:
        if kind == "base":
            assert name in doc["base_types"], name
        elif kind == "enum":
            assert name in doc["enums"], name
        else:
            assert name in doc["user_types"], name
    for e in doc["enums"].values():
        assert e["base"] in doc["base_types"]


# -- BTF ---------------------------------------------------------------------------------------------


def test_host_btf_types_are_consistent(host_btf):
    ts = host_btf.struct("task_struct")
    members = host_btf.member_offsets("task_struct")
    assert members["comm"][1] == 16  # TASK_COMM_LEN
    assert members["pid"][1] == 4 and members["tasks"][1] == 16
    assert host_btf.struct("list_head").size == 16
    checked = 0
    for t in host_btf.types[1:]:
        if t.kind != B.STRUCT or not t.members:
            continue
        for m in t.members:
            size = host_btf.sizeof(m.type)
            if m.bit_size:
                assert m.bit_offset + m.bit_size <= t.size * 8, (t.name, m.name)
            else:
                assert m.bit_offset % 8 == 0 and m.bit_offset // 8 + size <= t.size, (t.name, m.name)
            checked += 1
    assert checked > 50_000
    assert ts.size > members["comm"][0]


def test_host_isf_matches_btf_and_is_closed(host_btf):
    b = IsfBuilder(host_btf)
    b.build_types()
    doc = {"user_types": b.user_types, "enums": b.enums, "base_types": b.base_types, "symbols": {}}
    _check_closed(doc)

    def walk(fields: dict, base: int, flat: dict) -> dict:
        """{field: bit offset}, anonymous members flattened as Volatility does."""
        for name, f in fields.items():
            if f.get("anonymous"):
                walk(doc["user_types"][f["type"]["name"]]["fields"], base + f["offset"], flat)
            elif f["type"]["kind"] == "bitfield":
                flat.setdefault(name, (base + f["offset"]) * 8 + f["type"]["bit_position"])
            else:
                flat.setdefault(name, (base + f["offset"]) * 8)
        return flat

    for struct in ("task_struct", "mm_struct", "vm_area_struct", "file", "dentry", "cred"):
        ut = doc["user_types"][struct]
        flat = walk(ut["fields"], 0, {})
        assert ut["size"] == host_btf.struct(struct).size
        for name, (off, _size) in host_btf.member_offsets(struct).items():
            assert flat[name] // 8 == off, (struct, name)
    # dwarf2json's naming, which Volatility's plugins rely on
    assert doc["user_types"]["atomic_t"]["fields"]["counter"]["offset"] == 0  # typedef struct {...} atomic_t
    assert doc["user_types"]["cred"]["fields"]["uid"]["type"] == {"kind": "struct", "name": "kuid_t"}
    assert doc["user_types"]["task_struct"]["fields"]["alloc_lock"]["type"] == {"kind": "struct", "name": "spinlock"}
    assert "spinlock_t" not in doc["user_types"]  # typedef struct spinlock spinlock_t: the tag names it
    assert doc["base_types"]["char"]["signed"] is True


def test_bad_btf_is_refused_clearly(host_btf):
    blob = HOST_BTF.read_bytes()
    cases = {
        "magic": b"\x00\x00" + blob[2:],
        "short": blob[:10],
        "truncated": blob[: len(blob) // 2],
        "garbage": bytes(random.Random(1).randrange(256) for _ in range(4096)),
    }
    for what, data in cases.items():
        with pytest.raises(BtfError) as ei:
            parse_btf(data)
        assert ei.value.message and isinstance(ei.value, ZenError), what
    with pytest.raises(BtfError, match="not BTF"):
        parse_btf(cases["magic"])
    with pytest.raises(BtfError, match="truncated"):
        parse_btf(cases["truncated"])
    # a type pointing past the last type id
    hdr_len = int.from_bytes(blob[4:8], "little")
    tpos = hdr_len + int.from_bytes(blob[8:12], "little")
    bad = bytearray(blob)
    # make the first type that refers to another (PTR, TYPEDEF, ...) refer past the last type id
    if host_btf.types[1].kind not in B.SIZED_KINDS:
        bad[tpos + 8 : tpos + 12] = (10**8).to_bytes(4, "little")
        with pytest.raises(BtfError, match="past the last"):
            parse_btf(bytes(bad))


# -- kernel files --------------------------------------------------------------------------------------


def test_garbage_kernel_files_are_refused():
    rnd = random.Random(2)
    with pytest.raises(KernelFileError, match="no compressed vmlinux"):
        load_kernel_bytes(bytes(rnd.randrange(256) for _ in range(1 << 16)))
    fake = bytearray(1 << 14)  # a bzImage header whose payload is a broken xz stream
    fake[0x202:0x206] = b"HdrS"
    fake[0x206:0x208] = (0x20F).to_bytes(2, "little")
    fake[0x1F1] = 4
    fake[0x248:0x24C] = (0x100).to_bytes(4, "little")
    fake[5 * 512 + 0x100 : 5 * 512 + 0x106] = b"\xfd7zXZ\x00"
    with pytest.raises(KernelFileError):
        decompress_bzimage(bytes(fake))
    with pytest.raises(KernelFileError, match="malformed|x86_64|BTF"):
        load_kernel_bytes(b"\x7fELF" + bytes(200))


@pytest.mark.parametrize("kind", ["xz", "gzip", "bzip2", "lzma", "zstd", "lz4"])
def test_every_kernel_compression_is_found(kind, tmp_path):
    """A payload behind a prefix is found by its magic, as scripts/extract-vmlinux does."""
    import bz2
    import gzip

    payload = b"\x7fELF" + bytes(random.Random(4).randrange(4) for _ in range(100_000))
    if kind == "xz":
        packed = lzma.compress(payload, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)
    elif kind == "lzma":
        packed = lzma.compress(payload, format=lzma.FORMAT_ALONE)
    elif kind == "gzip":
        packed = gzip.compress(payload)
    elif kind == "bzip2":
        packed = bz2.compress(payload)
    else:
        tool = {"zstd": ["zstd", "-q", "-c"], "lz4": ["lz4", "-l", "-q", "-c"]}[kind]  # lz4 -l: the kernel's legacy format
        if shutil.which(tool[0]) is None:
            pytest.skip(f"no {tool[0]} command to make a {kind} payload")
        packed = subprocess.run(tool, input=payload, capture_output=True, check=True).stdout
    image = bytes(4096) + packed + (len(payload)).to_bytes(4, "little")
    out, got = decompress_bzimage(image)
    assert got == kind and out == payload


def test_debian_kernel_banner_btf_and_embedded_kallsyms(debian_kernel):
    vm = debian_kernel.vmlinux
    assert debian_kernel.kind == "bzImage (xz)"
    table = read_kallsyms_table(vm)
    syms = table.symbols
    lines = [f"{s.address:016x} {s.type} {s.name}" for s in syms]
    by = {s.name: s.address for s in syms}
    for name, addr in GUEST_LINK_ADDRESSES.items():
        assert by[name] == addr, name
    assert len(syms) == GUEST_KALLSYMS_COUNT
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == GUEST_KALLSYMS_SHA256
    assert vm.vaddr_bytes(by["linux_banner"], len(GUEST_BANNER) + 1) == GUEST_BANNER + b"\x00"
    tables = {t.name: t.address for t in table.tables}
    for name, addr in GUEST_KALLSYMS_TABLES.items():
        assert tables[name] == addr, name
    assert vm.vaddr_bytes(tables["kallsyms_num_syms"], 4) == GUEST_KALLSYMS_COUNT.to_bytes(4, "little")
    exported = exported_symbols(vm)  # the kernel's other record of ~10k addresses
    assert len(exported) > 5000
    every = {}
    for sym in syms:
        every.setdefault(sym.name, set()).add(sym.address)
    assert all(addr in every[name] for name, addr in exported.items())
    btf = parse_btf(debian_kernel.btf)
    m = btf.member_offsets("task_struct")
    assert btf.struct("task_struct").size == GUEST_TASK_STRUCT["size"]
    for name in ("pid", "comm", "mm", "tasks", "__state"):
        assert m[name][0] == GUEST_TASK_STRUCT[name], name


def test_debian_isf(debian_isf):
    info, doc = debian_isf
    assert info.banner == GUEST_BANNER + b"\x00"
    assert base64.b64decode(doc["symbols"]["linux_banner"]["constant_data"]) == GUEST_BANNER + b"\x00"
    assert doc["metadata"]["format"] == "6.2.0" and doc["metadata"]["producer"]["name"] == "zen"
    ts = doc["user_types"]["task_struct"]
    assert ts["size"] == GUEST_TASK_STRUCT["size"]
    for name in ("pid", "comm", "mm", "tasks", "__state"):
        assert ts["fields"][name]["offset"] == GUEST_TASK_STRUCT[name]
    assert ts["fields"]["comm"]["type"] == {"count": 16, "kind": "array", "subtype": {"kind": "base", "name": "char"}}
    for name, addr in {**GUEST_LINK_ADDRESSES, **GUEST_KALLSYMS_TABLES}.items():
        assert doc["symbols"][name]["address"] == addr
    assert doc["symbols"]["taint_flags"]["type"]["count"] == 19  # TAINT_FLAGS_COUNT of 6.1, measured in .rodata
    assert doc["symbols"]["kallsyms_num_syms"]["type"] == {"kind": "base", "name": "unsigned int"}
    assert doc["symbols"]["init_task"]["type"] == {"kind": "struct", "name": "task_struct"}
    assert "mm_mt" in json.dumps(doc["user_types"]["mm_struct"]) or "mm_mt" in json.dumps(doc["user_types"])
    _check_closed(doc)
    assert read_isf_banner(info.path) == GUEST_BANNER.rstrip(b"\x00")


def test_volatility_reads_the_isf(debian_isf):
    """Volatility's own loader (no image needed) sees the layout and the banner."""
    import volatility3.framework.symbols.linux.extensions.bash  # noqa: F401  (what Volatility's CLI imports)
    import volatility3.framework.symbols.linux.extensions.elf  # noqa: F401
    import volatility3.framework.symbols.linux.extensions.network  # noqa: F401
    from volatility3.framework import contexts
    from volatility3.framework.symbols.linux import LinuxKernelIntermedSymbols

    info, doc = debian_isf
    ctx = contexts.Context()
    table = LinuxKernelIntermedSymbols(ctx, "zen.test", "vmlinux", info.path.resolve().as_uri(), validate=False)
    ctx.symbol_space.append(table)
    ts = ctx.symbol_space.get_type("vmlinux!task_struct")
    assert ts.size == GUEST_TASK_STRUCT["size"]
    assert ts.relative_child_offset("comm") == GUEST_TASK_STRUCT["comm"]
    mm = ctx.symbol_space.get_type("vmlinux!mm_struct")
    assert mm.has_member("mm_mt") and mm.has_member("pgd")  # anonymous inner struct, flattened
    banner = ctx.symbol_space.get_symbol("vmlinux!linux_banner")
    assert banner.constant_data == GUEST_BANNER + b"\x00"
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return  # Volatility then skips validation too
    from volatility3 import schemas

    assert schemas.validate(doc, use_cache=False)


def test_build_is_deterministic_and_cached(debian_deb, debian_isf, tmp_path):
    info, _doc = debian_isf
    again = build_isf(deb=debian_deb, out=tmp_path / "b.json.xz", use_cache=True)
    assert not again.cached and again.path.read_bytes() == info.path.read_bytes()
    third = build_isf(deb=debian_deb, use_cache=True)
    assert third.cached and third.sha256 == info.sha256
    assert find_isf_for_banner(GUEST_BANNER + b"\x00", [third.path.parent]) == third.path
    assert find_isf_for_banner(b"Linux version 0.0.1 (nobody)", [third.path.parent]) is None


def test_foreign_isf_banner_is_read(tmp_path):
    banner = {"address": 1, "constant_data": base64.b64encode(GUEST_BANNER + b"\0").decode()}
    meta = {"format": "6.2.0", "producer": {"name": "dwarf2json"}}
    doc = {"metadata": meta, "base_types": {}, "user_types": {}, "enums": {}, "symbols": {"linux_banner": banner}}
    p = tmp_path / "d2j.json"
    p.write_text(json.dumps(doc))
    assert read_isf_banner(p) == GUEST_BANNER
    assert find_isf_for_banner(GUEST_BANNER, [tmp_path]) == p


# -- symbol files and KASLR ----------------------------------------------------------------------------


def _host_kallsyms() -> list[tuple[int, str, str]]:
    try:
        text = Path("/proc/kallsyms").read_text()
    except OSError:
        pytest.skip("/proc/kallsyms not readable")
    rows = []
    for line in text.splitlines():
        p = line.split()
        if len(p) == 3:
            rows.append((int(p[0], 16), p[1], p[2]))
    if not rows or all(a == 0 for a, _, _ in rows):
        pytest.skip("/proc/kallsyms shows no addresses here (not root, or kptr_restrict)")
    return rows


def test_kaslr_shift_is_removed_except_per_cpu(tmp_path, host_btf):
    rows = _host_kallsyms()
    text = next(a for a, _, n in rows if n == "_text")
    shift = 0x2E600000
    lines = ["0000000000000000 A fixed_percpu_data", "000000000001fb80 A current_task"]
    lines += [f"{a + shift if a >= 0xFFFFFFFF80000000 and t not in 'Aa' else a:016x} {t} {n}" for a, t, n in rows]
    lines += ["ffffffffc0a00000 t some_module_fn\t[some_module]"]
    if not any(n == "init_task" for _a, _t, n in rows):
        # this host's kernel lists functions only (no CONFIG_KALLSYMS_ALL): without init_task the
        # ISF is refused; after checking that, add the two data symbols Volatility needs
        f = tmp_path / "kallsyms-functions-only"
        f.write_text("\n".join(lines) + "\n")
        with pytest.raises(KernelSymbolsError, match="init_task"):
            build_isf(btf=HOST_BTF, kallsyms=f, banner=b"Linux version x", use_cache=False)
        rows = rows + [(text + 0x1A1AA40, "D", "init_task"), (text + 0x11613E0, "D", "linux_banner")]
        lines += [f"{a + shift:016x} {t} {n}" for a, t, n in rows[-2:]]
    f = tmp_path / "kallsyms"
    f.write_text("\n".join(lines) + "\n")
    sf = load_symbol_file(f, text)
    assert sf.kaslr_shift == shift and sf.module_symbols == 1
    got = {s.name: s.address for s in sf.symbols}
    assert got["fixed_percpu_data"] == 0 and got["current_task"] == 0x1FB80
    for a, _t, n in rows[:: max(1, len(rows) // 2000)]:
        assert got[n] == a or n in {"fixed_percpu_data", "current_task"} or sum(1 for r in rows if r[2] == n) > 1, n
    # the whole path: host BTF + randomised kallsyms + banner -> ISF with link-time addresses
    banner = Path("/proc/version").read_bytes()
    info = build_isf(btf=HOST_BTF, kallsyms=f, banner=banner, out=tmp_path / "host.json.xz", use_cache=False)
    doc = json.loads(lzma.decompress(info.path.read_bytes()))
    assert doc["symbols"]["_text"]["address"] == text
    assert base64.b64decode(doc["symbols"].get("linux_banner", {}).get("constant_data", "")) in (b"", banner + b"\0")
    assert info.kaslr_shift == shift and any("KASLR" in n for n in info.notes)
    _check_closed(doc)


def test_unusable_symbol_files_are_refused(tmp_path):
    zeros = tmp_path / "kallsyms-zeros"
    zeros.write_text("".join(f"0000000000000000 T fn{i}\n" for i in range(100)) + "0000000000000000 T _text\n")
    with pytest.raises(SymbolFileError, match="kptr_restrict") as ei:
        load_symbol_file(zeros, None)
    assert "root" in (ei.value.hint or "")
    placeholder = tmp_path / "System.map"
    placeholder.write_text("ffffffffffffffff B The real System.map is in the linux-image-<version>-dbg package\n")
    with pytest.raises(SymbolFileError, match="no kernel symbols"):
        load_symbol_file(placeholder, None)
    junk = tmp_path / "junk"
    junk.write_bytes(bytes(random.Random(3).randrange(32, 127) for _ in range(20000)))
    with pytest.raises(KernelSymbolsError):
        load_symbol_file(junk, None)
    with pytest.raises(KernelSymbolsError, match="no symbol addresses"):
        build_isf(btf=HOST_BTF, use_cache=False)
    with pytest.raises(KernelSymbolsError, match="no type information"):
        build_isf(kallsyms=zeros, use_cache=False)


def test_kallsyms_of_another_build_is_refused(debian_deb, tmp_path):
    other = tmp_path / "kallsyms"
    other.write_text("ffffffff81000000 T _text\nffffffff82000000 D init_task\nffffffff82100000 D linux_banner\n" * 1)
    with pytest.raises(SymbolFileError, match="another kernel build"):
        build_isf(deb=debian_deb, kallsyms=other, use_cache=False)


def test_cli_errors_are_zen_errors(tmp_path):
    import typer
    from typer.testing import CliRunner

    from zen.cli.symbols import symbols

    app = typer.Typer()
    app.command("symbols")(symbols)
    app.command("other")(lambda: None)
    r = CliRunner().invoke(app, ["symbols", "--kernel", str(tmp_path / "missing")])
    assert isinstance(r.exception, ZenError) and re.search("no such file", str(r.exception))
    bad = tmp_path / "vmlinuz"
    bad.write_bytes(b"MZ" + bytes(5000))
    r = CliRunner().invoke(app, ["symbols", "--kernel", str(bad), "-o", str(tmp_path / "x.json.xz")])
    assert isinstance(r.exception, ZenError) and r.exception.hint
