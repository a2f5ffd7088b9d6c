"""What the demo's model processes do: build, run one request, describe themselves, wait.

Each process writes OUTDIR/truth.json (the model object's id, its module classes and a sha256 of
every state_dict tensor) and OUTDIR/request.safetensors / response.safetensors (the input it
served and the output it returned), prints READY and waits on stdin until the demo has imaged it.
zen never reads these files during analysis: the demo uses them for its checks at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch


def serve_model(model: torch.nn.Module, outdir: str, seed: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    for p in model.parameters():  # deterministic weights, different per process
        with torch.no_grad():
            p.copy_(torch.randn_like(p) * 0.2)
    model.eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        y = model(x)
    digests = {k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest() for k, v in model.state_dict().items()}
    truth = {
        "pid": os.getpid(),
        "state_sha256": digests,
        "model_id": id(model),
        "modules": {name or "<root>": type(m).__qualname__ for name, m in model.named_modules()},
        "parameters": sum(p.numel() for p in model.parameters()),
        "prediction": int(y.argmax()),
    }
    from safetensors.torch import save_file

    save_file({"request": x}, os.path.join(outdir, "request.safetensors"))
    save_file({"request": y}, os.path.join(outdir, "response.safetensors"))
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    print("READY", flush=True)
    sys.stdin.read()
    del model, x, y
