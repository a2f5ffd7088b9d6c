"""Session fixtures: real target processes, imaged once per session, with their ground truth.

Target processes write what they know about themselves (ids, reprs, marshalled code) to a directory and wait on
stdin. Images are made once per session under a temp dir and deleted at the end; nothing here is ever committed.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
TARGETS = HERE / "targets"
BENCH = HERE.parent / "bench"  # bench/families: the evaluation scenario set the tests also use
sys.path.insert(0, str(BENCH))
pytest_plugins = ["forms_fixtures"]  # the deployment-form targets, shared by test_forms and test_torchscript


class Target:
    """A running target process and its ground truth."""

    def __init__(self, proc: subprocess.Popen, outdir: Path) -> None:
        self.proc = proc
        self.outdir = outdir
        self.pid = proc.pid
        self.truth = json.loads((outdir / "truth.json").read_text())

    def functions_code(self) -> list:
        with open(self.outdir / "functions.marshal", "rb") as fh:  # our own fixture's output: trusted
            return marshal.load(fh)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(10)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()


def start_target(
    script: str, outdir: Path, *args: str, timeout: float = 300, cwd: Path | None = None, python: str | None = None
) -> Target:
    outdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [python or sys.executable, str(TARGETS / script), str(outdir), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=cwd or outdir,
    )
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == "READY" or not line:
            break
    if line.strip() != "READY":
        proc.kill()
        raise RuntimeError(f"target {script} did not become ready (exit {proc.poll()})")
    return Target(proc, outdir)


def imaged(script: str, outdir: Path, image: Path, *args: str) -> Target:
    """A target started, imaged with `zen acquire --lean` into `image` and stopped (its truth stays readable)."""
    t = start_target(script, outdir, *args)
    try:
        zen("acquire", "--pid", t.pid, "-o", image, "--lean")
    finally:
        t.stop()
    return t


def zen(*args: str, check: bool = True, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the zen CLI in a subprocess, as a user would (`env`: variables added to this process's environment)."""
    res = subprocess.run(
        [sys.executable, "-m", "zen", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {}), "COLUMNS": "200"},
    )
    if check and res.returncode != 0:
        raise AssertionError(f"zen {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


# Modules an attacker would plant where the evidence lies: each writes a marker file when imported.
TRAPS = ("depyf", "bisect", "numpy", "torch", "sitecustomize", "usercustomize", "zen", "tvm", "safetensors", "json",
         "runpy", "keras", "tensorflow", "typer", "rich", "transformers", "tomllib", "marshal_helpers")  # fmt: skip


def booby_trapped(where: Path) -> tuple[Path, Path]:
    """(evidence dir full of trap modules, dir where a trap that ran leaves its marker)."""
    evidence, markers = where / "evidence", where / "markers"
    evidence.mkdir(parents=True)
    markers.mkdir()
    for name in TRAPS:
        (evidence / f"{name}.py").write_text(f"open({str(markers / name)!r}, 'w').write('imported')\n")
    (evidence / "zen").mkdir()  # a package, too: `python -m zen` from here would run it
    (evidence / "zen" / "__init__.py").write_text(f"open({str(markers / 'zen-package')!r}, 'w').write('imported')\n")
    (evidence / "zen" / "__main__.py").write_text(f"open({str(markers / 'zen-main')!r}, 'w').write('ran')\n")
    return evidence, markers


def zen_command(*args, cwd: Path, check: bool = True, timeout: float = 600, env: dict | None = None):
    """Run the installed `zen` command (as a user types it) in `cwd`."""
    exe = Path(sys.executable).parent / "zen"
    res = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                         env={**(env or os.environ), "COLUMNS": "200"})  # fmt: skip
    if check and res.returncode != 0:
        raise AssertionError(f"zen {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def find_python(minor: str) -> str | None:
    """A working interpreter of CPython `minor` on this machine: on PATH, or in a pyenv tree."""
    cands = [shutil.which(f"python{minor}")]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    cands += [str(p) for p in sorted(root.glob(f"{minor}.*/bin/python{minor}"), reverse=True)]
    for exe in cands:
        if not exe:
            continue
        try:
            res = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if res.returncode == 0 and res.stdout.strip() == minor:
            return exe
    return None


def all_pythons(minor: str) -> dict[str, str]:
    """release -> interpreter, for every distinct release of CPython `minor` found here (PATH, pyenv
    and tools/build-python.sh builds): layouts can differ between patch releases (issue 17)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    cands = [shutil.which(f"python{minor}"), *map(str, sorted(root.glob(f"{minor}.*/bin/python{minor}")))]
    built = sorted(python_cache().glob(f"{minor}-*/bin/python{minor}"))
    cands += [str(p) for p in built if (p.parent.parent / ".zen-build-ok").is_file()]
    found: dict[str, str] = {}
    for exe in filter(None, cands):
        try:
            res = subprocess.run([exe, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                                 text=True, timeout=30)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        version = res.stdout.strip()
        if res.returncode == 0 and version.startswith(minor + "."):
            found.setdefault(version, exe)
    return found


FOREIGN = ("3.13", "3.14")  # CPython versions zen reads without running them (issue 8)
REPO = HERE.parent


def python_cache() -> Path:
    """Where tools/build-python.sh puts its builds (outside the repository)."""
    env = os.environ.get("ZEN_PYTHON_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zen" / "pythons"


def foreign_python(minor: str, kind: str = "shared") -> str | None:
    """A CPython `minor` to run target processes under: a tools/build-python.sh build, else one on
    PATH or in pyenv (for the shared kind), else built now — unless ZEN_BUILD_PYTHONS=0 (the build
    takes several minutes a version; CI builds them before the test run instead)."""
    built = python_cache() / f"{minor}-{kind}"
    exe = built / "bin" / f"python{minor}"
    if exe.is_file() and (built / ".zen-build-ok").is_file():
        return str(exe)
    if kind == "shared":
        found = find_python(minor)
        if found:
            return found
    if os.environ.get("ZEN_BUILD_PYTHONS", "1") == "0":
        return None
    res = subprocess.run(
        ["bash", str(REPO / "tools" / "build-python.sh"), minor, kind], capture_output=True, text=True, timeout=3600
    )
    if res.returncode != 0:
        print(f"building CPython {minor} failed:\n{res.stderr[-2000:]}")
        return None
    return res.stdout.strip().splitlines()[-1]


_foreign: dict = {}


@pytest.fixture(scope="session")
def foreign_images(workdir):
    """minor -> (light objects target, lean image) for targets run under other CPython versions.

    Made on first use of each version; a version with no interpreter maps to None (tests skip)."""

    def get(minor: str):
        if minor not in _foreign:
            # "3.13" is the built (or any) interpreter of that minor; "3.13.0" exactly that release
            exe = all_pythons(minor.rsplit(".", 1)[0]).get(minor) if minor.count(".") == 2 else foreign_python(minor)
            if exe is None:
                _foreign[minor] = None
            else:
                t = start_target("objects_target.py", workdir / f"light-{minor}", "--light", python=exe)
                img = workdir / f"light-{minor}.core"
                try:
                    zen("acquire", "--pid", t.pid, "-o", img, "--lean")
                finally:
                    t.stop()
                _foreign[minor] = (t, img)
        return _foreign[minor]

    yield get
    for v in _foreign.values():
        if v is not None:
            v[1].unlink(missing_ok=True)


def kernel_core(target: Target, where: Path, timeout: float = 120) -> Path | None:
    """Make the kernel dump `target` (RLIMIT_CORE + SIGABRT); None if core dumps go elsewhere."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        return None
    resource.prlimit(target.pid, resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    os.kill(target.pid, signal.SIGABRT)
    target.proc.wait(timeout)
    name = pattern.replace("%p", str(target.pid)).replace("%e", "python").replace("%%", "%")
    candidates = [where / name, where / f"{name}.{target.pid}"]
    for c in candidates:
        if c.exists():
            return c
    return None


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("zen")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def torch_target_images(workdir):
    """The torch objects target imaged three ways: zen (lean), gcore, kernel core.

    The kernel core kills the process, so all three are made here, in that order.
    """
    outdir = workdir / "torch-target"
    t = start_target("objects_target.py", outdir)
    images: dict[str, Path] = {}
    try:
        lean = workdir / "torch-zen-lean.core"
        zen("acquire", "--pid", t.pid, "-o", lean, "--lean")
        images["zen"] = lean
        if shutil.which("gcore"):
            prefix = workdir / "torch-gcore"
            subprocess.run(["gcore", "-o", str(prefix), str(t.pid)], capture_output=True, timeout=300)
            made = workdir / f"torch-gcore.{t.pid}"
            if made.exists():
                images["gcore"] = made
        core = kernel_core(t, outdir)
        if core is not None:
            images["kernel"] = core
    finally:
        t.stop()
    yield t, images
    for p in images.values():
        p.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def light_target(workdir):
    """A pure-Python objects target (no torch) that stays alive for live-process tests."""
    t = start_target("objects_target.py", workdir / "light-target", "--light")
    yield t
    t.stop()


def _image(workdir, family):
    img = workdir / f"{family}.core"
    return img, imaged("models_target.py", workdir / f"{family}-target", img, family)


@pytest.fixture(scope="session")
def zoo_image(workdir):
    img, t = _image(workdir, "zoo")
    yield img, t
    img.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def hf_image(workdir):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    img, t = _image(workdir, "hf")
    yield img, t
    img.unlink(missing_ok=True)


_cases: dict = {}  # (image, model) -> recovered case, shared by every test module


@contextlib.contextmanager
def opened_heap(image):
    """(interpreter, Heap) over a process image, its space closed afterwards."""
    from zen.cpython.heap import Heap
    from zen.cpython.interp import Interpreter
    from zen.memory import open_space

    space = open_space(image, None)
    try:
        ip = Interpreter.open(space)
        yield ip, Heap(ip)
    finally:
        space.close()


def model_id(target, name) -> int:
    models = target.truth.get("models") or target.truth.get("variants")
    entry = models[name]
    return entry.get("id", entry.get("model_id"))


def recovered(image, target, name, workdir):
    """Recover model `name` of a target's image once per session: (case dir, mr, manifest, result)."""
    key = (str(image), name)
    if key not in _cases:
        case = workdir / f"case-{image.stem}-{name}"
        res = zen("recover", image, "-o", case, "--model", hex(model_id(target, name)), check=False)
        assert res.returncode in (0, 5), res.stderr
        _cases[key] = (case, json.loads((case / "mr.json").read_text()), json.loads((case / "manifest.json").read_text()), res)
    return _cases[key]


def _family_image(workdir, family, *extra):
    label, src = family + ("-obf" if extra else ""), str(workdir / "families-src")
    img = workdir / f"{label}.core"
    return img, imaged("family_target.py", workdir / f"{label}-target", img, family, "--src", src, *extra)


@pytest.fixture(scope="session")
def family_images(workdir):
    """One imaged process per test family, plus a ConvNet process whose convnet_se fork is obfuscated."""
    from families import FAMILIES

    images = {f: _family_image(workdir, f) for f in FAMILIES}
    images["convnet-obf"] = _family_image(workdir, "convnet", "--obfuscate", "convnet_se")
    yield images
    for img, _ in images.values():
        img.unlink(missing_ok=True)


BASES = {"convnet": "convnet", "mobile": "mobile", "gptmini": "gptmini", "gpt2": "hf", "llama": "hf"}  # name -> image


def case_of(name, source, family_images, hf_image, workdir):
    """The recovered case of model `name` from the family image `source` (or "hf")."""
    image, target = hf_image if source == "hf" else family_images[source]
    return recovered(image, target, name, workdir)[0]


@pytest.fixture(scope="session")
def base_library(family_images, hf_image, workdir):
    """A library of the three test-family bases plus transformers GPT-2 and Llama."""
    from zen.attribute.invariants import packed
    from zen.library.store import Library

    path = workdir / "bases.sqlite"
    with Library(path, invariants=packed) as lib:
        for name, source in BASES.items():
            lib.add_case(case_of(name, source, family_images, hf_image, workdir), name)
    return path


# -- whole-machine images (issue 14): one guest VM per session ------------------------------------

TOOLS = HERE.parent / "tools"  # tools/guestvm: the guest VM that whole-machine images come from
sys.path.insert(0, str(TOOLS))


# LiME copies RAM while the guest runs. With transparent huge pages on (Debian's default),
# khugepaged collapses the model process's heap into new 2 MiB pages during the copy, and the
# image then holds page tables pointing at frames copied before they were filled (zeros with
# init_on_alloc): measured, ~7% of the process's pages, and no model recoverable. The fixture stops
# THP collapse and proactive compaction first; a responder can do the same before running LiME.
QUIESCE = (
    "echo never > /sys/kernel/mm/transparent_hugepage/enabled; "
    "echo never > /sys/kernel/mm/transparent_hugepage/defrag; "
    "echo 0 > /proc/sys/vm/compaction_proactiveness"
)


class GuestTarget:
    """The guest's model process seen like a local target: truth.json and its output dir."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self.truth = json.loads((outdir / "truth.json").read_text())


def _guest_or_skip():
    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86 busybox-static)")
    from guestvm import GuestError, build_kernel_assets

    try:
        return build_kernel_assets(lime=True)
    except GuestError as lime_exc:  # LiME's module needs matching kernel headers: the rest still works
        try:
            assets = build_kernel_assets(lime=False)
        except GuestError as exc:
            pytest.skip(f"guest kernel assets could not be built here: {exc}")
        print(f"LiME could not be built, its tests will be skipped: {lime_exc}")
        return assets


@pytest.fixture(scope="session")
def guest(workdir):
    """One guest for the session, imaged once: ELF and raw dumps of one paused instant, a LiME
    image taken from inside, and a process core of the model process made by zen in the guest.
    LiME streams over TCP, as responders do, after THP collapse is stopped (QUIESCE above).
    The guest keeps running so that rebuilt models can be checked on the same (virtual) CPU."""
    from guestvm import Guest

    assets = _guest_or_skip()
    share = workdir / "guest-share"
    out, src = share / "out", share / "src"
    argv = [sys.executable, str(TARGETS / "family_target.py"), str(out), "convnet", "--src", str(src)]
    images = {"elf": workdir / "guest.elf", "raw": workdir / "guest.raw", "lime": share / "guest.lime"}
    out.mkdir(parents=True, exist_ok=True)
    with Guest(assets, memory_mib=1536, share=share, workload=argv, cwd=HERE.parent, lime="tcp") as g:
        g.wait_for(out / "truth.json", 900)
        g.wait_for(g.workload_log, 120, contains="READY")
        record = g.record()
        with g.paused():
            g.dump_elf(images["elf"])
            g.dump_raw(images["raw"])
        if getattr(assets, "lime_ko", None):
            g.run(QUIESCE)
            g.dump_lime(images["lime"])
        else:
            del images["lime"]
        # The same process imaged from inside the guest by zen itself (a process core), for the
        # comparison the issue asks for: machine image and process core must give the same case.
        core = share / "process.core"
        zen_exe = Path(sys.executable).parent / "zen"
        g.run(
            f"chroot $R /bin/sh -c '{zen_exe} acquire --pid {record['workload_pid']} -o {core} > {share}/acquire.log 2>&1'",
            timeout=900,
        )
        images["core"] = core
        isf_dir = workdir / "isf"
        isf_dir.mkdir(exist_ok=True)
        made = zen("symbols", "--kernel", assets.vmlinuz, "-o", isf_dir / f"linux-{assets.version}.json.xz", timeout=900)
        yield {
            "vm": g,
            "assets": assets,
            "images": images,
            "share": share,
            "record": record,
            "guest": share / "guest",
            "target": GuestTarget(out),
            "symbols": isf_dir,
            "symbols_log": made.stdout,
        }
    for p in images.values():
        p.unlink(missing_ok=True)


# -- the library as a service (issue 32): one throwaway PostgreSQL cluster per session -------------


@pytest.fixture(scope="session")
def pg_cluster():
    """A real PostgreSQL server on loopback (tools/pgcluster.py); tests get databases from it with
    `pg_cluster.create_db(name)`. Skips, saying why, only where PostgreSQL's binaries are absent.
    Its directory is its own (under the system temp dir, not pytest's: as root the cluster runs as
    `nobody`, who cannot enter pytest's private directories)."""
    from pgcluster import PgCluster, bindir

    if bindir() is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql")
    cluster = PgCluster().start()
    yield cluster
    cluster.stop()
