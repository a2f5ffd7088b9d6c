"""Joining host and device evidence: each CUDA device's memory as one address space of the host.

A CUDA process has one unified virtual address space: device allocations of every GPU get
distinct addresses, so a tensor's data pointer (read from the host image) names its bytes in the
GPU core of its device without translation. Several GPU cores may be given (one per device, or
per context of a multi-process server); their segments are merged per device, in the order given,
and a range two files both claim is kept from the first file, with a problem naming both.
A core whose device table is missing serves every CUDA device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from zen.memory.gpu.space import GpuCoreSpace, GpuLimits
from zen.memory.regions import Region
from zen.memory.space import AddressSpace, Chunk


class DeviceSpace(AddressSpace):
    """The memory of one device, from the segments of one or more GPU cores."""

    def __init__(self, device: str, parts: Sequence[GpuCoreSpace]) -> None:
        chunks: list[Chunk] = []
        regions: list[Region] = []
        problems: list[str] = []
        taken: list[tuple[int, int, str]] = []
        for part in parts:
            for c, r in zip(part.chunks, part.regions):
                clash = next((t for t in taken if c.start < t[1] and t[0] < c.end), None)
                if clash is not None:
                    problems.append(f"{device}: {part.path.name} {r.path} ({c.start:#x}-{c.end:#x}) overlaps "
                                    f"{clash[2]}: the first file's bytes are used")  # fmt: skip
                    continue
                taken.append((c.start, c.end, f"{part.path.name} {r.path}"))
                chunks.append(c)
                regions.append(r)
        super().__init__(regions, chunks, description=f"{device} memory from " + ", ".join(p.path.name for p in parts))
        self.problems += problems
        self.parts = list(parts)

    def close(self) -> None:
        for p in self.parts:
            p.close()

    def near(self, addr: int, size: int, n: int = 2) -> str:
        """The segments closest to [addr, addr+size), for a message about a range that is not covered."""
        if not self.chunks:
            return "the GPU image holds no device memory (dumped with skip_global_memory?)"
        dist = sorted(self.chunks, key=lambda c: 0 if c.start <= addr < c.end else min(abs(c.start - addr), abs(c.end - addr)))
        return "nearest segments: " + ", ".join(f"{c.start:#x}-{c.end:#x}" for c in sorted(dist[:n], key=lambda c: c.start))


def open_gpu_images(paths: Sequence[str | os.PathLike], limits: GpuLimits | None = None) -> list[GpuCoreSpace]:
    """Open each GPU core (closing the ones opened before if one fails)."""
    opened: list[GpuCoreSpace] = []
    try:
        for p in paths:
            opened.append(GpuCoreSpace(Path(p), limits))
    except BaseException:
        for g in opened:
            g.close()
        raise
    return opened


def attach_gpu_images(host: AddressSpace, paths: Sequence[str | os.PathLike],
                      limits: GpuLimits | None = None) -> list[GpuCoreSpace]:  # fmt: skip
    """Open the GPU cores and attach their memory to `host` as "cuda:N" device spaces."""
    cores = open_gpu_images(paths, limits)
    by_device: dict[str, list[GpuCoreSpace]] = {}
    for g in cores:
        names = [f"cuda:{d.index}" for d in g.core.devices] or ["cuda"]
        for name in names:
            by_device.setdefault(name, []).append(g)
    spaces: dict[str, AddressSpace] = {name: DeviceSpace(name, parts) for name, parts in by_device.items()}
    host.attach_devices(spaces, [g.evidence() for g in cores])
    for s in spaces.values():
        host.problems.extend(s.problems)
    for g in cores:
        host.problems.extend(g.problems)
    return cores
