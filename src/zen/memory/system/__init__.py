"""Whole-machine memory images (LiME, AVML, raw, ELF physical dumps) read through Volatility 3.

The split follows what each part knows: `formats` reads container headers (which physical range
sits where in the file), `symbols` builds and finds kernel symbol files (ISF) from BTF, `kernel`
asks Volatility for the kernel (banner, KASLR, page tables), `tasks` lists processes and their
mappings, and `process` turns one process into an `AddressSpace` whose chunks are views over an
mmap of the image, so every reader above `memory/` works unchanged on full-system evidence.
"""

from __future__ import annotations

from zen.memory.system.formats import PhysicalImage, open_physical, sniff

__all__ = ["PhysicalImage", "open_physical", "sniff"]
