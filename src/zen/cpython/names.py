"""Whether a name in the image reaches a given object: the test that a function may travel by name.

A function is encoded by `module:qualname` so that the rebuilding process takes the object its own import of
that module holds. That is right only when the image's module reaches *this* function by that name. A wrapper
made with `functools.wraps` carries its wrapped function's `__qualname__`: at module level (a decorator) the
name reaches the wrapper itself, and the name is right; elsewhere (dynamo's `_fn` in a module's
`_compiled_call_impl`, named `Module._call_impl`) it reaches another function, and the wrapper must travel by
its code. The walk follows at most `MAX_PARTS` names through module and class dicts; nothing is run.
"""

from __future__ import annotations

from zen.cpython.interp import Interpreter
from zen.runtime.errors import ZenError

MAX_PARTS = 8


def name_resolves(ip: Interpreter, module: str, qualname: str, addr: int) -> bool:
    """True when `module`'s namespace in the image reaches the object at `addr` through `qualname`."""
    from zen.cpython.encode.modules_memo import module_info, names_in
    from zen.cpython.heap import Heap
    from zen.cpython.readers.functions import read_wrapped

    parts = qualname.split(".")
    if "<locals>" in parts or len(parts) > MAX_PARTS:
        return False
    try:
        mod = Heap(ip).sys_module(module)
        if not mod:
            return False
        obj = names_in(ip, module_info(ip, mod).dict).get(parts[0])
        for name in parts[1:]:
            if obj is None or ip.kind(obj) != "type":
                return False
            obj = names_in(ip, ip.type_info(obj).dict_addr).get(name)
        if obj is not None and obj != addr and ip.kind(obj) in ("classmethod", "staticmethod"):
            obj = read_wrapped(ip, obj)
        return obj == addr
    except ZenError:
        return False
