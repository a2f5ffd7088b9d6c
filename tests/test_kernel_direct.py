"""Kernel structures read directly with the ISF's offsets (`kernel_memory`, `kernel_walks`), against Volatility.

On the real guest: the process listing, every user process's mappings with their paths, the page-table roots and
the KASLR shifts equal what Volatility's objects give (the reference), and the direct reader really served them.
On hand-built kernel memory: hostile structures (cyclic task lists, self-referencing maple nodes, dentry cycles,
names without an end, pointers out of the image, self-nesting anonymous members) cost bounded work and say so.
"""

from __future__ import annotations

import struct

import pytest

from zen.memory.system import kernel_walks as kw
from zen.memory.system.kernel_memory import KernelMemory, Unsupported

BASE = 0xFFFF888000000000  # the direct map: kernel virtual BASE + x is physical x here


def _facts(regions):
    return [(r.start, r.end, r.perms, r.path, r.offset) for r in regions]


@pytest.mark.parametrize("kind", ["elf", "lime"])
def test_direct_reads_equal_volatilitys_on_a_real_guest(guest, kind):
    from zen.memory.system.image import SystemImage
    from zen.memory.system.tasks import list_processes, pgd_physical, process_vmas

    if kind not in guest["images"]:
        pytest.skip(f"no {kind} image of the guest")
    img = SystemImage(guest["images"][kind], kind, [guest["symbols"]])
    try:
        k = img.kernel
        km = k.memory
        assert km is not None
        direct = list_processes(k)
        assert all(e.task is None for e in direct)  # no Volatility object was needed for the listing
        k.memory = None
        reference = list_processes(k)
        assert [e.to_json() for e in direct] == [e.to_json() for e in reference]
        assert [e.problems for e in direct] == [e.problems for e in reference]
        users = [(d, r) for d, r in zip(direct, reference) if not d.kernel_thread]
        assert len(users) >= 3 and any(d.pid == guest["record"]["workload_pid"] and d.torch for d, _ in users)
        mapped = 0
        for d, r in users:
            k.memory = None
            want, want_pgd = _facts(process_vmas(k, r)), pgd_physical(k, r)
            k.memory = km
            assert _facts(process_vmas(k, d)) == want, d.pid
            mapped += bool(want)
            assert pgd_physical(k, d) == want_pgd is not None
        assert mapped >= 3
        model = next(d for d, _ in users if d.pid == guest["record"]["workload_pid"])
        assert model.task is None  # every path of the model process was read directly
        assert len(model.vmas) > 100 and any(r.path.endswith(".so") for r in model.vmas)
        # init_task where the layout's offsets found it, read through Volatility's full table and objects
        space, bang = k.ctx.symbol_space, k.table_name + "!"
        at = space.get_symbol(bang + "init_task").address - 0xFFFFFFFF80000000 + k.facts.kaslr_shift
        task = k.ctx.object(bang + "task_struct", layer_name=k.phys_layer, offset=at)
        assert int(task.pid) == 0 and str(task.comm.cast("string", max_length=16)).startswith("swapper")
        files = int.from_bytes(task.files.cast("bytes", length=8), "little")
        assert files - space.get_symbol(bang + "init_files").address == k.facts.aslr_shift
    finally:
        img.close()


# -- hand-built kernel memory ------------------------------------------------------------------------------------
def _t(kind, name=None, **kw_):
    return {"kind": kind, **({"name": name} if name else {}), **kw_}


def _f(offset, typ, anonymous=False):
    return {"offset": offset, "type": typ, **({"anonymous": True} if anonymous else {})}


PTR = _t("pointer", subtype=_t("base", "void"))
ULONG, INT, UINT = _t("base", "long unsigned int"), _t("base", "int"), _t("base", "unsigned int")
TYPES = {
    "list_head": {"size": 16, "fields": {"next": _f(0, PTR), "prev": _f(8, PTR)}},
    "task_struct": {
        "size": 0x100,
        "fields": {
            "flags": _f(0x8, UINT),
            "tasks": _f(0x10, _t("struct", "list_head")),
            "pid": _f(0x20, INT),
            "tgid": _f(0x24, INT),
            "comm": _f(0x30, _t("array", count=16, subtype=_t("base", "char"))),
            "real_parent": _f(0x40, PTR),
            "cred": _f(0x48, PTR),
            "mm": _f(0x50, PTR),
            "active_mm": _f(0x58, PTR),
            "fs": _f(0x70, PTR),
        },
    },
    "cred": {"size": 16, "fields": {"uid": _f(8, _t("struct", "kuid_t"))}},
    "kuid_t": {"size": 4, "fields": {"val": _f(0, UINT)}},
    "mm_struct": {"size": 0x100, "fields": {"mm_mt": _f(0, _t("struct", "maple_tree")), "pgd": _f(0x20, PTR)}},
    "maple_tree": {"size": 24, "fields": {"ma_root": _f(8, PTR), "ma_flags": _f(16, UINT)}},
    "maple_node": {"size": 256, "fields": {"u": _f(0, _t("union", "maple_u"), anonymous=True)}},
    "maple_u": {
        "size": 256,
        "fields": {
            "mr64": _f(0, _t("struct", "maple_range_64")),
            "ma64": _f(0, _t("struct", "maple_arange_64")),
            "alloc": _f(0, _t("struct", "maple_alloc")),
        },
    },
    "maple_range_64": {"size": 256, "fields": {"slot": _f(128, _t("array", count=16, subtype=PTR))}},
    "maple_arange_64": {"size": 248, "fields": {"slot": _f(80, _t("array", count=10, subtype=PTR))}},
    "maple_alloc": {"size": 256, "fields": {"slot": _f(16, _t("array", count=30, subtype=PTR))}},
    "file": {"size": 64, "fields": {"f_path": _f(16, _t("struct", "path"))}},
    "path": {"size": 16, "fields": {"mnt": _f(0, PTR), "dentry": _f(8, PTR)}},
    "dentry": {
        "size": 64,
        "fields": {"d_parent": _f(24, PTR), "d_name": _f(32, _t("struct", "qstr")), "d_inode": _f(48, PTR), "d_op": _f(56, PTR)},
    },
    "qstr": {"size": 16, "fields": {"h": _f(0, _t("union", "qstr_h"), anonymous=True), "name": _f(8, PTR)}},
    "qstr_h": {"size": 8, "fields": {"hash": _f(0, UINT), "len": _f(4, UINT)}},
    "vfsmount": {"size": 32, "fields": {"mnt_root": _f(0, PTR)}},
    "mount": {
        "size": 64,
        "fields": {"mnt_parent": _f(16, PTR), "mnt_mountpoint": _f(24, PTR), "mnt": _f(32, _t("struct", "vfsmount"))},
    },
    "fs_struct": {"size": 64, "fields": {"root": _f(24, _t("struct", "path"))}},
    "inode": {"size": 64, "fields": {}},
    "loop": {"size": 8, "fields": {"x": _f(0, _t("union", "loop"), anonymous=True)}},  # nests itself
}
INIT_TASK = 0x10000


class RAM:
    """1 MiB of physical memory with one 1 GiB page mapping BASE to physical 0; counts reads so that an unbounded
    walk fails the test instead of hanging it."""

    def __init__(self, most_reads: int = 200_000) -> None:
        self.buf = bytearray(1 << 20)
        self.reads, self.most = 0, most_reads
        self.q(0x1000 + ((BASE >> 39) & 0x1FF) * 8, 0x2000 | 1)
        self.q(0x2000 + ((BASE >> 30) & 0x1FF) * 8, 0x80 | 1)

    def q(self, phys: int, value: int) -> None:
        self.buf[phys : phys + 8] = struct.pack("<Q", value & (1 << 64) - 1)

    def read(self, phys: int, size: int):
        self.reads += 1
        if self.reads > self.most:
            raise AssertionError("an unbounded walk")
        return bytes(self.buf[phys : phys + size]) if 0 <= phys and phys + size <= len(self.buf) else None

    def memory(self) -> KernelMemory:
        isf = {"user_types": TYPES, "symbols": {"init_task": {"address": BASE + INIT_TASK}}}
        return KernelMemory(isf, self.read, 0x1000, 0)


def _task(ram: RAM, at: int, pid: int, nxt: int, prv: int) -> None:
    ram.q(at + 0x10, BASE + nxt + 0x10)
    ram.q(at + 0x18, BASE + prv + 0x10)
    ram.buf[at + 0x20 : at + 0x28] = struct.pack("<ii", pid, pid)
    ram.buf[at + 0x30 : at + 0x36] = b"task" + bytes([48 + pid % 10, 0])


def test_translation_reads_and_layout_are_bounded():
    ram = RAM()
    km = ram.memory()
    ram.buf[0x5000:0x5004] = b"zen!"
    assert km.read(BASE + 0x5000, 4) == b"zen!" and km.translate(BASE + 0x5000) == 0x5000
    assert km.read(BASE + (1 << 20) - 2, 4) is None  # past the image
    assert km.translate(0x7F0000000000) is None and km.read(0x7F0000000000, 8) is None  # not mapped
    assert km.read(BASE, 2 << 20) is None  # more than MAX_READ is refused, not allocated
    assert km.offset("dentry", "d_name.len") == 36  # into an anonymous union
    with pytest.raises(Unsupported):
        km.offset("loop", "nothing")  # a type nesting itself anonymously: bounded search
    with pytest.raises(Unsupported):
        km.offset("task_struct", "no_such_member")


def test_task_list_cycles_and_caps():
    ram = RAM()
    _task(ram, INIT_TASK, 0, 0x11000, 0x12000)
    _task(ram, 0x11000, 1, 0x12000, INIT_TASK)
    _task(ram, 0x12000, 2, 0x11000, 0x11000)  # cycles back to 1 without returning to init_task
    km = ram.memory()
    problems: list[str] = []
    tasks = list(kw.task_addresses(km, 100, problems))
    assert tasks == [BASE + 0x11000, BASE + 0x12000] and problems == []
    assert [kw.task_facts(km, t).comm for t in tasks] == ["task1", "task2"]
    chain = [INIT_TASK + 0x1000 * i for i in range(1, 40)]
    for i, at in enumerate(chain):
        _task(ram, at, i + 1, chain[i + 1] if i + 1 < len(chain) else INIT_TASK, INIT_TASK)
    _task(ram, INIT_TASK, 0, chain[0], INIT_TASK)
    tasks = list(kw.task_addresses(ram.memory(), 10, problems))
    assert len(tasks) == 10 and "more than 10 entries" in problems[0]


def test_maple_tree_cycles_unknown_nodes_and_caps():
    ram = RAM()
    km = ram.memory()
    mm, node = 0x20000, 0x21000
    ram.q(mm + 8, BASE + node | (2 << 3))  # ma_root: a range node
    ram.q(node, BASE + mm)  # its parent: the tree
    ram.q(node + 128, BASE + node | (2 << 3))  # a slot pointing at its own node: visited once
    leaf = 0x22000
    ram.q(node + 136, BASE + leaf | (1 << 3))
    ram.q(leaf, BASE + node)
    for i in range(16):
        ram.q(leaf + 128 + 8 * i, BASE + 0x30000 + 0x100 * i)
    problems: list[str] = []
    assert len(kw.vma_addresses(km, BASE + mm, 100, problems)) == 16 and problems == []
    assert len(kw.vma_addresses(km, BASE + mm, 5, problems)) == 5 and "more than 5" in problems[-1]
    # every slot of a chain of range nodes naming the next: 16**6 paths to one leaf, each node visited once
    chain = [0x24000 + 0x1000 * i for i in range(6)]
    ram.q(mm + 8, BASE + chain[0] | (2 << 3))
    ram.q(chain[0], BASE + mm)
    for a, b in zip(chain, chain[1:]):
        for i in range(16):
            ram.q(a + 128 + 8 * i, BASE + b | (2 << 3))
        ram.q(b, BASE + a)
    for i in range(16):
        ram.q(chain[-1] + 128 + 8 * i, BASE + leaf | (1 << 3))
    ram.q(leaf, BASE + chain[-1])
    assert len(kw.vma_addresses(km, BASE + mm, 100, problems)) == 16 and ram.reads < 2000
    ram.q(mm + 8, BASE + node | (2 << 3))
    ram.q(node + 144, BASE + 0x23000 | (7 << 3))  # a node type the kernel does not have
    ram.q(0x23000, BASE + node)
    problems.clear()
    kw.vma_addresses(ram.memory(), BASE + mm, 100, problems)
    assert "unknown maple node type 7" in problems[0]


def test_dentry_cycles_and_endless_names_are_bounded():
    ram = RAM()
    km = ram.memory()
    task, fs, file, mnt = 0x40000, 0x41000, 0x42000, 0x43000 + 32  # mnt: the vfsmount inside a struct mount
    d1, d2, root = 0x44000, 0x45000, 0x46000
    ram.q(task + 0x70, BASE + fs)
    ram.q(fs + 24, BASE + mnt)
    ram.q(fs + 32, BASE + root)
    ram.q(file + 16, BASE + mnt)
    ram.q(file + 24, BASE + d1)
    ram.q(mnt, BASE + root)  # mnt_root
    for d, parent, name in ((d1, d2, 0x47000), (d2, d1, 0x48000)):  # d1 <-> d2: never reaches the root
        ram.q(d + 24, BASE + parent)
        ram.q(d + 40, BASE + name)
        ram.buf[d + 36 : d + 40] = struct.pack("<I", 0xFFFFFFFF)  # a length of 4 GiB
    ram.buf[0x47000:0x50000] = b"a" * 0x9000  # a name without its NUL
    path = kw.file_path(km, BASE + task, BASE + file)
    assert path.startswith("<potentially smeared> /aaaa") and len(path) < 3 * kw.MAX_PATH_DEPTH
    assert ram.reads < 200_000


def test_a_damaged_layout_cache_is_cut_again(tmp_path, monkeypatch):
    """The layout cache is the user's file: one that parses but lacks what the readers index is replaced by a fresh
    cut of the ISF, never indexed (a KeyError there would be an exit 70)."""
    import json

    from zen.memory.system.symbols.layout import isf_layout, layout_path
    from zen.memory.system.symbols.lookup import IsfMatch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    isf = tmp_path / "k.json"
    symbols = {"init_task": {"address": 0xFFFFFFFF82000000, "type": _t("struct", "task_struct")}, "unused": {"address": 1}}
    isf.write_text(json.dumps({"metadata": {"format": "6.2.0"}, "symbols": symbols, "user_types": TYPES}))
    match = IsfMatch(isf, b"Linux version x", "ab" * 32, "given (--symbols)")
    first = isf_layout(match)
    assert set(first["symbols"]) == {"init_task"} and "task_struct" in first["user_types"] and "loop" not in first["user_types"]
    for damaged in ({**first, "symbols": None}, {**first, "symbols": {"init_task": 5}}, [1, 2], {**first, "isf_sha256": "cd"}):
        layout_path(match.sha256).write_text(json.dumps(damaged))
        assert isf_layout(match) == first
