"""Compiled forms of zen's hot paths, and the switch between them and the pure-Python reference.

The pure-Python code stays the definition of what is right: each compiled function has a reference
in the module that calls it, which is also the fallback. `core` is the extension module
(`zen.native._core`, C against the CPython API, built by `pip install` / install.sh), or None when
it was not built (no compiler), cannot be loaded, or `ZEN_PURE=1` asks for the reference. Callers
test `core is not None` and otherwise run their Python path; `why` says which way it went, and
`zen version` prints it.
"""

from __future__ import annotations

import os
from types import ModuleType

core: ModuleType | None = None
why = ""


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("ZEN_PURE", "").strip() not in ("", "0", "no", "false", "off"):
        return None, "pure Python: ZEN_PURE is set"
    try:
        from zen.native import _core
    except ImportError as exc:  # not built here (no compiler at install time), or built for another Python
        return None, f"pure Python: the compiled core is not built ({exc}); with a C compiler, bash install.sh builds it"
    return _core, "compiled core"


core, why = _load()
