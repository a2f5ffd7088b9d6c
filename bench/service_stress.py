"""The library service under clients and crashes (issue 49): 10 clients adding for minutes while the server is
killed with SIGKILL and restarted, over SQLite and PostgreSQL. Nothing acknowledged may be lost, nothing half written.

    python bench/service_stress.py [--minutes 2] [--clients 10] [--kill-every 15]

Each client adds the same recovered case (a ConvNet of the test families) under names of its own, in a loop, and
records which adds the server acknowledged. A killer sends SIGKILL to `zen serve` every --kill-every seconds (at a
random moment of a write or not) and starts it again on a new port the clients move to. At the end the library is
opened directly: every acknowledged name must be there, and every entry must be whole (tests/library_checks.py:
decodable MR/PR/UR, its code hashes, invariants and audit row, no orphans). Entries committed but not acknowledged
(the connection died with the answer in flight) are counted, not errors. Writes bench/results/service_stress.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tests"), str(ROOT / "bench")]


def a_case(work: Path) -> Path:
    from fuzz_cli import make_process_image

    img = make_process_image(work)
    case = work / "case"
    subprocess.run([sys.executable, "-m", "zen", "recover", str(img), "-o", str(case)], check=True, capture_output=True)
    img.unlink()
    return case


def token(spec: str) -> str:
    res = subprocess.run([sys.executable, "-m", "zen", "serve", "token", "add", "--name", "stress", "--scope", "add",
                          "--library", spec], capture_output=True, text=True, check=True)  # fmt: skip
    return res.stdout.strip()


def stress(spec: str, case: Path, a) -> dict:
    from library_checks import problems
    from zenserver import ZenServer

    from zen.attribute.invariants import packed
    from zen.library.backends import open_library
    from zen.library.remote import RemoteLibrary
    from zen.library.store import LibraryError

    tok = token(spec)
    state = {"server": ZenServer(spec).start(), "kills": 0}
    acked: set[str] = set()
    tried = [0]
    stop = time.monotonic() + a.minutes * 60
    lock = threading.Lock()

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            name = f"c{k}-{i}"
            i += 1
            try:
                with RemoteLibrary(state["server"].url, token=tok) as lib:
                    lib.add_case(case, name)
                with lock:
                    acked.add(name)
            except (LibraryError, OSError):
                time.sleep(0.2)  # the server was killed under it: try the next name on the new server
            with lock:
                tried[0] += 1

    def killer() -> None:
        rng = random.Random(1)
        while time.monotonic() < stop - 5:
            time.sleep(a.kill_every * rng.uniform(0.5, 1.5))
            old = state["server"]
            old.kill9()
            state["kills"] += 1
            state["server"] = ZenServer(spec).start()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)] + [threading.Thread(target=killer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state["server"].stop()
    with open_library(spec, invariants=packed) as lib:
        present = {r["name"] for r in lib.list()}
        broken = problems(lib)
    return {"adds tried": tried[0], "acknowledged": len(acked), "present": len(present), "kills": state["kills"],
            "lost (acknowledged, missing)": len(acked - present), "committed, not acknowledged": len(present - acked),
            "half-written entries": len(broken), "examples": sorted(acked - present)[:5] + broken[:5]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--kill-every", type=float, default=15.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "service_stress.md"))
    a = ap.parse_args()
    from pgcluster import PgCluster

    rows = {}
    with tempfile.TemporaryDirectory(prefix="zen-stress-") as tmp:
        work = Path(tmp)
        case = a_case(work)
        rows["sqlite"] = stress(str(work / "stress.sqlite"), case, a)
        print("sqlite", rows["sqlite"], flush=True)
        with PgCluster() as pg:  # its own directory, readable by the server user it runs as
            rows["postgresql"] = stress(pg.create_db("stress"), case, a)
            print("postgresql", rows["postgresql"], flush=True)
    keys = [k for k in rows["sqlite"] if k != "examples"]
    lines = ["# The library service under clients and SIGKILL", "",
             f"`python bench/service_stress.py --minutes {a.minutes} --clients {a.clients} --kill-every {a.kill_every}` "
             f"on {platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}.", "",
             "| | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]  # fmt: skip
    lines += [f"| {b} | " + " | ".join(str(r[k]) for k in keys) + " |" for b, r in rows.items()]
    bad = [f"{b}: {e}" for b, r in rows.items() for e in r["examples"]]
    lines += ["", "Lost or half-written (examples): " + ("; ".join(bad) if bad else "none") + "."]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
