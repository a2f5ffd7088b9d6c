"""What every framework front end shares: the "no model here" error and where a model is referenced by name.

Both are about the Python heap, not about a framework: the PyTorch and the Keras front ends rank their roots by
the same references, and an image without a model of either exits 6 with the same error class.
"""

from __future__ import annotations

from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import read_dict
from zen.errors import ZenError


class NoModelFound(ZenError):
    exit_code = 6


def references(ip: Interpreter, heap: Heap, targets: set[int]) -> dict[int, list[str]]:
    """Where each target is referenced by name: `__main__` globals and locals of live frames."""
    refs: dict[int, list[str]] = {t: [] for t in targets}
    try:
        mods = heap.sys_modules()
        main = mods.get("__main__")
        if main:
            from zen.cpython.readers.modules import read_module

            for k, v in read_dict(ip, read_module(ip, main).dict):
                if v in refs and ip.kind(k) == "str":
                    refs[v].append(f"__main__.{ip.str(k)}")
    except ZenError:
        pass
    try:
        for th in heap.threads():
            for fr in th.frames:
                for name, v in heap.frame_locals(fr).items():
                    if v in refs:
                        refs[v].append(f"frame {fr.get('qualname', '?')}: {name}")
    except ZenError:
        pass
    return refs
