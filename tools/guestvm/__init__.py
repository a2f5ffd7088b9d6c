"""Guest-VM fixtures: real whole-machine memory images (QEMU ELF, raw, LiME) of a stock Debian
kernel running a host program, for zen's full-system tests and benchmarks (issue 14).

    from guestvm import Guest, build_kernel_assets
    assets = build_kernel_assets()            # cached kernel + initramfs (+ lime.ko)
    with Guest(assets, share=dir, workload=[...]) as g:
        g.wait_for(dir / "truth.json", 900); g.record(); g.dump_elf(path)

See README.md here for the design and measured costs.
"""

from .assets import KernelAssets, build_kernel_assets
from .cache import GuestError, available_kernels, cache_root, cached_kernels
from .guest import Guest, parse_proc_walk

__all__ = [
    "Guest",
    "GuestError",
    "KernelAssets",
    "available_kernels",
    "build_kernel_assets",
    "cache_root",
    "cached_kernels",
    "parse_proc_walk",
]
