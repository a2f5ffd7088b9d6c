"""The error a malformed or unsupported compiled executable raises.

Executables are untrusted evidence like memory images: a truncated copy, a library built by another
TVM version or a file that is no model library at all must end in one clear line, not a traceback.
"""

from __future__ import annotations

from zen.runtime.errors import ZenError


class ExecutableError(ZenError):
    """The file is not a usable TVM model library (not ELF, no VM executable, corrupt or foreign format)."""
