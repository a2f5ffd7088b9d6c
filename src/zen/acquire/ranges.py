"""Which device memory to copy from a process that was never prepared: the ranges its tensors use.

The host image says where every tensor's bytes are: each CUDA tensor's StorageImpl holds a device
data pointer and a byte count. zen reads them from the host image just taken (every tensor object on
the heap, the model's and the inputs' alike), and merges ranges that overlap or touch (views of one
storage, tied weights); nothing between two allocations is read, so no request touches memory the
process never allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_RANGES = 200_000


@dataclass(frozen=True)
class DeviceRange:
    device: str
    start: int
    end: int
    tensors: int

    @property
    def size(self) -> int:
        return self.end - self.start


def cuda_ranges(host_image: Path) -> tuple[list[DeviceRange], dict]:
    """The merged device ranges of every CUDA tensor in the host image, and a summary."""
    from zen.cpython.heap import Heap
    from zen.cpython.interp import Interpreter
    from zen.frontends.pytorch.modules import TENSOR_BASE
    from zen.frontends.pytorch.profile import load_torch_profile
    from zen.frontends.pytorch.tensors import TensorReader
    from zen.memory import open_space
    from zen.recover.run import torch_version

    raw: list[tuple[str, int, int]] = []
    unreadable = 0
    with open_space(host_image) as space:
        ip = Interpreter.open(space)
        heap = Heap(ip)
        tv = torch_version(ip, heap)
        reader = TensorReader(ip, load_torch_profile(".".join(tv.split("+")[0].split(".")[:2]), tv))
        types = {ti.addr for ti in heap.subclasses_of(TENSOR_BASE)}
        for addrs in heap.instances_of_types(types).values():
            for a in addrs.tolist():
                try:
                    m = reader.meta(a)
                except Exception:  # noqa: BLE001 - any damaged tensor is skipped, counted
                    unreadable += 1
                    continue
                if m.device.startswith("cuda") and m.data_ptr and m.storage_nbytes > 0:
                    raw.append((m.device, m.data_ptr, m.data_ptr + m.storage_nbytes))
                if len(raw) > MAX_RANGES:
                    break
    merged = merge(raw)
    summary = {"tensors": len(raw), "unreadable_tensor_objects": unreadable, "ranges": len(merged),
               "bytes": sum(r.size for r in merged), "torch": tv}  # fmt: skip
    return merged, summary


def merge(raw: list[tuple[str, int, int]]) -> list[DeviceRange]:
    """Ranges per device, overlapping or touching ones joined."""
    out: list[DeviceRange] = []
    for dev, lo, hi in sorted(raw, key=lambda r: (r[0], r[1], r[2])):
        if out and out[-1].device == dev and lo <= out[-1].end:
            last = out[-1]
            out[-1] = DeviceRange(dev, last.start, max(last.end, hi), last.tensors + 1)
        else:
            out.append(DeviceRange(dev, lo, hi, 1))
    return out
