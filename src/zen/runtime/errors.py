"""Typed errors for everything zen reports to a user.

Memory images are untrusted evidence: any read can fail, any pointer can be garbage. Every failure
that can be caused by the input (a bad file, a corrupt object, a missing profile) is raised as a
`ZenError` subclass carrying a one-line message and, where we know one, a hint saying what to do.
The CLI turns these into a clear line on stderr and a non-zero exit; anything else escaping is a
bug in zen and is shown as such.
"""

from __future__ import annotations


class ZenError(Exception):
    """Base class of all errors caused by input rather than by a bug in zen."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class TimeLimitExceeded(ZenError):
    """A wall-clock safety net ran out (a child process that never ended). Never a result: zen stops here,
    naming the limit and the option that raises it, instead of answering differently on a slower machine.
    What a result depends on is bounded by work (counts), not by time."""

    exit_code = 7


class ImageError(ZenError):
    """The image file cannot be used at all (missing, not ELF, not a core, truncated headers)."""


class ProcessError(ZenError):
    """A live process cannot be read (gone, permission denied, not stoppable)."""


class MemoryReadError(ZenError):
    """A virtual address range is not available in the address space."""

    def __init__(self, addr: int, size: int, reason: str = "not mapped in the image") -> None:
        super().__init__(f"cannot read {size} bytes at {addr:#x}: {reason}")
        self.addr = addr
        self.size = size
        self.reason = reason


class InterpreterNotFound(ZenError):
    """No CPython interpreter could be located in the image."""

    exit_code = 3


class TruncatedImage(ZenError):
    """The image is cut short and what is missing is what the analysis needs first (the interpreter's state):
    the evidence is incomplete (exit 5), not absent."""

    exit_code = 5


class StateNotRead(ZenError):
    """The model holds state zen did not read (a quantized tensor subclass, a C++ object, an offloaded tensor): a
    runnable copy would crash, compute something else or read files outside itself, so none is written (exit 5)."""

    exit_code = 5


class ProfileError(ZenError):
    """No layout profile exists for the interpreter version, or a profile file is unusable."""

    exit_code = 4


class ObjectError(ZenError):
    """An object in the image failed validation (wrong type, implausible header, out of bounds)."""

    def __init__(self, addr: int, reason: str) -> None:
        super().__init__(f"object at {addr:#x}: {reason}")
        self.addr = addr
        self.reason = reason


class VersionMismatch(ZenError):
    """An operation needs the image's Python version to equal the running interpreter's."""


class CalibrationError(ZenError):
    """Measuring a layout in the running interpreter gave no unique answer."""


class KernelSymbolsError(ProfileError):
    """No usable kernel symbol file (ISF) for a whole-machine image: none matches its banner, or the
    one given does not describe the imaged kernel. Exit code 4, like a missing layout profile."""
