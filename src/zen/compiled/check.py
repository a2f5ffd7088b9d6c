"""Child process: run the TVM library's VM and the rebuilt package on the same inputs, compare.

    python -m zen.compiled.check LIBRARY PACKAGE_DIR [TRIALS [CALL_LIMIT]]

Prints JSON: max abs difference over all outputs and trials, and the outputs' magnitude. Loads
the library through TVM and imports the generated package, so zen only runs it as a child. Both
compute on one thread (as probing does), so the difference recorded does not follow the core count.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    from zen.compiled.kernels.probe import THREADS
    from zen.compiled.kernels.watchdog import announce, watched

    os.environ["TVM_NUM_THREADS"] = str(THREADS)
    import torch
    import tvm
    from tvm import relax

    torch.set_num_threads(THREADS)

    lib, pkg_dir = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    limit = float(sys.argv[4]) if len(sys.argv) > 4 else None  # seconds one run of the library's main may take
    sys.path.insert(0, str(pkg_dir.parent))
    pkg = importlib.import_module(pkg_dir.name)
    from_model = importlib.import_module(pkg_dir.name + ".model")
    gen = torch.Generator().manual_seed(1)
    params = {n: torch.randn(shape, generator=gen).to(getattr(torch, d)) for n, shape, d in from_model.DETACHED}
    model = pkg.load(params=params)
    from zen.compiled.emulation import load_library, tuple_items

    module, dev = load_library(tvm, lib)  # here, or in the emulated runtime (zen.compiled.emulation)
    vm = relax.VirtualMachine(module, dev)
    worst, scale = 0.0, 0.0
    for _ in range(trials):
        xs = [torch.randn(s, generator=gen).to(getattr(torch, d)) for s, d in from_model.INPUTS]
        data = iter(xs)
        args = [params[name] if detached else next(data) for name, detached in from_model.VM_INPUTS]
        announce("the library's main function")
        with watched(limit):
            got = vm["main"](*[tvm.runtime.tensor(a.numpy(), device=dev) for a in args])
        ref = [o.numpy() for o in tuple_items(got)]  # a tensor, or a tuple of them
        with torch.no_grad():
            mine = model(*xs)
        mine = [m.numpy() for m in (mine if isinstance(mine, tuple) else (mine,))]
        if len(mine) != len(ref) or any(a.shape != b.shape for a, b in zip(mine, ref)):
            print(json.dumps({"error": "outputs differ in number or shape"}))
            return 1
        for a, b in zip(mine, ref):
            worst = max(worst, float(np.abs(a.astype(np.float64) - b).max(initial=0.0)))
            scale = max(scale, float(np.abs(b).max(initial=0.0)))
    print(json.dumps({"max_abs_diff": worst, "max_abs_output": scale, "trials": trials}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
