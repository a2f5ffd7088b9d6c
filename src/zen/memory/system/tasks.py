"""Processes of a whole-machine image and their memory mappings, read with Volatility's objects.

Everything read here comes from the image's kernel data structures, which an attacker or a
corrupt dump may have made cyclic or huge: the task list, VMA trees and command lines are walked
with hard caps, and a structure that fails to read is skipped with a note rather than aborting
the listing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from zen.memory.regions import Region, Source
from zen.memory.system import kernel_walks as kw
from zen.memory.system.kernel import Kernel
from zen.memory.system.kernel_memory import KernelMemory, Unsupported

MAX_TASKS = 1 << 17  # pid_max's default ceiling on 64-bit is 4M, but real machines have < 100k
MAX_VMAS = 1 << 16  # vm.max_map_count's default is 65530
MAX_CMDLINE = 1 << 16
_PYTHON_EXE = re.compile(r"/python(\d)(?:\.(\d+))?[a-z]*$")
_LIBPYTHON = re.compile(r"/libpython(\d)\.(\d+)[a-z]*\.so")
_TORCH = re.compile(r"/libtorch(?:_cpu)?\.so|/torch/_C\.")
# vm_flags bits (include/linux/mm.h)
VM_READ, VM_WRITE, VM_EXEC, VM_SHARED = 0x1, 0x2, 0x4, 0x8


@dataclass
class ProcessEntry:
    """One process (thread-group leader) of the image, as `zen ps` shows it."""

    pid: int
    ppid: int
    uid: int | None
    comm: str
    cmdline: str = ""
    start_time: str | None = None  # ISO 8601, UTC, as ps would compute it from boot time
    kernel_thread: bool = False
    python: str | None = None  # "3.11" when a libpython or python executable is mapped
    torch: bool = False
    task: Any = field(default=None, repr=False, compare=False)  # Volatility's object, made when needed (`task_object`)
    addr: int = field(default=0, repr=False, compare=False)  # the task_struct's kernel virtual address
    vmas: list[Region] | None = field(default=None, repr=False, compare=False)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "uid": self.uid,
            "comm": self.comm,
            "cmdline": self.cmdline,
            "start_time": self.start_time,
            "kernel_thread": self.kernel_thread,
            "python": self.python,
            "torch": self.torch,
        }


def walked(items, limit: int, problems: list[str], what: str):
    """Items of a Volatility walk (task list, VMA tree), at most `limit`; a walk that fails part way through damaged
    kernel structures (a page fault, "Unknown Maple Tree node type", a cycle) ends with a problem naming it, and
    what was read before stays usable."""
    it = iter(items)
    for n in range(limit + 1):
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - Volatility raises many types for damaged structures
            problems.append(f"{what}: the walk stopped after {n} entries ({type(exc).__name__}: {str(exc)[:120]})")
            return
        if n == limit:
            problems.append(f"{what}: more than {limit} entries: the rest are ignored (corrupt or hostile structure?)")
            return
        yield item


def list_processes(kernel: Kernel, *, details: bool = True) -> list[ProcessEntry]:
    """Thread-group leaders in the kernel's task list, sorted by pid.

    With `details`, user processes also get their command line and, from their mappings, whether
    they run Python and have torch loaded (what `zen ps` and the automatic choice need).
    """
    out: list[ProcessEntry] = []
    walk_problems: list[str] = []
    if kernel.memory is not None:
        try:
            out = _list_direct(kernel, kernel.memory, details, walk_problems)
        except Unsupported:
            out = []
    if not out:  # the reference, for a layout the direct reader lacks (or to say why nothing is listed)
        walk_problems.clear()
        out = _list_volatility(kernel, details, walk_problems)
    if out and walk_problems:
        out[0].problems.extend(walk_problems)  # shown with the listing (zen ps) and kept in the record
    if not out:
        from zen.runtime.errors import ImageError

        raise ImageError(
            "the kernel's task list is empty or unreadable: the page tables or symbols do not fit this image",
            "check that the symbols are this kernel's (`zen symbols`), and that the machine did not use 5-level paging",
        )
    out.sort(key=lambda e: e.pid)
    return out


def _list_direct(kernel: Kernel, km: KernelMemory, details: bool, walk_problems: list[str]) -> list[ProcessEntry]:
    """The task list read with the ISF's offsets (`kernel_walks`): what `_list_volatility` lists, without an object
    per field."""
    out: list[ProcessEntry] = []
    seen: set[int] = set()
    for addr in kw.task_addresses(km, MAX_TASKS, walk_problems):
        if not kw.task_valid(km, addr):
            continue
        f = kw.task_facts(km, addr)
        if f is None or f.pid in seen or f.pid <= 0:
            continue
        seen.add(f.pid)
        entry = ProcessEntry(pid=f.pid, ppid=f.ppid, uid=f.uid, comm=f.comm, kernel_thread=f.kernel_thread, addr=addr)
        if details and not entry.kernel_thread:
            fill_details(kernel, entry)
        out.append(entry)
    return out


def _list_volatility(kernel: Kernel, details: bool, walk_problems: list[str]) -> list[ProcessEntry]:
    """The task list through Volatility's objects (the reference; kernels whose layout `kernel_walks` lacks)."""
    from volatility3.framework import exceptions
    from volatility3.plugins.linux import pslist

    out: list[ProcessEntry] = []
    seen: set[int] = set()
    try:
        tasks = pslist.PsList.list_tasks(kernel.ctx, kernel.module_name)
    except Exception as exc:  # noqa: BLE001 - the task list head itself is unreadable
        tasks, walk_problems = [], [f"the task list: unreadable ({type(exc).__name__}: {str(exc)[:120]})"]
    for task in walked(tasks, MAX_TASKS, walk_problems, "the kernel's task list"):
        try:
            pid = int(task.pid)
            if pid in seen or pid <= 0:
                continue
            seen.add(pid)
            entry = ProcessEntry(
                pid=pid,
                ppid=_ppid(task),
                uid=_uid(task),
                comm=_text(task.comm.cast("string", max_length=16, errors="replace")),
                kernel_thread=bool(task.is_kernel_thread),
                task=task,
                addr=int(task.vol.offset),
            )
        except (exceptions.InvalidAddressException, Exception):  # noqa: BLE001 - a damaged task: skipped
            continue
        if details and not entry.kernel_thread:
            fill_details(kernel, entry)
        out.append(entry)
    return out


def task_object(kernel: Kernel, entry: ProcessEntry):
    """Volatility's task_struct object of an entry (made on first use: the first one makes Volatility build the
    ~1,500 types reachable from task_struct)."""
    if entry.task is None:
        entry.task = kernel.ctx.object(kernel.table_name + "!task_struct", layer_name=kernel.layer_name, offset=entry.addr)
    return entry.task


def fill_details(kernel: Kernel, entry: ProcessEntry) -> None:
    """Command line, start time, and (from the mappings) Python version and torch of a process."""
    from volatility3.framework import exceptions

    entry.start_time = _start_time(kernel, entry)
    entry.cmdline = read_cmdline(kernel, entry)
    try:
        names = mapped_file_names(kernel, entry)
    except (exceptions.InvalidAddressException, Exception) as exc:  # noqa: BLE001 - Volatility's many types
        entry.problems.append(f"mappings unreadable: {type(exc).__name__}: {str(exc)[:120]}")
        names = set()
    entry.python = python_version([Region(0, 1, "r--p", "/" + n) for n in sorted(names)])
    entry.torch = any(_TORCH.search("/" + n) for n in names)


def _direct(kernel: Kernel, entry: ProcessEntry) -> KernelMemory | None:
    """The direct reader where it serves this entry (else Volatility's objects)."""
    return kernel.memory if kernel.memory is not None and entry.addr else None


def _mm(km: KernelMemory, entry: ProcessEntry) -> int:
    return km.field(entry.addr, "task_struct", "mm") or 0


def mapped_file_names(kernel: Kernel, entry: ProcessEntry) -> set[str]:
    """Base names of the files a process maps, one dentry read per distinct file.

    Enough to tell Python and torch processes apart, at a fraction of the cost of full paths
    (Volatility's path walk costs ~3 ms a mapping: minutes for a machine's hundreds of processes);
    full paths are built only for the process zen analyses (`process_vmas`).
    """
    km = _direct(kernel, entry)
    if km is not None:
        try:
            return _direct_file_names(km, entry)
        except Unsupported:
            pass
    mm = task_object(kernel, entry).mm
    names: set[str] = set()
    if not mm:
        return names
    seen: set[int] = set()
    # Volatility's per-VMA validity check (an inode read per mapping) is most of the cost; a name
    # only decides how a process is labelled, so the raw walk with zen's own bounds suffices here.
    walk = getattr(mm, "_do_get_vma_iter", mm.get_vma_iter)
    for vma in walked(walk(), MAX_VMAS, entry.problems, "the VMA tree"):
        try:
            if not 0 <= int(vma.vm_start) < int(vma.vm_end) <= 1 << 57:
                continue
            f = int(vma.vm_file)
        except Exception:  # noqa: BLE001
            continue
        if not f or f in seen:
            continue
        seen.add(f)
        try:
            name = vma.vm_file.dereference().f_path.dentry.dereference().d_name.name
            names.add(_text(name.dereference().cast("string", max_length=255, errors="replace")))
        except Exception:  # Volatility raises several types for unreadable or odd dentries
            continue
    return names


def _direct_file_names(km: KernelMemory, entry: ProcessEntry) -> set[str]:
    mm = _mm(km, entry)
    names: set[str] = set()
    if not mm:
        return names
    seen: set[int] = set()
    for vma in kw.vma_addresses(km, mm, MAX_VMAS, entry.problems):
        f = kw.vma_facts(km, vma, checked=False)
        if f is None or not 0 <= f.start < f.end <= 1 << 57 or not f.file or f.file in seen:
            continue
        seen.add(f.file)
        name = kw.file_name(km, f.file)
        if name is not None:
            names.add(name)
    return names


def _text(v) -> str:
    return str(v).split("\x00", 1)[0]


def _ppid(task) -> int:
    try:
        return int(task.get_parent_pid())
    except Exception:
        return 0


def _uid(task) -> int | None:
    try:
        return int(task.cred.uid.val) if hasattr(task.cred.uid, "val") else int(task.cred.uid)
    except Exception:
        return None


def _start_time(kernel: Kernel, entry: ProcessEntry) -> str | None:
    km = _direct(kernel, entry)
    if km is not None:
        try:
            return kw.start_time(km, entry.addr)
        except Unsupported:
            pass
    try:
        t = task_object(kernel, entry).get_create_time()
    except Exception:
        return None
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else None


def process_layer(kernel: Kernel, entry: ProcessEntry) -> str | None:
    """Name of the Volatility layer translating this process's virtual addresses (its own pgd)."""
    from volatility3.framework import exceptions

    try:
        return task_object(kernel, entry).add_process_layer()
    except (exceptions.InvalidAddressException, Exception):  # noqa: BLE001 - a damaged mm or pgd
        return None


def read_cmdline(kernel: Kernel, entry: ProcessEntry) -> str:
    """The command line from the process's own memory (mm->arg_start..arg_end), as /proc shows it."""
    from volatility3.framework import exceptions

    km = _direct(kernel, entry)
    if km is not None:
        return _direct_cmdline(km, entry)
    try:
        mm = task_object(kernel, entry).mm
        if not mm:
            return ""
        start, end = int(mm.arg_start), int(mm.arg_end)
        name = process_layer(kernel, entry)
        if name is None or not 0 < end - start <= MAX_CMDLINE:
            return ""
        data = kernel.ctx.layers[name].read(start, end - start)
    except (exceptions.InvalidAddressException, Exception):  # noqa: BLE001 - unreadable: no command line
        return ""
    return _cmdline_text(data)


def _cmdline_text(data: bytes) -> str:
    return " ".join(p.decode("utf-8", "surrogateescape") for p in data.rstrip(b"\x00").split(b"\x00"))


def _direct_cmdline(km: KernelMemory, entry: ProcessEntry) -> str:
    mm = _mm(km, entry)
    try:
        start = km.field(mm, "mm_struct", "arg_start") if mm else None
        end = km.field(mm, "mm_struct", "arg_end") if mm else None
        top = _pgd(km, mm) if mm else None
    except Unsupported:
        return ""
    if start is None or end is None or top is None or not 0 < end - start <= MAX_CMDLINE:
        return ""
    data = km.read(start, end - start, dtb=top)
    return "" if data is None else _cmdline_text(data)


def _pgd(km: KernelMemory, mm: int) -> int | None:
    pgd = km.field(mm, "mm_struct", "pgd")
    return None if not pgd else km.translate(pgd)


def pgd_physical(kernel: Kernel, entry: ProcessEntry) -> int | None:
    """Physical address of the process's top page table (mm->pgd translated), or None for a damaged mm."""
    from volatility3.framework import exceptions

    km = _direct(kernel, entry)
    if km is not None:
        try:
            mm = _mm(km, entry)
            return _pgd(km, mm) if mm else None
        except Unsupported:
            pass
    try:
        pgd = int(task_object(kernel, entry).mm.pgd)
        return kernel.ctx.layers[kernel.layer_name].translate(pgd)[0]
    except (exceptions.InvalidAddressException, Exception):  # noqa: BLE001 - damaged mm: no page tables
        return None


def process_vmas(kernel: Kernel, entry: ProcessEntry) -> list[Region]:
    """The process's mappings as zen `Region`s (paths as the process saw them, from its root)."""
    if entry.vmas is not None:
        return entry.vmas
    km = _direct(kernel, entry)
    regions = None
    if km is not None:
        try:
            regions = _direct_vmas(kernel, km, entry)
        except Unsupported:
            regions = None
    if regions is None:
        regions = _volatility_vmas(kernel, entry)
    regions.sort(key=lambda r: r.start)
    # A hostile tree can hand out overlapping ranges: keep the first of any overlap.
    clean: list[Region] = []
    for r in regions:
        if clean and r.start < clean[-1].end:
            entry.problems.append(f"overlapping mappings at {r.start:#x} in the VMA tree: the later one is ignored")
            continue
        clean.append(r)
    entry.vmas = clean
    return clean


def _region(start: int, end: int, flags: int, path: str, offset: int) -> Region:
    perms = (
        ("r" if flags & VM_READ else "-")
        + ("w" if flags & VM_WRITE else "-")
        + ("x" if flags & VM_EXEC else "-")
        + ("s" if flags & VM_SHARED else "p")
    )
    return Region(start, end, perms, "" if path == "Anonymous Mapping" else path, offset, Source.IMAGE)


def _direct_vmas(kernel: Kernel, km: KernelMemory, entry: ProcessEntry) -> list[Region]:
    """`_volatility_vmas` read with the ISF's offsets; a file named by its filesystem (a socket, a memfd) is named
    by Volatility's own code, once per file."""
    mm = _mm(km, entry)
    regions: list[Region] = []
    if not mm:
        return regions
    problems: list[str] = []
    addresses = kw.vma_addresses(km, mm, MAX_VMAS, problems)
    paths: dict[int, str] = {}
    for vma in addresses:
        f = kw.vma_facts(km, vma, checked=True)
        if f is None or not 0 <= f.start < f.end <= 1 << 57:
            continue
        path = paths.get(f.file) if f.file else None
        if path is None:
            try:
                path = kw.vma_name(km, entry.addr, mm, vma, f) or ""
            except Unsupported:
                path = _volatility_vma_name(kernel, entry, vma)
            if f.file:
                paths[f.file] = path
        regions.append(_region(f.start, f.end, f.flags, path, f.pgoff << 12 if f.file else 0))
    entry.problems.extend(problems)
    return regions


def _volatility_vma_name(kernel: Kernel, entry: ProcessEntry, vma: int) -> str:
    try:
        obj = kernel.ctx.object(kernel.table_name + "!vm_area_struct", layer_name=kernel.layer_name, offset=vma)
        return obj.get_name(kernel.ctx, task_object(kernel, entry)) or ""
    except Exception:  # noqa: BLE001 - Volatility's many types for unreadable structures
        return ""


def _volatility_vmas(kernel: Kernel, entry: ProcessEntry) -> list[Region]:
    """The mappings through Volatility's objects (the reference; kernels whose layout `kernel_walks` lacks)."""
    from volatility3.framework import exceptions

    mm = task_object(kernel, entry).mm
    regions: list[Region] = []
    if not mm:
        return regions
    # A file's path is walked from its dentry up to the task's root: 4 ms of Volatility per VMA, and a Python
    # process maps each library four or five times through one `struct file`; so once per file.
    paths: dict[int, str] = {}
    for vma in walked(mm.get_vma_iter(), MAX_VMAS, entry.problems, "the VMA tree"):
        try:
            start, end, flags = int(vma.vm_start), int(vma.vm_end), int(vma.vm_flags)
            if not 0 <= start < end <= 1 << 57:
                continue
            file = int(vma.vm_file) if vma.vm_file else 0
            path = paths.get(file) if file else None
            if path is None:
                path = vma.get_name(kernel.ctx, task_object(kernel, entry)) or ""
                if file:
                    paths[file] = path
            offset = int(vma.vm_pgoff) << 12 if file else 0
        except (exceptions.InvalidAddressException, Exception):  # noqa: BLE001 - one damaged VMA: skipped
            continue
        regions.append(_region(start, end, flags, path, offset))
    return regions


def python_version(vmas: list[Region]) -> str | None:
    """ "3.11" when the process maps a libpython or runs a python executable, else None."""
    for r in vmas:
        m = _LIBPYTHON.search(r.path)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    for r in vmas:
        m = _PYTHON_EXE.search(r.path)
        if m and r.offset == 0:
            return f"{m.group(1)}.{m.group(2)}" if m.group(2) else m.group(1)
    return None
