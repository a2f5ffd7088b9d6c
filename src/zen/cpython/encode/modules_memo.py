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


def names_in(ip: ImageReader, addr: int) -> dict[str, int]:
    """`dict_get`'s answer for every str key of the dict at `addr` (a module's or class's namespace), read once per
    interpreter: the first entry of a name wins and a key that cannot be read is passed over (there, a key read
    before the name was found could also end the lookup with an error; here it never hides the others). Whether a
    function's name reaches it (`names.name_resolves`, `ValueKinds._replaced`) is asked for every function a model's
    globals and closures hold; one `dict_get` each walked the whole namespace (torch's 1,500 names) every time."""
    from zen.cpython.readers.dicts import read_dict
    from zen.runtime.errors import ZenError

    memo = ip.census_memo.setdefault("names_in", {})
    names = memo.get(addr)  # type: ignore[union-attr]
    if names is None:
        names = {}
        for k, v in read_dict(ip, addr):
            try:
                if ip.kind(k) == "str":
                    names.setdefault(ip.str(k), v)
            except ZenError:
                continue
        memo[addr] = names  # type: ignore[index]
    return names
