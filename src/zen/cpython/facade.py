"""What object readers need from an interpreter: the one interface between `readers/` and `interp.py`.

Readers take "the interpreter of one image" and an address; `Interpreter` (interp.py) implements this interface
and calls the readers to do so (type names, strings, values). Typing readers against this protocol instead of the
class keeps the dependency one way (interp -> readers -> facade), so neither side is a circle's half.
"""

from __future__ import annotations

from typing import Any, Protocol

from zen.memory.space import AddressSpace


class ImageReader(Protocol):
    """The facade of an interpreter in an image (see zen.cpython.interp.Interpreter)."""

    space: AddressSpace
    P: Any  # the CPython layout profile (zen.cpython.layout.profile.Profile)
    limits: Any  # zen.cpython.interp.Limits: bounds on what a reader accepts
    wk: Any  # well-known type addresses (zen.cpython.wellknown.WellKnown)
    _type_cache: dict
    census_memo: dict  # per-interpreter memos (zen.cpython.encode.modules_memo)
    fast: Any  # the compiled core's reader of small objects (zen.native._core.Objects), or None

    def ptr(self, addr: int) -> int: ...

    def read_within(self, addr: int, size: int, owner: int, what: str) -> bytes: ...

    def header(self, addr: int) -> tuple[int, int]: ...

    def type_of(self, addr: int) -> int: ...

    def check_type(self, taddr: int) -> None: ...

    def kind(self, addr: int) -> str: ...

    def is_none(self, addr: int) -> bool: ...

    def str(self, addr: int) -> str: ...

    def type_name(self, addr: int) -> str: ...

    def type_info(self, taddr: int) -> Any: ...  # zen.cpython.readers.types.TypeInfo of a type object
