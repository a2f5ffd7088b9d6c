"""The task list, a process's VMA tree, file paths and start times, read with `KernelMemory`.

Each function does what the Volatility extension named in its docstring does (same members, same validity
checks, same text), so `zen ps` and the case record say the same with either reader; the tests compare them on
real guests. Each walk is bounded by its caller's cap and stops at a cycle; a structure this reader does not know
raises `Unsupported` before anything is returned, so the caller can use Volatility for the whole walk.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass

from zen.memory.system.kernel_memory import KernelMemory, Unsupported

PF_KTHREAD = 0x00200000
MAPLE_NODE_MASK = 0xFF  # low bits of a maple entry: node type and flags
MAPLE_DENSE, MAPLE_LEAF_64, MAPLE_RANGE_64, MAPLE_ARANGE_64 = 0, 1, 2, 3
PAGE_FLOOR = 0x1000  # slot values below this are not VMA pointers (Volatility drops them too)
TOO_MANY = "more than {} entries: the rest are ignored (corrupt or hostile structure?)"
MAX_PATH_DEPTH = 4096  # dentries and mounts walked for one path, and characters of it (PATH_MAX is 4096 bytes)
NSEC = 1_000_000_000


@dataclass
class TaskFacts:
    """What `zen ps` lists for one task, read directly."""

    addr: int
    pid: int
    tgid: int
    ppid: int
    uid: int | None
    comm: str
    kernel_thread: bool


def task_addresses(km: KernelMemory, limit: int, problems: list[str]) -> Iterator[int]:
    """Tasks on init_task's `tasks` list (thread-group leaders, init_task itself not included), forward then backward
    as `PsList.list_tasks` walks it, each once; at most `limit`, ending at a cycle or an unreadable link."""
    link = km.offset("task_struct", "tasks")
    head = km.symbol("init_task") + link
    seen: set[int] = set()
    for step in (0, 8):  # list_head.next, list_head.prev
        node = km.u64(head + step)
        links = {head}
        while node and km.readable(node, 16) and node not in links:
            task = node - link
            if km.translate(task) is None:
                break
            if task not in seen:
                if len(seen) >= limit:
                    problems.append("the kernel's task list: " + TOO_MANY.format(limit))
                    return
                seen.add(task)
                yield task
            links.add(node)
            node = km.u64(node + step)


def task_valid(km: KernelMemory, task: int) -> bool:
    """`task_struct.is_valid`: the whole struct readable, pid and tgid not negative, its signal, nsproxy and parent
    readable, its mm readable and the same as active_mm."""
    ts = km.size("task_struct")
    if not km.readable(task, ts):
        return False
    for member in ("pid", "tgid"):
        if (km.field(task, "task_struct", member, 4, signed=True) or 0) < 0:
            return False
    for member, kind in (("signal", "signal_struct"), ("nsproxy", "nsproxy"), ("real_parent", "task_struct")):
        if km.has("task_struct", member):
            p = km.field(task, "task_struct", member)
            if not (p and km.readable(p, km.size(kind))):
                return False
    active = km.field(task, "task_struct", "active_mm") if km.has("task_struct", "active_mm") else None
    if active and not km.readable(active, km.size("mm_struct")):
        return False
    mm = km.field(task, "task_struct", "mm")
    if mm:
        if not km.readable(mm, km.size("mm_struct")) or mm != active:
            return False
    return True


def task_facts(km: KernelMemory, task: int) -> TaskFacts | None:
    """pid, tgid, parent's tgid, uid, comm and the kernel-thread flag, or None for an unreadable task (Volatility's
    `task_struct.pid`, `get_parent_pid`, `cred.uid`, `comm`, `is_kernel_thread`)."""
    pid = km.field(task, "task_struct", "pid", 4, signed=True)
    tgid = km.field(task, "task_struct", "tgid", 4, signed=True)
    flags = km.field(task, "task_struct", "flags", 4)
    comm = km.read(task + km.offset("task_struct", "comm"), 16)
    if pid is None or tgid is None or flags is None or comm is None:
        return None
    ppid = 0
    parent = km.field(task, "task_struct", "real_parent")
    if parent and km.readable(parent, km.size("task_struct")):
        ppid = km.field(parent, "task_struct", "tgid", 4, signed=True) or 0
    uid = None
    cred = km.field(task, "task_struct", "cred")
    if cred:
        uid = km.field(cred, "cred", "uid", 4)
    name = comm.decode("utf-8", errors="replace").split("\x00", 1)[0]
    return TaskFacts(task, pid, tgid, ppid, uid, name, bool(flags & PF_KTHREAD))


def start_time(km: KernelMemory, task: int) -> str | None:
    """ISO 8601 start time as `task_struct.get_create_time` computes it (boot time from tk_core, to the second, plus
    start_boottime), for kernels >= 5.5 (start_boottime) with tk_core; else Unsupported."""
    if not (km.has_symbol("tk_core") and km.has("task_struct", "start_boottime")):
        raise Unsupported("start time: kernel before 5.5")
    tk = km.symbol("tk_core") + km.offset(km.symbol_type("tk_core"), "timekeeper")
    real = km.field(tk, "timekeeper", "offs_real", 8, signed=True)
    boot = km.field(tk, "timekeeper", "offs_boot", 8, signed=True)
    started = km.field(task, "task_struct", "start_boottime", 8)
    if real is None or boot is None or started is None:
        return None
    sec, nsec = divmod(real - boot, NSEC)
    if sec + nsec / NSEC <= 0:
        return None
    try:
        at = datetime.datetime.fromtimestamp(sec + nsec / NSEC, datetime.UTC).replace(microsecond=0)
        ssec, snsec = divmod(started, NSEC)
        at += datetime.timedelta(seconds=ssec + snsec / NSEC)
    except (ValueError, OverflowError, OSError):
        return None
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def vma_addresses(km: KernelMemory, mm: int, limit: int, problems: list[str], nodes: list[int] | None = None) -> list[int]:
    """Addresses of the mm's vm_area_structs from its maple tree (kernels >= 6.1; `mm_struct._get_maple_tree_iter`:
    each node's parent pointer checked, slots of dense, leaf and range nodes followed, values under a page dropped),
    at most `limit` (the maple nodes visited are appended to `nodes` when given). Older kernels' VMA list:
    Unsupported (Volatility walks it)."""
    if not km.has("mm_struct", "mm_mt"):
        raise Unsupported("VMAs: a kernel before the maple tree")
    tree = mm + km.offset("mm_struct", "mm_mt")
    root = km.u64(tree + km.offset("maple_tree", "ma_root"))
    slots = {
        MAPLE_DENSE: (km.offset("maple_node", "alloc.slot"), _count(km, "maple_alloc", "slot")),
        MAPLE_LEAF_64: (km.offset("maple_node", "mr64.slot"), _count(km, "maple_range_64", "slot")),
        MAPLE_RANGE_64: (km.offset("maple_node", "mr64.slot"), _count(km, "maple_range_64", "slot")),
        MAPLE_ARANGE_64: (km.offset("maple_node", "ma64.slot"), _count(km, "maple_arange_64", "slot")),
    }
    out: list[int] = []
    if root is None:
        problems.append("the VMA tree: its root is unreadable")
        return out
    # Volatility starts at the root entry with the tree itself as the expected parent (ma_root's node points back
    # at the maple_tree with its flags in the low bits).
    stack: list[tuple[int, int]] = [(root, tree & ~MAPLE_NODE_MASK)]
    seen: set[int] = set()
    while stack:
        entry, parent = stack.pop()
        if entry in seen:
            continue
        seen.add(entry)
        node = entry & ~MAPLE_NODE_MASK
        kind = (entry >> 3) & 0xF
        back = km.u64(node)  # the node's parent pointer, its first word
        if back is None or back & ~MAPLE_NODE_MASK != parent:
            continue
        if kind not in slots:
            problems.append(f"the VMA tree: the walk stopped after {len(out)} entries (unknown maple node type {kind})")
            return out
        off, count = slots[kind]
        if nodes is not None:
            nodes.append(node)
        raw = km.read(node + off, 8 * count)
        if raw is None:
            continue
        values = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8)]
        live = [v for v in values if v & ~0xF]
        if kind in (MAPLE_DENSE, MAPLE_LEAF_64):
            for v in live:
                if v >= PAGE_FLOOR:
                    if len(out) >= limit:
                        problems.append("the VMA tree: " + TOO_MANY.format(limit))
                        return out
                    out.append(v)
        else:
            stack.extend((v, node) for v in reversed(live))
    return out


def _count(km: KernelMemory, type_name: str, member: str) -> int:
    _, typ = km.member(type_name, member)
    n = typ.get("count")
    if typ.get("kind") != "array" or not isinstance(n, int) or not 0 < n <= 64:
        raise Unsupported(f"{type_name}.{member} is not a slot array")
    return n


@dataclass
class VmaFacts:
    start: int
    end: int
    flags: int
    file: int
    pgoff: int


def vma_facts(km: KernelMemory, vma: int, checked: bool) -> VmaFacts | None:
    """A VMA's range, flags, file and page offset; with `checked`, None where `vm_area_struct.is_valid` says it is
    smeared (start > end, empty at 0, not page-sized, its file's inode unreadable, its offset past a sized inode)."""
    start = km.field(vma, "vm_area_struct", "vm_start")
    end = km.field(vma, "vm_area_struct", "vm_end")
    flags = km.field(vma, "vm_area_struct", "vm_flags")
    file = km.field(vma, "vm_area_struct", "vm_file")
    if start is None or end is None or flags is None or file is None:
        return None
    pgoff = km.field(vma, "vm_area_struct", "vm_pgoff") if file else 0
    if pgoff is None:
        return None
    if checked:
        if start > end or (start == 0 and end == 0) or (end - start) % PAGE_FLOOR:
            return None
        if file:
            inode = km.field(file, "file", "f_inode")
            if not inode or not km.readable(inode, km.size("inode")):
                return None
            isize = km.field(inode, "inode", "i_size", 8, signed=True)
            if isize is None:
                return None
            if isize > 0 and pgoff << 12 > isize:
                return None
    return VmaFacts(start, end, flags, file, pgoff)


class _Unreadable(Exception):
    """A pointer on the way to a path did not translate: the path is unknown (Volatility's get_name gives None)."""


def _must(value: int | None) -> int:
    if value is None:
        raise _Unreadable
    return value


def file_name(km: KernelMemory, file: int) -> str | None:
    """The base name of a mapped file (its dentry's d_name, 255 bytes decoded as Volatility's string cast), or None."""
    dentry = km.field(file, "file", "f_path.dentry")
    name = km.field(dentry, "dentry", "d_name.name") if dentry else None
    raw = km.read(name, 255) if name else None
    if raw is None:
        return None
    return raw.decode("utf-8", errors="replace").split("\x00", 1)[0]


def vma_name(km: KernelMemory, task: int, mm: int, vma: int, facts: VmaFacts) -> str | None:
    """What `vm_area_struct.get_name` says: the file's path from the task's root, [heap], [stack], [vdso] or
    "Anonymous Mapping"; None where Volatility's would be (a pointer on the way unreadable)."""
    try:
        if facts.file:
            return file_path(km, task, facts.file)
        if facts.start <= _must(km.field(mm, "mm_struct", "start_brk")) and facts.end >= _must(km.field(mm, "mm_struct", "brk")):
            return "[heap]"
        if facts.start <= _must(km.field(mm, "mm_struct", "start_stack")) <= facts.end:
            return "[stack]"
        if km.has("mm_context_t", "vdso"):
            owner = _must(km.field(vma, "vm_area_struct", "vm_mm"))
            if facts.start == _must(km.field(owner, "mm_struct", "context.vdso")):
                return "[vdso]"
        return "Anonymous Mapping"
    except _Unreadable:
        return None


def file_path(km: KernelMemory, task: int, file: int) -> str:
    """`LinuxUtilities.path_for_file` for files without a d_dname operation (regular files: the kernel's
    prepend_path from the dentry up through its mounts to the task's root, " (deleted)" for an unlinked inode);
    files named by their filesystem (sockets, pipes, anon inodes, memfds) raise Unsupported."""
    dentry = km.field(file, "file", "f_path.dentry")
    if dentry is None or km.field(dentry, "dentry", "d_parent") is None:
        return ""
    d_op = km.field(dentry, "dentry", "d_op")
    if d_op and km.field(d_op, "dentry_operations", "d_dname"):
        raise Unsupported("a file named by its filesystem (d_dname)")
    fs = _must(km.field(task, "task_struct", "fs"))
    root_dentry = _must(km.field(fs, "fs_struct", "root.dentry"))
    root_mnt = _must(km.field(fs, "fs_struct", "root.mnt"))
    mnt = _must(km.field(file, "file", "f_path.mnt"))
    dentry_size, vfsmount_size = km.size("dentry"), km.size("vfsmount")
    if not (km.readable(root_dentry, dentry_size) and km.readable(root_mnt, vfsmount_size) and km.readable(mnt, vfsmount_size)):
        return ""
    inode = _must(km.field(dentry, "dentry", "d_inode"))
    in_mount = km.offset("mount", "mnt")
    parts: list[str] = []
    smeared = False
    total = 0
    for _ in range(MAX_PATH_DEPTH):
        if total > MAX_PATH_DEPTH:  # longer than the kernel's PATH_MAX: a cycle or smear
            smeared = True
            break
        if not (dentry and km.readable(dentry, dentry_size)) or (dentry == root_dentry and mnt == root_mnt):
            break
        mnt_root = _must(km.field(mnt, "vfsmount", "mnt_root"))
        parent = _must(km.field(dentry, "dentry", "d_parent"))
        if dentry == mnt_root or dentry == parent:
            if dentry != mnt_root:
                break  # escaped its mount
            mount = mnt - in_mount
            up = _must(km.field(mount, "mount", "mnt_parent"))
            if up == mount:
                break  # the global root
            dentry = _must(km.field(mount, "mount", "mnt_mountpoint"))
            mnt = up + in_mount
            continue
        length = km.field(dentry, "dentry", "d_name.len", 4) if km.has("qstr", "len") else 254
        name_at = _must(km.field(dentry, "dentry", "d_name.name"))
        name = (km.string(name_at, min(_must(length) + 1, MAX_PATH_DEPTH)) or "") if name_at else ""
        smeared = smeared or not name
        parts.append(name.strip("/"))
        total += len(parts[-1]) + 1
        dentry = parent
    else:
        smeared = True  # a cycle of dentries or mounts: what was read is shown, marked
    path = "/" + "/".join(reversed(parts))
    if smeared:
        return f"<potentially smeared> {path}"
    if inode and km.readable(inode, km.size("inode")):
        ino = km.field(inode, "inode", "i_ino")
        count = km.field(inode, "inode", "i_count", 4, signed=True)
        links = km.field(inode, "inode", "i_nlink", 4)
        if ino and count is not None and count >= 0 and links == 0:
            path = f" {path} (deleted)"
    return path
