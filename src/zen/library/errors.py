"""The library's errors, in their own module: every backend and the export/import code raise them."""

from __future__ import annotations

from zen.runtime.errors import ZenError


class LibraryError(ZenError):
    pass


class NotFound(LibraryError):
    """No such entry (a server answers 404)."""


class Conflict(LibraryError):
    """The entry exists and may not be overwritten (a server answers 409)."""
