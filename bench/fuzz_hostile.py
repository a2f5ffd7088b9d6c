"""Hand-built hostile inputs (issue 49), the kinds `bench/fuzz_cli.py --kinds gpu,service,lying` runs.

Random mutation found nothing where hand-built inputs found exit 70s and 15 GB allocations, so each run here builds
its input by hand from a seeded choice of what an attacker would try:
  * gpu     - GPU cores: `.zen.acquisition` notes nested up to 300,000 deep, 1,000-150,000 sections (spread, at one
              address, overlapping), tables claiming 2^40 entries or 0-byte entries, header fields at boundaries, a
              file cut short, a gzip bomb (inflating 1,000x); `zen info CORE [--json]`;
  * service - requests to one `zen serve` (SQLite): names `.`/`..`/control characters/2,000 characters, bodies that
              declare 300 MB and stall, bodies within the caps that stall or trickle (the server runs with
              `--body-timeout 5`), disconnects mid-upload, gzip-bombed and 100,000-deep JSON parts, junk
              multipart, tokens in the query string; judged by the status (never 5xx), the server still answering,
              no traceback in its log and no token in it;
  * lying   - a real case whose weights file claims a tensor of up to 10^9 elements (a sparse file that holds it),
              one beyond its file, or a dtype the bytes do not fit, the manifest rehashed to match; `zen drift`,
              `zen verify-case`, `zen report`: a run over 2 GiB of memory is bad.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import random
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
MAX_RSS_MB = 2048


def gpu_input(work: Path, rng: random.Random, i: int, bomb: Path) -> tuple[str, Path, list]:
    from zen.memory.gpu.writer import Range, write_gpu_core

    p = work / f"g{i}.nvcudmp"
    dev = [{"devName": "Sim", "smType": "sm_80", "numSMs": 4, "smMajor": 8}]
    how = rng.choice(["deep", "many", "same", "overlap", "tables", "header", "cut", "bomb"])
    if how == "bomb":
        shutil.copyfile(bomb, p.with_suffix(".gz"))
        return "gzip bomb", p.with_suffix(".gz"), ["info", p.with_suffix(".gz")]
    if how in ("many", "same", "overlap"):
        n = rng.randint(1000, 150_000)
        step = {"many": 4096, "same": 0, "overlap": 32}[how]
        ranges = [Range(0x7F00_0000_0000 + k * step, 64, b"\x01" * 64) for k in range(n)]
        write_gpu_core(p, ranges, devices=dev)
        label = f"{n:,} sections ({how})"
    else:
        levels = rng.choice([40, 1000, 200_000, 300_000]) if how == "deep" else 0
        note = {"p": "X" * (levels * 6 + 8)} if how == "deep" else {"route": "fuzz"}
        write_gpu_core(p, [Range(0x7F00_0000_0000, 4096, b"\x02" * 4096)], devices=dev, note=note)
        raw = bytearray(p.read_bytes())
        label = how
        if how == "deep":
            blob = json.dumps(note, sort_keys=True).encode()
            at = raw.find(blob)
            deep = (b'{"a":' * levels + b"1" + b"}" * levels).ljust(len(blob))
            raw[at : at + len(blob)] = deep[: len(blob)]
            label = f"note nested {levels:,} deep"
        elif how in ("tables", "header"):
            shoff = struct.unpack_from("<Q", raw, 40)[0]
            shnum = struct.unpack_from("<H", raw, 60)[0]
            k = rng.randrange(1, shnum)
            field, fmt, value = rng.choice([(32, "<Q", 1 << 40), (56, "<Q", 0), (56, "<Q", 1), (32, "<Q", (1 << 64) - 1),
                                            (24, "<Q", (1 << 64) - 64), (40, "<I", 0xFFFF), (44, "<I", 1 << 31)])  # fmt: skip
            if how == "header":
                field, fmt, value, k = rng.choice([(40, "<Q", 1 << 62), (60, "<H", 0), (62, "<H", 0xFFFF), (58, "<H", 1)]) + (
                    -1,)  # fmt: skip
            at = field if k < 0 else shoff + k * 64 + field
            struct.pack_into(fmt, raw, at, value)
            label = f"{how}: field {field} of {'the header' if k < 0 else f'section {k}'} = {value:#x}"
        elif how == "cut":
            cut = rng.randrange(64, len(raw))
            raw = raw[:cut]
            label = f"cut at {cut:,} of {len(raw):,}"
        p.write_bytes(bytes(raw))
    return label, p, ["info", p] + (["--json"] if rng.random() < 0.5 else [])


def make_bomb(work: Path) -> Path:
    from zen.memory.gpu.writer import Range, write_gpu_core

    core = work / "bomb-core.nvcudmp"
    write_gpu_core(core, [Range(0x7F00_0000_0000, 64, b"\x01" * 64)],
                   devices=[{"devName": "Sim", "smType": "sm_80", "numSMs": 4, "smMajor": 8}])  # fmt: skip
    bomb = work / "bomb.nvcudmp.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as gz:
        gz.write(core.read_bytes())
        zeros = b"\0" * (64 << 20)
        for _ in range(1024 // 64):  # 1 GiB of zeros after the core: about 1 MB on disk
            gz.write(zeros)
    return bomb


# -- the library service -----------------------------------------------------------------------------------------


def service_request(url: str, token: str, rng: random.Random) -> tuple[str, object]:
    """(label, HTTP status or "closed") of one hand-built request; "closed": the server closed without answering."""
    import httpx

    auth = {"Authorization": f"Bearer {token}"}
    how = rng.choice(["name", "get", "stall", "disconnect", "bomb", "deep", "junk", "query", "auth", "slow", "trickle"])
    name = rng.choice([".", "..", "a\nb", "\t", "\x1b[31m", "x" * 2000, "a/../b", "%2e%2e", "ok-name", " sp", "ü/?#"])
    try:
        if how == "name":
            files = {"manifest": ("manifest.json", b"{}"), "mr": ("mr.json", b"{}")}
            r = httpx.post(url + "/models", headers=auth, data={"name": name}, files=files, timeout=30)
            return f"POST /models name={name[:20]!r}", r.status_code
        if how == "get":
            r = httpx.get(url + "/models/" + quote(name, safe=rng.choice(["", "/", "."])), headers=auth, timeout=30)
            return f"GET /models/{name[:20]!r}", r.status_code
        if how == "query":
            r = httpx.get(url + "/models", params={"token": token, "name": name}, timeout=30)
            return "token in the query", r.status_code
        if how == "auth":
            r = httpx.get(url + "/models", headers={"Authorization": rng.choice(["Bearer", "Bearer " + "z" * 10_000,
                                                                                  "Basic ::", "\x00"])}, timeout=30)  # fmt: skip
            return "odd Authorization", r.status_code
        if how in ("stall", "disconnect"):
            where = urlsplit(url)
            head = (
                f"POST /models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: multipart/form-data;"
                f" boundary=zz\r\nContent-Length: {rng.choice([300_000_000, 5_000_000, 10**15])}\r\n\r\n"
            ).encode()
            with socket.create_connection((where.hostname, where.port), timeout=30) as s:
                s.sendall(head + (b"--zz\r\n" + b"x" * rng.randint(0, 100_000) if how == "disconnect" else b""))
                if how == "disconnect":
                    return "disconnect mid-upload", "closed"
                got = s.recv(64)
            return "declared oversize, stalled", int(got[9:12]) if got.startswith(b"HTTP/1.1 ") else "closed"
        if how in ("slow", "trickle"):  # within the caps, then nothing or a byte at a time: a 408 after --body-timeout
            where = urlsplit(url)
            head = (f"POST /models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: multipart/form-data;"
                    " boundary=zz\r\nContent-Length: 1000000\r\n\r\n--zz\r\nContent-Disposition: form-data; "
                    'name="mr"; filename="mr.json"\r\n\r\n').encode()  # fmt: skip
            with socket.create_connection((where.hostname, where.port), timeout=30) as s:
                s.sendall(head + b"{" * rng.randint(0, 1000))
                with contextlib.suppress(OSError):
                    while how == "trickle" and not select.select([s], [], [], 0.5)[0]:
                        s.sendall(b" ")
                got = s.recv(64)
            return f"{how} body within the caps", int(got[9:12]) if got.startswith(b"HTTP/1.1 ") else "closed"
        if how == "bomb":
            files = {"mr": ("mr.json.gz", gzip.compress(b"\0" * (rng.randint(20, 80) << 20), 9))}
            r = httpx.post(url + "/attribute", headers=auth, files=files, timeout=60)
            return "gzip bomb part", r.status_code
        if how == "deep":
            depth = rng.choice([1000, 100_000])
            files = {"mr": ("mr.json", b"[" * depth + b"]" * depth), "pr": ("pr.json", b"{}")}
            r = httpx.post(url + "/attribute", headers=auth, files=files, timeout=60)
            return f"{depth:,}-deep JSON part", r.status_code
        body = rng.randbytes(rng.randint(0, 4096))
        r = httpx.post(url + "/models", headers={**auth, "Content-Type": "multipart/form-data; boundary=" + "b" * 70},
                       content=body, timeout=30)  # fmt: skip
        return "junk multipart", r.status_code
    except (httpx.TransportError, OSError):
        return how, "closed"


def judge_service(status) -> str | None:
    if status == "closed" or (isinstance(status, int) and status < 500):
        return None
    return f"status {status}"


def server_token(lib: Path) -> str:
    res = subprocess.run([sys.executable, "-m", "zen", "serve", "token", "add", "--name", "fuzz", "--scope", "curate",
                          "--library", str(lib)], capture_output=True, text=True, check=True)  # fmt: skip
    return res.stdout.strip()


# -- lying cases -------------------------------------------------------------------------------------------------


def lying_case(base: Path, dst: Path, rng: random.Random) -> str:
    """A copy of `base` whose weights file claims more than it should, rehashed to match (a consistent lie)."""
    shutil.copytree(base, dst)
    w = dst / "weights.safetensors"
    raw = w.read_bytes()
    n = struct.unpack_from("<Q", raw, 0)[0]
    header = json.loads(raw[8 : 8 + n])
    key = rng.choice([k for k in header if k != "__metadata__"])
    e = header[key]
    how = rng.choice(["huge", "beyond", "dtype", "shape"])
    if how == "huge":
        numel = rng.choice([10**8, 10**9])
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
        e.update(dtype="F32", shape=[numel], data_offsets=[end, end + 4 * numel])
    elif how == "beyond":
        e["data_offsets"] = [e["data_offsets"][0], e["data_offsets"][1] + rng.choice([8, 1 << 40])]
    elif how == "dtype":
        e["dtype"] = rng.choice(["F64", "BF16", "I8", "BOOL", "F8_E4M3"])
    else:
        e["shape"] = [rng.choice([0, 1, 1 << 31, (1 << 63) - 1]) for _ in range(rng.randint(1, 4))]
    text = json.dumps(header).encode()
    data = raw[8 + n :]
    with open(w, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + data)
        if how == "huge":
            fh.truncate(8 + len(text) + e["data_offsets"][1])  # a sparse file that holds what it claims
    man = json.loads((dst / "manifest.json").read_text())
    if how != "huge":  # rehashing a 4 GB sparse file costs seconds: the huge lie is checked unhashed too
        import hashlib

        man["files"]["weights.safetensors"] = hashlib.sha256(w.read_bytes()).hexdigest()
    (dst / "manifest.json").write_text(json.dumps(man))
    return f"{how} {key}"


def run_hostile(kind: str, a, work: Path, stats, zen, judge, make_process_image) -> None:
    """Run `a.runs` hand-built inputs of `kind` (helpers passed in by fuzz_cli.py: its runner, judge and target)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    ctx: dict = {}
    if kind == "gpu":
        ctx["bomb"] = make_bomb(work)
    elif kind == "service":
        sys.path.insert(0, str(ROOT / "tools"))
        from zenserver import ZenServer

        lib = work / "served.sqlite"
        subprocess.run([sys.executable, "-m", "zen", "library", "list", "--library", str(lib)], capture_output=True)
        ctx["token"] = server_token(lib)
        ctx["server"] = ZenServer(lib, "--max-upload-mb", "16", "--body-timeout", "5").start()
    elif kind == "lying":
        img = make_process_image(work)
        ctx["base"] = work / "base-case"
        subprocess.run([sys.executable, "-m", "zen", "recover", str(img), "-o", str(ctx["base"])], capture_output=True)
        img.unlink()

    def one(i: int) -> None:
        rng = random.Random(f"{a.seed}:{kind}:{i}")
        if kind == "service":
            t = time.monotonic()
            label, status = service_request(ctx["server"].url, ctx["token"], rng)
            bad = judge_service(status) or (None if ctx["server"].alive() else "the server died")
            stats.add(kind, f"#{i} {label}", status, time.monotonic() - t, 0, bad)
            return
        if kind == "gpu":
            label, path, args = gpu_input(work, rng, i, ctx["bomb"])
            runs = [args]
        else:
            case = work / f"lie{i}"
            label = lying_case(ctx["base"], case, rng)
            path = case
            runs = [rng.choice([["drift", ctx["base"], case], ["verify-case", case], ["report", case, "-o", work / f"r{i}.md"]])]
        for args in runs:
            rc, secs, rss, err = zen(args, a.timeout, work)
            bad = judge(rc, err) or (f"{rss} MiB of memory" if rss > MAX_RSS_MB else None) or (
                "over 30 s" if secs > 30 else None)  # fmt: skip
            stats.add(kind, f"#{i} {label} [{args[0]}]", rc, secs, rss, bad)
            if bad:
                print(f"BAD {kind} #{i} {label}: {bad}", flush=True)
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)

    try:
        with ThreadPoolExecutor(a.jobs) as pool:
            for n, _ in enumerate(pool.map(one, range(a.runs)), 1):
                if n % 100 == 0:
                    print(f"{kind}: {n}/{a.runs} in {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        if "server" in ctx:
            log = ctx["server"].log.read_text()
            ctx["server"].stop()
            for what, found in (("a traceback in the server log", "Traceback" in log),
                                ("the token in the server log", ctx["token"] in log)):  # fmt: skip
                if found:
                    stats.add(kind, what, "log", 0, 0, what)
    stats.kinds.setdefault(kind, {})["seconds"] = round(time.monotonic() - t0)
