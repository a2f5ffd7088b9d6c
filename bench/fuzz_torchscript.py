"""Hostile TorchScript graphs through the CLI (issue 48): mutated graph nodes of real traced and loaded models.

    python bench/fuzz_torchscript.py [--runs N] [--seed S] [--out FILE]

A traced model is rebuilt from its graphs, a loaded one's constants from its graph nodes: both trust C++ objects
of the image. Each run takes the image of a real process (tests/targets/forms_target.py: jit-trace-cnn, a CNN traced
in the process; jit-load-trace-cnn, the same saved and loaded, its code naming tensor constants), picks a word of
the forward graph the reader walks (a node's kind, input/output/attribute vectors, next pointer; a value's type;
an attribute's value, a type's kind) and overwrites it with a seeded choice (a random word, 0, 1, -1, 2^63, a
count far beyond the vector, another node's address), then runs `zen recover` and, where that exits 0, `zen reuse`.
A run is bad when a command exits 70, prints a traceback or hangs; the counts of rebuilt, refused-and-named and
partial runs say what the mutations did. Results: bench/results/fuzz_torchscript.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from core_edit import peek, poke  # noqa: E402

FORMS = ("jit-trace-cnn", "jit-load-trace-cnn")
BOUNDARY = (0, 1, (1 << 64) - 1, 1 << 63, 0x7FFFFFF0)


def zen(*args, timeout: float = 300) -> tuple[int | None, str]:
    try:
        res = subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True,
                             timeout=timeout, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, "hang"
    return res.returncode, res.stderr


def image(form: str, work: Path) -> tuple[Path, subprocess.Popen]:
    out = work / form
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "targets" / "forms_target.py"), str(out), form],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    if (proc.stdout.readline() if proc.stdout else "").strip() != "READY":
        raise SystemExit(f"{form}: the target did not start")
    core = work / f"{form}.core"
    zen("acquire", "--pid", proc.pid, "-o", core, "--lean")
    return core, proc


def targets(core: Path, work: Path) -> list[tuple[int, int]]:
    """(address, width) of the words the readers trust in the root module's forward graph."""
    prof = json.loads(resources.files("zen.frontends.pytorch").joinpath("profiles", "torch-2.13-x86_64.json").read_text())
    off = {f"{s}.{f}": v[0] for s, d in prof["structs"].items() for f, v in d["fields"].items()}
    zen("recover", core, "-o", work / "base", "--force")
    obj = int(json.loads((work / "base" / "mr.json").read_text())["deployment"]["object"], 16)
    ct = peek(core, obj + off["jitobject.type"])
    graph = peek(core, peek(core, peek(core, ct + off["classtype.methods"])) + off["graphfunction.graph"])
    block = peek(core, graph + off["jitgraph.block"])
    node, last = peek(core, block + off["jitblock.input"]), peek(core, block + off["jitblock.output"])
    out: list[tuple[int, int]] = []
    for _ in range(5000):
        out += [(node + off["jitnode.kind"], 4)] + [(node + off[f"jitnode.{f}"] + k, 8) for f in
                                                     ("inputs", "outputs", "attributes") for k in (0, 8)]  # fmt: skip
        out += [(node + off["jitnode.next"], 8), (node + off["jitnode.range_start"], 8)]
        b, e = peek(core, node + off["jitnode.outputs"]), peek(core, node + off["jitnode.outputs"] + 8)
        for v in [peek(core, b + 8 * i) for i in range(min((e - b) // 8, 4))]:
            t = peek(core, v + off["jitvalue.type"])
            out += [(v + off["jitvalue.type"], 8), (t + off["jittype.kind"], 4)]
        b, e = peek(core, node + off["jitnode.attributes"]), peek(core, node + off["jitnode.attributes"] + 8)
        for a in [peek(core, b + 8 * i) for i in range(min((e - b) // 8, 4))]:
            out += [(a + off["jitattr.name"], 4), (a + off["jitattr.value"], 8), (a + off["jitattr.value"] + 8, 8)]
        if node == last:
            break
        node = peek(core, node + off["jitnode.next"])
    return sorted(set(out))


def mutate(rng: random.Random, core: Path, addr: int, width: int, nodes: list[int]) -> bytes:
    old = peek(core, addr & ~7)
    choice = rng.randrange(5)
    if choice == 0:
        value = rng.getrandbits(64)
    elif choice == 1:
        value = rng.choice(BOUNDARY)
    elif choice == 2:
        value = old + rng.choice((8, 16, 72, 8 * 10**9))  # a vector end claiming more
    elif choice == 3:
        value = rng.choice(nodes)  # another node's address
    else:
        value = old ^ (1 << rng.randrange(64))
    return struct.pack("<I", value & 0xFFFFFFFF) if width == 4 else struct.pack("<Q", value & ((1 << 64) - 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="runs per form")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fuzz_torchscript.md"))
    args = ap.parse_args()
    rows, bad = [], []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="zen-fuzz-ts-") as tmp:
        work = Path(tmp)
        for form in FORMS:
            core, proc = image(form, work)
            proc.kill()
            words = targets(core, work / form)
            nodes = sorted({a for a, w in words if w == 8})
            rng = random.Random(f"{args.seed}-{form}")
            counts = {"rebuilt": 0, "refused": 0, "partial or exit 5/6": 0, "recover other": 0, "bad": 0}
            for run in range(args.runs):
                addr, width = rng.choice(words)
                bad_core = poke(core, work / "bad.core", addr, mutate(rng, core, addr, width, nodes))
                case, pkg = work / "case", work / "pkg"
                shutil.rmtree(case, ignore_errors=True)
                shutil.rmtree(pkg, ignore_errors=True)
                code, err = zen("recover", bad_core, "-o", case, timeout=120)
                outcome = ""
                if code is None or code == 70 or "Traceback" in err:
                    outcome = "bad"
                elif code == 0:
                    code, err = zen("reuse", case, "-o", pkg)
                    outcome = "bad" if code is None or code == 70 or "Traceback" in err else (
                        "rebuilt" if code == 0 else "refused")  # fmt: skip
                else:
                    outcome = "partial or exit 5/6" if code in (5, 6) else "recover other"
                counts[outcome] += 1
                if outcome == "bad":
                    bad.append(f"{form} run {run}: {addr:#x}/{width}: exit {code}: {err.strip().splitlines()[-1:]}")
            rows.append((form, len(words), counts))
            core.unlink()
    lines = ["# Hostile TorchScript graphs (issue 48)", "",
             f"`python bench/fuzz_torchscript.py --runs {args.runs} --seed {args.seed}` on this machine ({os.cpu_count()} "
             f"cores, Python {platform.python_version()}), {time.strftime('%Y-%m-%d')}, {time.time() - t0:.0f} s. Each run "
             "overwrites one word of the root's forward graph of a real process image (a node's kind, vectors, next "
             "pointer, source range; a value's type and its kind; an attribute's name and value), then runs `zen "
             "recover` and, where it exits 0, `zen reuse`. Bad: exit 70, a traceback, or a hang.", "",
             "| form | words targeted | runs | rebuilt | reuse refused | recover partial / exit 5-6 | other exit | bad |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for form, n, c in rows:
        lines.append(f"| {form} | {n} | {args.runs} | {c['rebuilt']} | {c['refused']} | {c['partial or exit 5/6']} | "
                     f"{c['recover other']} | {c['bad']} |")  # fmt: skip
    lines += ["", "Bad runs:" if bad else "No bad run.", *[f"- {b}" for b in bad]]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
