"""What both the encoder (snapshot.py) and the value kinds (values.py) use: one module's facts read once per
interpreter, and the bound on encoded containers. Its own module so that the two depend on it, not on each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader

MAX_ITEMS = 20_000


def module_info(ip: ImageReader, addr: int):
    """`read_module`, once per module and interpreter: it walks the module's whole namespace (1,500
    names for torch) to find `__name__`, and encoders ask for the same few modules thousands of times."""
    from zen.cpython.readers.modules import read_module

    memo = ip.census_memo.setdefault("module_info", {})
    info = memo.get(addr)  # type: ignore[union-attr]
    if info is None:
        info = memo[addr] = read_module(ip, addr)  # type: ignore[index]
    return info
