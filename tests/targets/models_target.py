"""A real process serving several models, with their ground truth.

Run: python models_target.py OUTDIR zoo|hf
Builds the models of one family (models_zoo.py), runs each on its fixed input, and writes per
model: OUTDIR/NAME.state.pt (state_dict), NAME.io.pt (input, output), and OUTDIR/truth.json
(object ids, module trees with hyper-parameters, state_dict keys/dtypes/shapes/strides). Prints
READY and waits on stdin; every model, input and output stays referenced (KEEP, and __main__
globals for the first model).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import models_zoo  # noqa: E402

torch.set_num_threads(1)
PLAIN = (type(None), bool, int, float, complex, str)
KEEP: list = []


def plain(v, depth=3) -> bool:
    if type(v) in PLAIN:
        return True
    if type(v) in (tuple, list) and depth > 0 and len(v) <= 64:
        return all(plain(x, depth - 1) for x in v)
    return False


def tree(model) -> list[dict]:
    out = []
    for path, m in model.named_modules(remove_duplicate=True):
        attrs = vars(m)
        out.append({
            "path": path,
            "class": f"{type(m).__module__}.{type(m).__qualname__}",
            "address": id(m),
            "hyperparameters": {k: repr(v) for k, v in attrs.items() if not k.startswith("_") and plain(v)},
            "parameters": [n for n, p in m._parameters.items() if p is not None],
            "buffers": [n for n, b in m._buffers.items() if b is not None],
            "children": list(m._modules),
        })  # fmt: skip
    return out


def main(outdir: str, family: str) -> None:
    names = models_zoo.ZOO if family == "zoo" else models_zoo.HF
    truth = {"pid": os.getpid(), "torch": torch.__version__, "models": {}, "versions": {}}
    for name in names:
        model, x = models_zoo.build(name) if family == "zoo" else models_zoo.build_hf(name)[:2]
        with torch.no_grad():
            y = model(x)
        if not isinstance(y, torch.Tensor):
            y = y.logits
        sd = model.state_dict()
        torch.save(sd, os.path.join(outdir, f"{name}.state.pt"))
        torch.save({"input": x, "output": y}, os.path.join(outdir, f"{name}.io.pt"))
        truth["models"][name] = {
            "id": id(model),
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "modules": tree(model),
            "state": [{"key": k, "dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape), "stride": list(v.stride()),
                       "device": str(v.device), "id": id(v)} for k, v in sd.items()],
            "input_id": id(x),
        }  # fmt: skip
        KEEP.append((model, x, y))
    globals()["model"] = KEEP[0][0]  # the first model is referenced from __main__ by name
    for pkg in ("torch", "transformers", "peft"):
        if pkg in sys.modules:
            truth["versions"][pkg] = sys.modules[pkg].__version__
    import marshal

    import code_truth

    gt = code_truth.Truth()
    for name, (model, _x, _y) in zip(names, KEEP):
        info, codes = code_truth.model_truth(gt, model)
        truth["models"][name]["code"] = info
        with open(os.path.join(outdir, f"{name}.code.marshal"), "wb") as fh:
            marshal.dump({str(i): c for i, c in codes.items()}, fh)
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    print("READY", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
