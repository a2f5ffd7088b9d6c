"""Reader for module objects (PyModuleObject): name, file and namespace.

The name and file are taken from the module's own `__dict__` (`__name__`, `__file__`), exactly as
`module.__name__` does in Python; `__spec__`-less and file-less (built-in, frozen) modules are
normal and give `file=None`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zen.runtime.errors import ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


@dataclass
class ModuleInfo:
    addr: int
    name: str | None
    file: str | None
    dict: int


def read_module(ip: ImageReader, addr: int) -> ModuleInfo:
    kind = ip.kind(addr)
    if kind != "module":
        raise ObjectError(addr, f"expected a module, found {kind}")
    from zen.cpython.readers.dicts import read_dict

    d = ip.ptr(addr + ip.P.module.md_dict)
    name = file = None
    if d:
        for k, v in read_dict(ip, d):
            if ip.kind(k) != "str":
                continue
            key = ip.str(k)
            if key == "__name__" and ip.kind(v) == "str":
                name = ip.str(v)
            elif key == "__file__" and ip.kind(v) == "str":
                file = ip.str(v)
    return ModuleInfo(addr, name, file, d)
