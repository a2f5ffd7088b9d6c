"""Collect the op sequences TVM fuses into kernels, from libraries whose kernel names are intact.

    python tools/fusion_patterns.py LIB.so ... > src/zen/compiled/fusion_patterns.json

A kernel whose name is hashed or renamed says nothing about what it fuses; probing then tries
single operators and, after them, the fusions TVM is known to make (zen.compiled.kernels.plans). This
collects those fusions from real libraries (e.g. the ones bench/decompile.py builds): every
kernel name is split into its ops (zen.compiled.ops.split_kernel_name), and each sequence of
two or more ops is counted once per library that holds it, so that common fusions are tried
first. Static parsing only: nothing in the libraries is run.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from zen.compiled import ops  # noqa: E402
from zen.compiled.errors import ExecutableError  # noqa: E402
from zen.compiled.static.load import load_graph  # noqa: E402


def main(paths: list[str]) -> int:
    seen: Counter = Counter()
    libraries = 0
    for p in paths:
        try:
            graph = load_graph(p)[2]
        except ExecutableError as exc:
            print(f"{p}: skipped ({exc})", file=sys.stderr)
            continue
        libraries += 1
        found = {tuple(t) for t in (ops.split_kernel_name(k) for k in graph.kernels()) if t and len(t) > 1}
        seen.update(found)
    patterns = [{"ops": list(k), "libraries": n} for k, n in sorted(seen.items(), key=lambda e: (-e[1], len(e[0]), e[0]))]
    json.dump(
        {
            "about": "op sequences of fused TVM kernels, counted once per library (tools/fusion_patterns.py)",
            "libraries": libraries,
            "patterns": patterns,
        },
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
