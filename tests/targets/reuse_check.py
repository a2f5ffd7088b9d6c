"""Load a zen reuse package in a fresh process and check it against the deployed process's record.

Run: python reuse_check.py PACKAGE IO_PT OUT_JSON [--attack] [--watch MOD,MOD]
Only what the caller put on PYTHONPATH is importable (the base model's code, or nothing for a
self-contained rebuild). Writes OUT_JSON: whether the outputs on the recorded input are
bit-identical (torch.equal) to the deployed model's, the load report, the model class, which of
the watched modules got imported; with --attack also a training step (loss, backward, SGD step) and a
white-box FGSM attack (on the input, or on the first embedding's output for token inputs).
"""

from __future__ import annotations

import json
import sys

import torch

from zen.reuse.runtime import first_tensor, import_package

torch.set_num_threads(1)


def attack(model, x: torch.Tensor) -> dict:
    out: dict = {}
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    y = first_tensor(model(x))
    loss = y.float().pow(2).mean()
    loss.backward()
    grads = [p.grad for p in params if p.grad is not None]
    out["train_loss"] = loss.item()
    out["params_with_grad"] = len(grads)
    out["params_trainable"] = len(params)
    out["grads_finite"] = all(bool(torch.isfinite(g).all()) for g in grads)
    before = params[0].detach().clone()
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= 1e-3 * p.grad
    out["step_changed_weights"] = not torch.equal(before, params[0].detach())
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        clean = first_tensor(model(x)).clone()
    eps = 0.05
    if x.is_floating_point():
        xa = x.clone().requires_grad_(True)
        first_tensor(model(xa)).float().pow(2).mean().backward()
        grad = xa.grad
        with torch.no_grad():
            adv = first_tensor(model(x + eps * grad.sign()))
    else:  # token ids: FGSM on the first embedding's output
        emb = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding))
        delta: dict = {}

        def hook(_m, _i, o):
            if "d" not in delta:
                delta["d"] = torch.zeros_like(o, requires_grad=True)
            return o + delta["d"]

        h = emb.register_forward_hook(hook)
        first_tensor(model(x)).float().pow(2).mean().backward()
        grad = delta["d"].grad
        h.remove()
        step = (eps * grad.sign()).detach()
        h = emb.register_forward_hook(lambda _m, _i, o: o + step)
        with torch.no_grad():
            adv = first_tensor(model(x))
        h.remove()
    out["fgsm_grad_nonzero"] = bool(grad.abs().sum() > 0)
    out["fgsm_changed_output"] = not torch.equal(adv, clean)
    return out


def main(pkg_dir: str, io_path: str, out_path: str, do_attack: bool, watch: set[str]) -> None:
    before = set(sys.modules)
    pkg = import_package(pkg_dir)
    model, report = pkg.load_with_report()
    io = torch.load(io_path)
    x, want = io["input"], io["output"]
    want = want if isinstance(want, torch.Tensor) else first_tensor(want)
    with torch.no_grad():
        got = first_tensor(model(x))
    res = {
        "equal": bool(torch.equal(got, want)),
        "max_abs_diff": float((got.double() - want.double()).abs().max()) if got.shape == want.shape else None,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "training": model.training,
        "report": report,
        "imported": sorted(m for m in set(sys.modules) - before if m in watch),
    }
    if do_attack:
        res["attack"] = attack(model, x)
    with open(out_path, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    args = sys.argv[1:]
    watched = set(args[args.index("--watch") + 1].split(",")) if "--watch" in args else set()
    main(args[0], args[1], args[2], "--attack" in args, watched)
