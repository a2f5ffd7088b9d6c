"""Benchmark of attribution time versus library size (issue 5): 10, 100 and 1,000 entries.

    python bench/bench_attribution.py

Images a process of the ConvNet test family, recovers its base and the SE fork, and builds
synthetic libraries around the real base: each extra entry is a copy of a real fingerprint with
perturbed code (a third of its code objects get changed listings and names) and perturbed layer
hyper-parameters, so every entry shares code with the query and is a candidate. Times
`attribute()` (median of 3) for the fork against each library. Writes bench/results/attribution.md.
Targets: <= 1 s at 100 entries, <= 5 s at 1,000.
"""

from __future__ import annotations

import copy
import hashlib
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.acquire.process import acquire  # noqa: E402
from zen.attribute.algorithm import attribute  # noqa: E402
from zen.attribute.invariants import packed  # noqa: E402
from zen.library.store import Library  # noqa: E402
from zen.recover.run import recover  # noqa: E402
from zen.represent import case  # noqa: E402


def perturbed(mr, pr, ur, rng: random.Random):
    mr, pr = copy.deepcopy(mr), copy.deepcopy(pr)
    for c in pr.codes:
        if rng.random() < 0.33:
            c.listing = c.listing + [f"LOAD_CONST {rng.randrange(1000)}", "POP_TOP"]
            c.names = c.names + [f"n{rng.randrange(1000)}"]
            c.listing_sha256 = hashlib.sha256("\n".join(c.listing).encode()).hexdigest()
            c.bytecode_sha256 = hashlib.sha256(c.bytecode_sha256.encode() + b"x").hexdigest()
    for m in mr.modules:
        if "out_channels" in m.hyperparameters and rng.random() < 0.5:
            m.hyperparameters["out_channels"] = repr(rng.choice([8, 12, 16, 24]))
    return mr, pr, ur


def measure(work: Path, sizes=(10, 100, 1000)) -> list[tuple[int, float, str | None, int]]:
    """(library entries, median attribution seconds, attributed, fully compared) per library size."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/targets/family_target.py"), str(work), "convnet"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    if proc.stdout.readline().strip() != "READY":
        raise SystemExit("target failed")
    import json

    truth = json.loads((work / "truth.json").read_text())
    image = work / "convnet.core"
    acquire(proc.pid, image, lean=True)
    proc.stdin.close()
    proc.wait()
    cases = {}
    for name in ("convnet", "convnet_se"):
        cases[name] = recover(image, None, work / f"case-{name}", model=hex(truth["variants"][name]["model_id"])).case_dir
    image.unlink()
    base = (case.load_mr(cases["convnet"]), case.load_pr(cases["convnet"]), case.load_ur(cases["convnet"]))
    query = (case.load_mr(cases["convnet_se"]), case.load_pr(cases["convnet_se"]))
    rng = random.Random(0)
    rows = []
    for size in sizes:
        path = work / f"lib-{size}.sqlite"
        with Library(path, invariants=packed) as lib:
            lib.add("convnet", *base)
            for i in range(size - 1):
                lib.add(f"synthetic-{i:04d}", *perturbed(*base, rng))
            times = []
            for _ in range(3):
                t = time.perf_counter()
                res = attribute(*query, lib)
                times.append(time.perf_counter() - t)
            rows.append((size, statistics.median(times), res.attributed, sum(c.method == "algorithm-1" for c in res.candidates)))
        path.unlink(missing_ok=True)
    return rows


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="zen-bench-attr-"))
    rows = measure(work)
    lines = [
        "# Attribution time versus library size (issue 5)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. Query: the convnet_se "
        "fork recovered from a real image; library: the real convnet base plus perturbed copies (all share code with the "
        "query, so every entry is a candidate).",
        "",
        "| library entries | attribution s (median of 3) | attributed | fully compared (Algorithm 1) |",
        "|---:|---:|---|---:|",
        *[f"| {n:,} | {t:.2f} | {a} | {k} |" for n, t, a, k in rows],
        "",
        "Targets: ≤ 1 s at 100 entries, ≤ 5 s at 1,000.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "attribution.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
