"""Where a whole-machine image's kernel structures lie, for the system kind of bench/fuzz_cli.py.

Random bytes over a 1.5 GiB image almost never land on the few hundred KB of kernel structures zen walks (the
task list, each process's mm, maple tree nodes, VMAs, files, dentries, mounts). These spans are those structures'
bytes in the file, found with zen's own direct reader on the unmutated image, so a mutation lands where a forged or
corrupt structure would be; pointer-sized words are set to other structures' addresses (cycles, shared nodes,
a node as its own parent) as well as to boundary values.
"""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

BOUNDARY = [0, 1, 0xFFF, 0x1000, 1 << 31, (1 << 32) - 1, 1 << 47, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def kernel_spans(image: Path, fmt: str, isf: list[Path]) -> tuple[list[tuple[int, int]], list[int]]:
    """(file spans of kernel structures, their kernel virtual addresses) in an unmutated image."""
    from zen.memory.system import kernel_walks as kw
    from zen.memory.system.image import SystemImage

    img = SystemImage(image, fmt, isf)
    k, spans, pointers = img.kernel, [], []
    km = k.memory

    def add(vaddr: int | None, type_name: str) -> None:
        size = km.size(type_name)
        p = km.translate(vaddr) if vaddr else None
        hit = k.phys.file_offset(p, size) if p is not None else None
        if hit:
            spans.append((hit[0], hit[0] + hit[1]))
            pointers.append(vaddr)

    try:
        for task in kw.task_addresses(km, 4096, []):
            add(task, "task_struct")
            mm = km.field(task, "task_struct", "mm")
            if not mm:
                continue
            add(mm, "mm_struct")
            nodes: list[int] = []
            for vma in kw.vma_addresses(km, mm, 1 << 16, [], nodes):
                add(vma, "vm_area_struct")
                file = km.field(vma, "vm_area_struct", "vm_file")
                if file:
                    add(file, "file")
                    add(km.field(file, "file", "f_path.dentry"), "dentry")
                    add(km.field(file, "file", "f_path.mnt"), "vfsmount")
            for node in nodes:
                add(node, "maple_node")
    finally:
        img.close()
    return spans, pointers


def mutate_kernel(src: Path, dst: Path, rng: random.Random, spans: list[tuple[int, int]], pointers: list[int]) -> str:
    """A copy of the image with 1-16 aligned words of its kernel structures changed."""
    shutil.copyfile(src, dst)
    n = rng.choice([1, 2, 4, 16])
    with open(dst, "r+b") as fh:
        for _ in range(n):
            lo, hi = rng.choice(spans)
            fh.seek(lo + rng.randrange(max(1, (hi - lo) // 8)) * 8)
            r = rng.random()
            if r < 0.5:
                value = rng.choice(pointers) + rng.choice([0, 0, 8, 16, -16, 0x10, 0x100])
            elif r < 0.8:
                value = rng.choice(BOUNDARY)
            else:
                value = rng.getrandbits(64)
            fh.write(struct.pack("<Q", value & (1 << 64) - 1))
    return f"kernel words x{n}"
