"""The execution context E (ZEN Eq. 6): what the model's code needs to run again.

H (hardware): the devices its tensors live on and the machine the image came from. D
(dependencies): the packages loaded in the process, with the versions memory shows (a package's
`__version__`, or its `version` submodule's), and which of them the model code comes from or calls
into. S (runtime state): the interpreter, `sys.platform`, how many modules and threads were live.
The result includes a requirements.txt an investigator can install.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from zen.cpython.program.exclusion import EXCLUDED_PACKAGES
from zen.cpython.runtime import Runtime
from zen.runtime.errors import ZenError

# Import names whose PyPI distribution is called something else (requirements need the latter).
DISTRIBUTIONS = {
    "yaml": "PyYAML", "PIL": "Pillow", "sklearn": "scikit-learn", "skimage": "scikit-image", "cv2": "opencv-python",
    "bs4": "beautifulsoup4", "attr": "attrs", "dateutil": "python-dateutil", "jwt": "PyJWT", "Crypto": "pycryptodome",
    "serial": "pyserial", "dotenv": "python-dotenv", "git": "GitPython", "OpenSSL": "pyOpenSSL", "google": "protobuf",
    "huggingface_hub": "huggingface-hub",
}  # fmt: skip


def _version(rt: Runtime, top: str) -> tuple[str | None, str | None]:
    candidates = ((top, "__version__"), (f"{top}.version", f"{top}.version.__version__"), (f"{top}.__about__", "__about__"))
    for modname, how in candidates:
        addr = rt.modules.get(modname)
        if addr is None:
            continue
        ns = rt.module_namespace(addr)
        v = ns.get("__version__")
        if v is not None and rt.kind(v) == "str":
            return rt.ip.str(v), how
        # lazy modules (e.g. transformers' _LazyModule) keep it in a dict they serve from __getattr__
        for name, d in sorted(ns.items()):
            if rt.kind(d) == "dict":
                v = rt.namespace(d).get("__version__")
                if v is not None and rt.kind(v) == "str":
                    return rt.ip.str(v), f"{how} (lazy module attribute {name})"
    return None, None


def execution_context(
    rt: Runtime, model_modules: set[str], dependencies: Counter, devices: set[str], machine: str | None
) -> dict[str, Any]:
    ip = rt.ip
    tops = Counter(name.split(".", 1)[0] for name in rt.modules)
    third_party = sorted(t for t in tops if t not in EXCLUDED_PACKAGES and not t.startswith("_") and t != "__main__")
    packages = {}
    for top in third_party:
        version, how = _version(rt, top)
        packages[top] = {"version": version, "version_from": how, "modules_loaded": tops[top]}
    for top in ("torch", "numpy"):
        if top in tops:
            version, how = _version(rt, top)
            packages[top] = {"version": version, "version_from": how, "modules_loaded": tops[top]}
    used = {m.split(".", 1)[0] for m in model_modules} | {d.split(".", 1)[0] for d in dependencies}
    used = sorted(u for u in used if u in packages)
    sys_ns = rt.module_namespace(rt.modules["sys"]) if "sys" in rt.modules else {}
    platform = ip.value(sys_ns["platform"]) if "platform" in sys_ns and rt.kind(sys_ns["platform"]) == "str" else None
    try:
        threads = len(rt.heap.threads())
    except ZenError:
        threads = None
    req = [f"# execution context recovered by zen from a memory image: Python {ip.info.version} on {platform or '?'}"]
    for top in used:
        v = packages[top]["version"]
        dist = DISTRIBUTIONS.get(top, top)
        req.append(f"{dist}=={v.split('+')[0]}" if v else f"{dist}  # version not visible in memory")
    return {
        "hardware": {"devices": sorted(devices), "machine": machine},
        "dependencies": {"packages": packages, "used_by_model": used},
        "runtime": {"python": ip.info.version, "static_build": ip.info.static_build, "platform": platform,
                    "modules_loaded": len(rt.modules), "threads": threads},
        "requirements": req,
    }  # fmt: skip
