"""Address spaces: where the bytes of an imaged process come from.

This layer knows nothing of CPython. Everything above it reads memory through `AddressSpace`.
"""

from __future__ import annotations

import os

from zen.memory.elfcore import ElfCoreSpace
from zen.memory.live import LiveSpace
from zen.memory.regions import Region, Source
from zen.memory.space import AddressSpace, BytesChunk

__all__ = ["AddressSpace", "BytesChunk", "ElfCoreSpace", "LiveSpace", "Region", "Source", "open_space"]


def open_space(image: str | os.PathLike | None = None, pid: int | None = None, *, file_root: str | None = None) -> AddressSpace:
    """Open an image file or a live process (exactly one of them)."""
    if (image is None) == (pid is None):
        from zen.errors import ZenError

        raise ZenError("give either an image file or --pid, not both and not neither")
    if pid is not None:
        return LiveSpace(pid)
    return ElfCoreSpace(image, file_root=file_root)
