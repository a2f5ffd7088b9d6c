"""A deployed system serving one evaluation model, for `bench/run_families.py` to image.

Run: python deploy.py NAME OUTDIR
Builds NAME (a family variant from this directory, imported from OUTDIR/src, or a transformers/
peft scenario from `hf.py`), serves one request, and writes what the process knows about itself:
OUTDIR/request.safetensors and response.safetensors (input and output tensor, key "x"),
state.safetensors (its state_dict, the weights ground truth) and truth.json (pid, model id,
class). Then it waits on stdin, as a serving process waits for the next request.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
torch.set_num_threads(1)


def first_tensor(out):
    """The tensor an output stands for: itself, `.logits`, or the first tensor inside (as zen verify does)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits
    for x in out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ():
        t = first_tensor(x)
        if t is not None:
            return t
    return None


def build(name: str, outdir: Path):
    from families.hf import HF, build_hf

    if name in HF:
        return build_hf(name)
    from families import load

    return load(name, outdir / "src").build(1)


def main(name: str, outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    model, x = build(name, outdir)
    with torch.no_grad():
        y = first_tensor(model(x))
    save_file({"x": x.contiguous()}, str(outdir / "request.safetensors"))
    save_file({"x": y.contiguous()}, str(outdir / "response.safetensors"))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}  # tied weights saved per key
    save_file(state, str(outdir / "state.safetensors"))
    truth = {"pid": os.getpid(), "name": name, "model_id": id(model),
             "class": f"{type(model).__module__}.{type(model).__qualname__}",
             "tensors": len(state), "parameters": sum(p.numel() for p in model.parameters())}  # fmt: skip
    (outdir / "truth.json").write_text(json.dumps(truth))
    print("READY", flush=True)
    sys.stdin.read()
    del model


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
