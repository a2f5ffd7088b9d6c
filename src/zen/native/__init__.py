"""Compiled forms of zen's hot paths, and the switch between them and the pure-Python reference.

The pure-Python code stays the definition of what is right: each compiled function has a reference
in the module that calls it, which is also the fallback. `core` is the extension module
(`zen.native._core`, C against the CPython API, built by `pip install` / install.sh), or None when
it was not built (no compiler), cannot be loaded, or `ZEN_PURE=1` asks for the reference. Callers
test `core is not None` and otherwise run their Python path; `why` says which way it went, and
`zen version` prints it.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

core: ModuleType | None = None
why = ""


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("ZEN_PURE", "").strip() not in ("", "0", "no", "false", "off"):
        return None, "pure Python: ZEN_PURE is set"
    if importlib.util.find_spec("zen.native._core") is None:  # no compiler at install time: pip went on without it
        return None, "pure Python: the compiled core was not built (no C compiler at install time?); bash install.sh builds it"
    try:
        from zen.native import _core
    except ImportError as exc:  # built for another Python, or damaged
        return None, f"pure Python: the compiled core does not load ({exc}); bash install.sh rebuilds it"
    return _core, "compiled core"


core, why = _load()
