"""Which modules are framework or standard library, not the model's own code (the closure's rule 3).

Apart from the closure walk so that attribution, which asks only this of a module name, does not import the
CPython readers behind it (0.05 s of every `zen attribute`).
"""

from __future__ import annotations

import sys

EXCLUDED_PACKAGES = frozenset({"torch", "numpy", "builtins", "__future__"}) | frozenset(sys.stdlib_module_names)


def excluded(module: str | None) -> bool:
    """Whether code of `module` is left out of the model's closure: unknown, or torch, numpy, builtins, stdlib."""
    if not module:
        return True
    return module.split(".", 1)[0] in EXCLUDED_PACKAGES
