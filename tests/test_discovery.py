"""Interpreter discovery: every fallback agrees with the exported symbols on real images, and
discovery works without symbols, for statically linked interpreters and for CPython 3.13."""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import find_python, start_target, zen

import zen.cpython.discover as discover_mod
from zen.cpython.discover import _find_cookie, discover, find_self_typed
from zen.cpython.interp import Interpreter
from zen.cpython.layout.profile import load_profile
from zen.cpython.layout.symbols import module_base, symbols_from_disk
from zen.cpython.wellknown import TYPES, WellKnown, _resolve_by_name
from zen.memory import open_space


@pytest.fixture(scope="module")
def light_image(light_target, workdir):
    img = workdir / "discovery.core"
    zen("acquire", "--pid", light_target.pid, "-o", img, "--lean")
    space = open_space(img)
    yield space, light_target
    space.close()
    img.unlink(missing_ok=True)


def test_fallbacks_agree_with_symbols(light_image):
    space, _ = light_image
    info = discover(space)
    assert info.how["version"].startswith("Py_Version") and info.how["runtime"].startswith("_PyRuntime")
    # the self-referential `type` object
    assert info.type_type in find_self_typed(space, info.module_path)
    # the .PyRuntime section of the file on disk, relocated by the module's load address
    disk = symbols_from_disk(info.module_path, module_base(space, info.module_path))
    assert disk is not None and disk.sections[".PyRuntime"] == info.runtime
    # built-in types found by tp_name equal the exported symbols
    prof = load_profile(info.minor)
    by_name = WellKnown()
    _resolve_by_name(space, info, prof, by_name, list(TYPES))
    by_symbol = Interpreter(space, info, prof).wk
    for kind, addr in by_name.types.items():
        assert by_symbol.types.get(kind, addr) == addr, kind
    assert {"int", "str", "dict", "function", "code", "type"} <= set(by_name.types)
    assert by_name.singletons["None"] == by_symbol.singletons["None"]
    assert {by_name.singletons["True"], by_name.singletons["False"]} == {
        by_symbol.singletons["True"],
        by_symbol.singletons["False"],
    }


def test_discovery_without_any_symbols(light_image, monkeypatch):
    """Symbols hidden: the exact version from the `sys.version` banner (else the file name's minor),
    `type` by self-reference, types by name."""
    import platform

    space, target = light_image
    monkeypatch.setattr(discover_mod, "load_symbols", lambda *a, **k: None)
    info = discover(space)
    assert info.version == platform.python_version() and "sys.version banner" in info.how["version"]
    monkeypatch.setattr(discover_mod, "_banner_version", lambda *a, **k: None)
    info = discover(space)
    assert info.minor == "3.11" and "file name" in info.how["version"]
    assert info.how["type_type"].startswith("self-referential")
    assert info.warnings
    ip = Interpreter(space, info, load_profile(info.minor))
    assert ip.wk.how == "type names"
    for name in ("int_big", "str_ucs4", "dict_unicode", "tuple"):
        entry = target.truth["values"][name]
        assert repr(ip.value(entry["id"])) == entry["repr"]


@pytest.fixture(scope="module")
def static_python():
    """A CPython 3.11 whose executable links libpython statically (e.g. Debian's /usr/bin/python3.11)."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    for exe in ("/usr/bin/python3.11", find_python("3.11")):
        if not exe or find_python("3.11") is None:
            continue
        try:
            with open(exe, "rb") as fh:
                needed = [
                    t.needed
                    for s in ELFFile(fh).iter_sections()
                    if isinstance(s, DynamicSection)
                    for t in s.iter_tags()
                    if t.entry.d_tag == "DT_NEEDED"
                ]
        except OSError:
            continue
        if not any("libpython" in n for n in needed):
            return exe
    pytest.skip("no statically linked CPython 3.11 on this machine")


def test_static_build(static_python, workdir):
    outdir = workdir / "static-target"
    t = start_target("objects_target.py", outdir, "--light", python=static_python)
    try:
        img = workdir / "static.core"
        zen("acquire", "--pid", t.pid, "-o", img, "--lean")
        with open_space(img) as space:
            ip = Interpreter.open(space)
            assert ip.info.static_build and ip.info.version == t.truth["python"]
            for name in ("int_huge_neg", "str_latin1", "dict_general", "bytes_big"):
                entry = t.truth["values"][name]
                assert repr(ip.value(entry["id"])) == entry["repr"], name
        img.unlink()
    finally:
        t.stop()


def test_cpython_313_cookie_and_version(workdir):
    exe = find_python("3.13")
    if exe is None:
        pytest.skip("no CPython 3.13 on this machine")
    proc = subprocess.Popen([exe, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.5)
        img = workdir / "py313.core"
        zen("acquire", "--pid", proc.pid, "-o", img, "--lean")
        with open_space(img) as space:
            info = discover(space)
            assert info.minor == "3.13"
            addr, hexversion = _find_cookie(space, None)
            assert addr == info.runtime  # _PyRuntime starts with the _Py_DebugOffsets cookie
            assert hexversion == info.hexversion
        img.unlink()
    finally:
        proc.kill()
        proc.wait()
