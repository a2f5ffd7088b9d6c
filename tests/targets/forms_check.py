"""Load a zen reuse package of a deployment-form case in a fresh process and compare it with the deployed process.

Run: python forms_check.py PACKAGE TARGET_OUTDIR OUT_JSON [DEVICE] [dequantize]
DEVICE (default cpu): where the rebuilt model runs (`load(device=...)`). TARGET_OUTDIR is the forms_target.py
directory (truth.json, io.pt). Writes OUT_JSON: whether the rebuilt model's
output on the deployed request is bit-identical to the deployed response (and the largest difference), and
whether the rebuilt model's own `state_dict()`, described the way the target described the deployed one (a
subclass's inner tensors through its `__tensor_flatten__`, every tensor by sha256), equals the deployed one:
keys, classes and bytes, in the library's own serialization names.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forms_target import describe  # noqa: E402

from zen.reuse.runtime import first_tensor, import_package  # noqa: E402

torch.set_num_threads(1)


def main(pkg_dir: str, target_dir: str, out_path: str, device: str = "cpu", mode: str = "") -> None:
    truth = json.load(open(os.path.join(target_dir, "truth.json")))
    io = torch.load(os.path.join(target_dir, "io.pt"))
    model, report = import_package(pkg_dir).load_with_report(device=device, dequantize=mode == "dequantize")
    with torch.no_grad():
        got = first_tensor(model(io["input"].to(device))).cpu()
    want = io["output"]
    state = {k: describe(v) for k, v in model.state_dict().items()}
    differ = sorted(k for k in set(state) | set(truth["state"]) if state.get(k) != truth["state"].get(k))
    res = {"equal": bool(torch.equal(got, want)), "max_abs_diff": float((got.double() - want.double()).abs().max()),
           "state_equal": not differ, "state_differs": differ[:20], "state_entries": len(truth["state"]),
           "model_class": f"{type(model).__module__}.{type(model).__qualname__}", "report": report,
           "classes": sorted({f"{type(x).__module__}.{type(x).__qualname__}" for x in [*model.modules(), *model.parameters()]})}  # noqa: E501  # fmt: skip
    with open(out_path, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main(*sys.argv[1:6])
