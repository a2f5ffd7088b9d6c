"""Running a library compiled for another CPU: an emulated TVM runtime, built once from Debian and PyPI.

Why: edge deployments run on ARM, and the investigator's machine is x86 (issue 53). The library's kernels must run
to be probed, and they run only on their own architecture; everything else (reading the library, fitting operators
with torch, writing the package) stays on the host. So the host's TVM talks to a TVM RPC server that runs under
user-mode emulation (`qemu-aarch64-static`), and the probe and check children call the kernels through it: the
same requests, only the device is remote.

The emulated environment is built once into `~/.cache/zen/emulated/ARCH/` without root and without changing the
host: Debian bookworm's ARCH packages of Python 3.11 and what it links (the package index's signature checked with
`gpgv` where the Debian keyring is present, every package by the index's sha256), the static qemu binary from
Debian's amd64 package, and TVM and numpy wheels for ARCH from PyPI (`pip install --target --platform`).

    python -m zen.compiled.emulation build aarch64      # about 140 MB of downloads, 2-4 minutes
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from zen.runtime.errors import ZenError

MIRROR = os.environ.get("ZEN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
TVM_VERSION = "0.27.0.post1"  # the host's TVM: the RPC protocol is checked between equal versions
ARCHES = {  # ELF e_machine (pyelftools' name) -> what the environment is built from
    "EM_AARCH64": {"name": "aarch64", "debian": "arm64", "qemu": "qemu-aarch64-static", "wheel": "manylinux_2_28_aarch64"},
}
ROOTS = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6")  # Python, its stdlib, and what TVM links
SKIP = {"debconf", "debconf-2.0", "perl-base", "dpkg", "install-info", "readline-common", "tzdata", "media-types",
        "netbase", "libc-bin", "gcc-12-base", "base-files", "mawk", "awk"}  # fmt: skip
MAX_PACKAGES = 60
MAX_DOWNLOAD = 256 << 20  # bytes of one download


def host_machine() -> str:
    """The host's ELF machine name, as pyelftools spells it."""
    import platform

    return {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "arm64": "EM_AARCH64"}.get(platform.machine(), platform.machine())


ELF_MACHINES = {3: "EM_386", 40: "EM_ARM", 62: "EM_X86_64", 183: "EM_AARCH64", 243: "EM_RISCV"}
RPC_ENV = "ZEN_TVM_RPC"  # host:port of the emulated runtime, for the probe and check children


def library_machine(path: Path) -> str | None:
    """The ELF machine of a library (pyelftools' name, or EM_<number>), None for a file that is not ELF."""
    with open(path, "rb") as fh:
        head = fh.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    number = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return ELF_MACHINES.get(number, f"EM_{number}")


def arch_name(machine: str) -> str:
    return ARCHES[machine]["name"] if machine in ARCHES else {"EM_X86_64": "x86_64"}.get(machine, machine)


@contextlib.contextmanager
def runtime_for(library: Path, timeout: float = 300.0):
    """The environment a child needs to run `library`'s kernels: {} on its own architecture; else an emulated TVM
    runtime is started for the duration (its address in RPC_ENV). Raises ZenError naming what is missing."""
    machine = library_machine(Path(library))
    if machine is None or machine == host_machine():
        yield {}
        return
    yield {RPC_ENV: shared_server(machine, timeout)}


_SERVERS: dict[str, tuple[contextlib.ExitStack, dict]] = {}


def shared_server(machine: str, timeout: float = 300.0) -> str:
    """host:port of this process's emulated runtime for `machine`: started on first use (about 9 s, TVM imported
    under emulation) and kept for later children (probing, then the equivalence check), stopped when zen exits."""
    import atexit

    held = _SERVERS.get(machine)
    if held is None or held[1]["proc"].poll() is not None:
        stack = contextlib.ExitStack()
        where = stack.enter_context(rpc_server(machine, timeout))
        _SERVERS[machine] = held = (stack, where)
        atexit.register(stack.close)
    return f"{held[1]['host']}:{held[1]['port']}"


def load_library(tvm, path: str | Path):
    """(module, device) in a probe or check child: the library loaded here, or uploaded to the emulated runtime
    named by RPC_ENV and loaded there (then its tensors must be made on that device)."""
    where = os.environ.get(RPC_ENV)
    if not where:
        return tvm.runtime.load_module(str(path)), tvm.cpu()
    from tvm import rpc

    host, _, port = where.rpartition(":")
    remote = rpc.connect(host, int(port))
    data = Path(path).read_bytes()
    # a server outlives one session: each upload gets a new name (rewriting a file the server has loaded would
    # corrupt its mapping, and loading the same name again would give the old library back)
    name = f"{hashlib.sha256(data).hexdigest()[:16]}-{os.getpid()}-{time.monotonic_ns()}-{Path(path).name}"
    remote.upload(bytearray(data), target=name)
    module = remote.load_module(name)
    _SESSIONS.append(remote)  # the session must outlive the module and every tensor made on it
    return module, remote.cpu()


_SESSIONS: list = []


def tuple_items(value) -> list:
    """The tensors of a VM result: a tensor, a local tuple, or (emulated) a reference to a remote tuple."""
    if hasattr(value, "numpy"):
        return [value]
    if type(value).__name__ == "RPCObjectRef" and _SESSIONS:
        size, item = _SESSIONS[-1].get_function("ffi.ArraySize"), _SESSIONS[-1].get_function("ffi.ArrayGetItem")
        return [item(value, i) for i in range(int(size(value)))]
    return list(value)


def env_dir(machine: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "zen" / "emulated" / ARCHES[machine]["name"]


def ready(machine: str) -> bool:
    return machine in ARCHES and (env_dir(machine) / "ready.json").is_file()


def build_hint(machine: str) -> str:
    if machine not in ARCHES:
        return f"zen cannot run {machine} code on this machine (emulated: {', '.join(a['name'] for a in ARCHES.values())})"
    arch = ARCHES[machine]["name"]
    return f"build the emulated {arch} environment once: python -m zen.compiled.emulation build {arch}"


def python_argv(machine: str) -> list[str]:
    """argv that starts the emulated Python (its environment: `python_env`)."""
    d = env_dir(machine)
    return [str(d / "qemu"), "-L", str(d / "sysroot"), str(d / "sysroot" / "usr" / "bin" / "python3.11")]


def python_env(machine: str) -> dict[str, str]:
    d = env_dir(machine)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_", "QEMU_"))}
    # TVM_USE_RUNTIME_LIB: libtvm_runtime alone (kernels are run there, never compiled): the emulated server then
    # starts in 7 s instead of 18 (TVM's LLVM is not loaded)
    return {**keep, "PYTHONPATH": str(d / "site"), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "TVM_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "TVM_USE_RUNTIME_LIB": "1"}  # fmt: skip


@contextlib.contextmanager
def rpc_server(machine: str, timeout: float = 300.0):
    """A TVM RPC server in the emulated environment, on a free loopback port: yields {"host", "port", "proc"}; stopped
    after."""
    if not ready(machine):
        raise ZenError(f"the library is compiled for {machine}, and the emulated environment is not built", build_hint(machine))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [*python_argv(machine), str(Path(__file__).parent / "kernels" / "emulated_server.py"), str(port)]
    import tempfile

    log = tempfile.TemporaryFile()  # not a pipe: TVM logs every upload, and a full pipe would stop the server
    proc = subprocess.Popen(argv, env=python_env(machine), stdout=subprocess.PIPE, stderr=log, cwd=str(env_dir(machine)),
                            start_new_session=True)  # fmt: skip
    try:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ok = bool(sel.select(timeout)) and proc.stdout.readline().strip() == b"READY"
        if not ok:
            if proc.poll() is None:
                raise ZenError(f"the emulated TVM RPC server did not start within {timeout:.0f} s", "raise --timeout")
            log.seek(0)
            err = log.read().decode(errors="replace")[-400:]
            raise ZenError(f"the emulated TVM RPC server did not start: {err.strip()}", build_hint(machine))
        yield {"host": "127.0.0.1", "port": port, "proc": proc}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
        log.close()


# -- building the environment ------------------------------------------------------------------------------------


def _get(url: str, limit: int = MAX_DOWNLOAD) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 - a fixed https/http mirror
        data = r.read(limit + 1)
    if len(data) > limit:
        raise ZenError(f"{url} is larger than {limit >> 20} MiB", "check ZEN_DEBIAN_MIRROR")
    return data


def _index(debian_arch: str, log) -> dict[str, dict]:
    """Package -> stanza of the suite's main index for `debian_arch`, its digest checked against the signed Release."""
    release = _get(f"{MIRROR}/dists/{SUITE}/InRelease", 1 << 20)
    if KEYRING.is_file() and shutil.which("gpgv"):
        proc = subprocess.run(["gpgv", "--keyring", str(KEYRING)], input=release, capture_output=True)
        if proc.returncode:
            raise ZenError("the Debian Release file's signature does not verify", proc.stderr.decode(errors="replace")[-300:])
        log("  Release signature verified (gpgv)")
    name = f"main/binary-{debian_arch}/Packages.xz"
    m = re.search(rb"^ ([0-9a-f]{64})\s+\d+\s+" + re.escape(name.encode()) + rb"$", release.split(b"SHA256:")[-1], re.M)
    if m is None:
        raise ZenError(f"the Release file lists no {name}")
    raw = _get(f"{MIRROR}/dists/{SUITE}/{name}")
    if hashlib.sha256(raw).hexdigest() != m.group(1).decode():
        raise ZenError(f"{name} does not match the Release file's sha256")
    out: dict[str, dict] = {}
    for stanza in lzma.decompress(raw).decode("utf-8", "replace").split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", stanza, re.M))
        if "Package" in fields:
            out.setdefault(fields["Package"], fields)
    return out


def _closure(index: dict[str, dict], roots: tuple[str, ...]) -> list[dict]:
    seen: dict[str, dict] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in SKIP:
            continue
        stanza = index.get(name)
        if stanza is None:
            continue  # a virtual package: what provides it is in the closure already or not needed to run Python
        seen[name] = stanza
        if len(seen) > MAX_PACKAGES:
            raise ZenError(f"more than {MAX_PACKAGES} packages would be needed: the index is not what zen expects")
        for dep in ", ".join(filter(None, (stanza.get("Pre-Depends"), stanza.get("Depends")))).split(","):
            first = dep.split("|")[0].strip().split(" ")[0].split(":")[0]
            if first:
                todo.append(first)
    return list(seen.values())


def _deb_data(deb: bytes) -> tarfile.TarFile:
    """The data.tar.* member of a .deb (an ar archive), opened."""
    if not deb.startswith(b"!<arch>\n"):
        raise ZenError("a downloaded package is not a .deb")
    pos = 8
    while pos + 60 <= len(deb):
        head = deb[pos : pos + 60]
        name, size = head[:16].decode().strip().rstrip("/"), int(head[48:58].decode().strip())
        body = deb[pos + 60 : pos + 60 + size]
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(body), mode="r:*")
        pos += 60 + size + (size & 1)
    raise ZenError("a downloaded package has no data member")


def _fetch(stanza: dict) -> bytes:
    deb = _get(f"{MIRROR}/{stanza['Filename']}")
    if hashlib.sha256(deb).hexdigest() != stanza.get("SHA256"):
        raise ZenError(f"{stanza['Package']} does not match the index's sha256")
    return deb


def build(arch: str, log=print) -> Path:
    """Build the emulated environment for `arch` (e.g. aarch64) into the cache; its directory."""
    machine = next((m for m, a in ARCHES.items() if a["name"] == arch), None)
    if machine is None:
        raise ZenError(f"no emulated environment for {arch!r}", f"known: {', '.join(a['name'] for a in ARCHES.values())}")
    spec, final = ARCHES[machine], env_dir(machine)
    work = final.with_name(final.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    (work / "sysroot").mkdir(parents=True)
    t0 = time.monotonic()
    packages = _closure(_index(spec["debian"], log), ROOTS)
    log(f"  {len(packages)} Debian {spec['debian']} packages: " + ", ".join(sorted(p["Package"] for p in packages)))
    for stanza in packages:
        with _deb_data(_fetch(stanza)) as tar:
            tar.extractall(work / "sysroot", filter="tar")
    host = _index("amd64", log)
    with _deb_data(_fetch(host["qemu-user-static"])) as tar:
        member = tar.getmember(f"./usr/bin/{spec['qemu']}")
        (work / "qemu").write_bytes(tar.extractfile(member).read())
    (work / "qemu").chmod(0o755)
    log(f"  qemu-user-static {host['qemu-user-static']['Version']}")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(work / "site"), "--platform",
           spec["wheel"], "--python-version", "3.11", "--only-binary=:all:", f"apache-tvm=={TVM_VERSION}", "numpy"]  # fmt: skip
    proc = subprocess.run(pip, capture_output=True, text=True)
    if proc.returncode:
        raise ZenError(f"pip could not fetch the {arch} wheels: {proc.stderr.strip()[-400:]}")
    final_argv = [str(work / "qemu"), "-L", str(work / "sysroot"), str(work / "sysroot/usr/bin/python3.11"), "-c",
                  "import tvm, numpy, platform; print(platform.machine(), tvm.__version__, numpy.__version__)"]  # fmt: skip
    env = {**python_env(machine), "PYTHONPATH": str(work / "site")}
    check = subprocess.run(final_argv, capture_output=True, text=True, env=env, timeout=600)
    if check.returncode or arch not in check.stdout:
        raise ZenError(f"the emulated Python does not import TVM: {(check.stderr or check.stdout).strip()[-400:]}")
    made = {"arch": arch, "packages": sorted(p["Package"] for p in packages), "reports": check.stdout.split(),
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
    (work / "ready.json").write_text(json.dumps(made))
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    log(f"  ready: {check.stdout.strip()} in {time.monotonic() - t0:.0f} s, at {final}")
    return final


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "build":
        print("usage: python -m zen.compiled.emulation build ARCH   (ARCH: aarch64)", file=sys.stderr)
        return 2
    try:
        build(argv[1])
    except ZenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
