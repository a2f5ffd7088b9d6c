"""What every framework front end shares: the "no model here" error and where a model is referenced by name.

Both are about the Python heap, not about a framework: the PyTorch and the Keras front ends rank their roots by
the same references, and an image without a model of either exits 6 with the same error class.
"""

from __future__ import annotations

from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import read_dict
from zen.runtime.errors import ZenError


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


MAX_FRAMES_READ = 4096  # frames whose code is read for the global names it loads


def served(ip: Interpreter, heap: Heap, targets: set[int]) -> dict[int, list[str]]:
    """Evidence that a model is *served*, not merely alive: code running in a live frame loads it by a global name
    its function's module binds to it (a request handler or serving loop that calls `model(x)`), or was handed it
    as an argument (`serve(model)`); a local a function merely built is not evidence of serving. A float reference
    kept beside a quantized deployment, an exporter's leftover, a checkpoint copy: alive but named by no running
    code. Read without running anything: the frame's `co_names` looked up in its function's globals."""
    from zen.cpython.readers.code import read_code
    from zen.cpython.readers.functions import read_function

    out: dict[int, list[str]] = {t: [] for t in targets}
    frames = 0
    bound: dict[int, dict[str, int]] = {}  # a module's globals that name a target, read once per module
    try:
        for th in heap.threads():
            for fr in th.frames:
                frames += 1
                if frames > MAX_FRAMES_READ or "error" in fr:
                    continue
                where = fr.get("qualname", "?")
                if where == "<module>":
                    continue  # the script's top level: its names are the module's globals, not a handler's
                ci = read_code(ip, fr["code"])
                args = set(ci.varnames[: ci.argcount + ci.kwonlyargcount])
                for name, v in heap.frame_locals(fr).items():
                    if v in out and name in args:  # handed to the running function (serve(model), handle(req, model))
                        out[v].append(f"argument {name} of the live frame {where}")
                func = fr.get("function")
                if not func or ip.kind(func) != "function":
                    continue
                g = read_function(ip, func).globals
                if g not in bound:
                    bound[g] = {ip.str(k): v for k, v in read_dict(ip, g) if v in out and ip.kind(k) == "str"}
                for name in sorted(set(ci.names) & set(bound[g])):
                    out[bound[g][name]].append(f"global {name} loaded by the live frame {where}")
    except ZenError:
        pass
    return out
