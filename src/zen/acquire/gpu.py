"""GPU evidence from a live CUDA process, collected beside its host image by `zen acquire --pid`.

Two routes, chosen per process (`--gpu auto`): a process started with the driver's user-triggered
core dump enabled is dumped by its own driver (`driver`); any other is read with cuda-gdb, one
attach, over the device ranges its tensors use (`cudagdb`). Neither available: the host image is
still written, and zen says how to collect the GPU side. The host image is taken first (the process
is stopped while it is read), then the device memory: the host image fixes which addresses matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from zen.acquire.cudagdb import find_cuda_gdb
from zen.acquire.environ import CudaSettings, cuda_settings
from zen.evidence.digest_cache import file_sha256
from zen.runtime.errors import ZenError

ROUTES = ("auto", "driver", "cuda-gdb", "none")
HOW_TO = ("start the process with CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 and "
          "CUDA_COREDUMP_GENERATION_FLAGS=skip_abort,skip_nonrelocated_elf_images,skip_local_memory,skip_shared_memory "
          "(README 'Models on GPUs'), or install cuda-gdb (--cuda-gdb PATH) to read an unprepared process")  # fmt: skip


@dataclass
class GpuPlan:
    """What will be done for the device side, decided before the host image is taken."""

    route: str  # "driver", "cuda-gdb", "none", "not-cuda"
    settings: CudaSettings
    cuda_gdb: str | None = None
    reason: str = ""
    dest: Path | None = None

    def note(self) -> dict:
        return {"gpu": {"route": self.route, "file": str(self.dest) if self.dest else None, "reason": self.reason,
                        "cuda_settings": self.settings.to_json()}}  # fmt: skip


@dataclass
class GpuResult:
    path: Path | None
    sha256: str | None
    record: dict = field(default_factory=dict)
    missing: str = ""  # why there is no GPU evidence although there should be (exit 5)
    note: str = ""  # why no GPU evidence is needed


def plan(pid: int, image: Path, route: str = "auto", cuda_gdb: str | None = None, allow_abort: bool = False) -> GpuPlan:
    """Choose the route; refuse (ZenError) what would harm the process or cannot work."""
    if route not in ROUTES:
        raise ZenError(f"--gpu {route!r}: choose one of {', '.join(ROUTES)}")
    s = cuda_settings(pid)
    dest = Path(f"{image}.gpu0.nvcudmp")
    if not s.uses_cuda:
        return GpuPlan("not-cuda", s, reason="the process has no CUDA driver loaded")
    if route == "none":
        return GpuPlan("none", s, reason="--gpu none")
    gdb = find_cuda_gdb(cuda_gdb)
    if cuda_gdb and gdb is None:
        raise ZenError(f"no executable cuda-gdb at {cuda_gdb}")
    if route == "driver" or (route == "auto" and s.user_trigger and (s.skip_abort or allow_abort)):
        if not s.user_trigger:
            raise ZenError(f"PID {pid} was not started with CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1: its driver cannot be "
                           "asked for a GPU dump", "use --gpu cuda-gdb, or " + HOW_TO)  # fmt: skip
        if not s.skip_abort and not allow_abort:
            raise ZenError(f"PID {pid} would be killed by its CUDA driver after the GPU dump: its "
                           f"CUDA_COREDUMP_GENERATION_FLAGS ({','.join(s.flags) or 'unset'}) lack skip_abort",
                           "pass --allow-abort if ending the process is acceptable, or --gpu cuda-gdb")  # fmt: skip
        return GpuPlan("driver", s, gdb, "user-triggered core dump enabled in the process", dest)
    if route in ("auto", "cuda-gdb") and gdb is not None:
        why = "the process was not prepared for GPU dumps" if not s.user_trigger else "--gpu cuda-gdb"
        if s.user_trigger and not s.skip_abort and route == "auto":
            why = "the driver's dump would abort the process (no skip_abort)"
        return GpuPlan("cuda-gdb", s, gdb, why, dest)
    if route == "cuda-gdb":
        raise ZenError("cuda-gdb was not found", "pass --cuda-gdb PATH, or install the CUDA toolkit's debugger")
    return GpuPlan("none", s, reason="the process was not prepared for GPU dumps and cuda-gdb was not found")


def collect(p: GpuPlan, image: Path, *, allow_abort: bool = False, timeout: float | None = None) -> GpuResult:
    """Collect the device memory along the planned route, after the host image `image` was written."""
    if p.route == "not-cuda":
        return GpuResult(None, None)
    if p.route == "none":
        return GpuResult(None, None, missing=f"no GPU evidence collected ({p.reason}): tensors on the GPU will be "
                                             f"missing from recovery; to collect it, {HOW_TO}")  # fmt: skip
    assert p.dest is not None
    if p.route == "driver":
        from zen.acquire.driver import trigger

        record = trigger(p.settings, p.dest, allow_abort=allow_abort, timeout=timeout or 600.0)
        record["sha256"] = file_sha256(p.dest)
    else:
        from zen.acquire.cudagdb import dump
        from zen.acquire.ranges import cuda_ranges

        ranges, summary = cuda_ranges(image)
        if not ranges:  # CUDA is loaded (a CUDA build of torch maps libcuda) but no tensor lives on a GPU
            return GpuResult(None, None, note="no tensor of the process is on a GPU (the host image shows none): "
                                              "no device memory to copy")  # fmt: skip
        record = dump(p.settings.pid, ranges, p.dest, p.cuda_gdb, timeout=timeout,
                      note={"pid": p.settings.pid, "host_image": str(image), "tensors": summary})  # fmt: skip
    from zen.evidence import digest_cache

    cached = digest_cache.lookup(image)  # zen acquire hashed it as it wrote it
    record["host_image_sha256"] = cached["sha256"] if cached else file_sha256(image)
    side = Path(f"{image}.acquisition.json")
    side.write_text(json.dumps({"host_image": str(image), "host_sha256": record["host_image_sha256"],
                                "gpu_image": str(p.dest), "gpu_sha256": record["sha256"], "gpu": record},
                               indent=1, sort_keys=True) + "\n")  # fmt: skip
    return GpuResult(p.dest, record["sha256"], record)
