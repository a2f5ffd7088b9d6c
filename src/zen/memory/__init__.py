"""Address spaces: where the bytes of an imaged process come from.

This layer knows nothing of CPython. Everything above it reads memory through `AddressSpace`.
"""

from __future__ import annotations

import os
from pathlib import Path

from zen.memory.elfcore import ElfCoreSpace
from zen.memory.live import LiveSpace
from zen.memory.regions import Region, Source
from zen.memory.space import AddressSpace, BytesChunk

__all__ = ["AddressSpace", "BytesChunk", "ElfCoreSpace", "LiveSpace", "Region", "Source", "open_space", "require_image_file"]


def require_image_file(image: str | os.PathLike) -> Path:
    """The image path, if it names a regular file (symlinks followed); else a clear error.

    Opening a FIFO blocks until a writer appears and a character device such as /dev/zero never
    ends: neither may be taken for evidence. A block device is refused with how to image it."""
    import stat

    from zen.runtime.errors import ImageError

    path = Path(image)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ImageError(f"image not found: {path}", "check the path") from None
    except PermissionError:
        raise ImageError(f"image is not readable (permission denied): {path}") from None
    except OSError as exc:
        raise ImageError(f"image cannot be opened: {path}: {exc.strerror}") from None
    if stat.S_ISREG(mode):
        return path
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a named pipe (FIFO)", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}  # fmt: skip
    kind = next((name for test, name in kinds.items() if test(mode)), "not a regular file")
    hint = ("copy it to a file first (e.g. `dd if=DEVICE of=IMAGE bs=16M`)" if stat.S_ISBLK(mode)
            else "give the path of an image file")  # fmt: skip
    raise ImageError(f"image is {kind}, not a regular file: {path}", hint)


def open_space(
    image: str | os.PathLike | None = None,
    pid: int | None = None,
    *,
    file_root: str | None = None,
    symbols: list[str | os.PathLike] | None = None,
    gpu: list[str | os.PathLike] | None = None,
    gpu_limits=None,
) -> AddressSpace:
    """Open a process: a core file, one process of a whole-machine image, or a live process.

    With an image, `pid` chooses a process of a whole-machine image (LiME, AVML, raw, ELF
    physical dump; default: the one Python process with torch loaded) and must match the
    process of a core file; without one, `pid` is a live process on this machine. `gpu` names
    GPU cores of the same process (zen.memory.gpu): their device memory is attached to it, within
    `gpu_limits` (a `GpuLimits`: how far a gzip core may inflate).
    """
    from zen.runtime.errors import ImageError

    if image is not None:
        from zen.memory.gpu import sniff_gpu_core

        if sniff_gpu_core(require_image_file(image)):
            raise ImageError(f"{image} is a GPU core (device memory of a CUDA process), not a host image",
                             f"give the process's host image and this file with --gpu {image}; `zen info {image}` "
                             "describes it")  # fmt: skip
    space = _open_host(image, pid, file_root=file_root, symbols=symbols)
    if gpu:
        from zen.memory.gpu import attach_gpu_images

        try:
            attach_gpu_images(space, gpu, gpu_limits)
        except BaseException:
            space.close()
            raise
    return space


def _open_host(image, pid, *, file_root, symbols) -> AddressSpace:
    from zen.runtime.errors import ImageError, ZenError

    if image is None and pid is None:
        raise ZenError("give an image file or --pid PID", "see `zen COMMAND --help`")
    if image is None:
        return LiveSpace(pid)
    path = require_image_file(image)
    from zen.memory.system.formats import sniff

    try:
        fmt = sniff(path)
    except PermissionError:
        raise ImageError(f"image is not readable (permission denied): {path}") from None
    if fmt is not None:
        from zen.memory.system.image import open_system_process

        return open_system_process(path, fmt, pid, [Path(s) for s in symbols or []], file_root)
    space = ElfCoreSpace(path, file_root=file_root)
    if pid is not None and space.info.pid not in (None, pid):
        space.close()
        raise ZenError(
            f"{path} is a core of PID {space.info.pid}, not {pid}",
            "--pid with an image chooses a process of a whole-machine image; leave it out for a process core",
        )
    return space
