"""A process serving every variant of one test family, with ground truth for code recovery.

Run: python family_target.py OUTDIR FAMILY [--obfuscate VARIANT] [--src DIR]
Materialises the family's variants into OUTDIR, imports each as its own module, builds and runs
its model, and writes OUTDIR/truth.json: per variant the model id, its state/io files, and the
model-specific functions/classes/code objects computed from live objects (code_truth.py);
OUTDIR/VARIANT.code.marshal holds those code objects. With --obfuscate V, variant V is imported
under a meaningless module name and its module, classes and functions are renamed at run time.
--src DIR materialises the variants' files there (so two processes can import the same files).
"""

from __future__ import annotations

import json
import marshal
import os
import sys
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))  # bench/families
sys.path.insert(0, HERE)
import code_truth  # noqa: E402
from families import FAMILIES, load  # noqa: E402

torch.set_num_threads(1)
KEEP: list = []


def obfuscate(mod: types.ModuleType, alias: str) -> None:
    """Rename a loaded module, its classes and functions, as an adversary hiding a fork would."""
    old = mod.__name__
    sys.modules.pop(old, None)
    mod.__name__ = alias
    sys.modules[alias] = mod
    for i, (_name, v) in enumerate(sorted(vars(mod).items())):
        if isinstance(v, type) and v.__module__ == old:
            v.__module__ = alias
            v.__name__ = v.__qualname__ = f"K{i:03d}"
            for attr in vars(v).values():
                for f in code_truth.functions_in(attr):
                    f.__module__ = alias
        elif isinstance(v, types.FunctionType) and v.__module__ == old:
            v.__module__ = alias


def addresses(model) -> dict[str, int]:
    """Where what a recovery must read lies in this process (module objects and their dicts, tensor
    objects, TensorImpls, weight bytes): lets a test cut an image through one of them."""
    out: dict[str, int] = {}
    for mname, m in model.named_modules():
        for what, obj in (("module", m), ("dict", m.__dict__), ("parameters", m._parameters)):
            out[f"{what} {mname}"] = id(obj)
        for k, t in [*m._parameters.items(), *m._buffers.items()]:
            if t is not None:
                key = f"{mname}.{k}" if mname else k
                out[f"object {key}"], out[f"impl {key}"] = id(t), t._cdata
                if t.numel():
                    out[f"data {key}"] = t.data_ptr()
    return out


def main(outdir: str, family: str, obfuscated: str | None, src: str) -> None:
    truth = {"pid": os.getpid(), "family": family, "variants": {}}
    models = {}
    for name in FAMILIES[family]:
        mod = load(name, __import__("pathlib").Path(src))
        if name == obfuscated:
            obfuscate(mod, "m_7f3a9c")
        model, x = mod.build(1)
        with torch.no_grad():
            y = model(x)
        torch.save(model.state_dict(), os.path.join(outdir, f"{name}.state.pt"))
        torch.save({"input": x, "output": y}, os.path.join(outdir, f"{name}.io.pt"))
        KEEP.append((mod, model, x, y))
        models[name] = model
    gt = code_truth.Truth()
    for name, model in models.items():
        info, codes = code_truth.model_truth(gt, model)
        info["model_id"] = id(model)
        info["module"] = type(model).__module__
        info["addresses"] = addresses(model)
        truth["variants"][name] = info
        with open(os.path.join(outdir, f"{name}.code.marshal"), "wb") as fh:
            marshal.dump({str(i): c for i, c in codes.items()}, fh)
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    print("READY", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    args = sys.argv[1:]
    obf = args[args.index("--obfuscate") + 1] if "--obfuscate" in args else None
    src = args[args.index("--src") + 1] if "--src" in args else args[0]
    main(args[0], args[1], obf, src)
