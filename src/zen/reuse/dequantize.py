"""`load(dequantize=True)` / `zen reuse --dequantize`: a float copy of a rebuilt quantized model. Needs torch.

Why: white-box tools (ART's attacks, gradient-based backdoor searches) and plain inspection want float weights;
the quantized model zen rebuilds exactly runs the library's integer kernels. Each quantized layer's weight is
turned into the float weight its quantization stands for, by the library's own dequantization (torchao's and
quanto's `dequantize()`, bitsandbytes' `dequantize_4bit` and `int8_vectorwise_dequant`), and the layer becomes the
`torch.nn` class its library class derives from (`QLinear`, `Linear4bit`, `Linear8bitLt` -> `nn.Linear`). The
float model computes in float what the quantized model computed with integer kernels: its outputs differ from the
deployed ones by the kernels' rounding, which `zen verify` measures and reports (never silently bit-identical).
"""

from __future__ import annotations

from typing import Any

LIBRARIES = ("torchao.", "optimum.quanto.", "bitsandbytes.")


def _float_weight(module: Any, w: Any):
    """The float weight a quantized weight stands for, or None when `w` is not one zen knows."""
    import torch

    # a library module rebuilt from the image is synthesised as zen_rebuilt.<name> (zen.patch): the same class
    name = f"{type(w).__module__}.{type(w).__qualname__}".removeprefix("zen_rebuilt.")
    if not name.startswith(LIBRARIES):
        return None
    if name == "bitsandbytes.nn.modules.Params4bit":
        import bitsandbytes.functional as F

        data, state = w.data, w.quant_state
        if getattr(state, "packing_format_for_cpu", False):  # bitsandbytes' CPU kernel layout, as it saves it
            data, state = F._convert_weight_packed_for_cpu_inverse(data, state)
        return F.dequantize_4bit(data, state)
    if name == "bitsandbytes.nn.modules.Int8Params":
        import bitsandbytes.functional as F

        scb = w.SCB if getattr(w, "SCB", None) is not None else getattr(getattr(module, "state", None), "SCB", None)
        if scb is None:
            return None
        return F.int8_vectorwise_dequant(w.data, scb).to(torch.float32)
    if hasattr(w, "dequantize"):
        return w.dequantize()
    return None


def dequantize(model: Any) -> list[str]:
    """Replace every quantized weight of `model` by its float weight, in place; what was changed, one line each."""
    import torch

    done: list[str] = []
    parents = {f"{p}.{n}" if p else n: (parent, n) for p, parent in model.named_modules() for n in parent._modules}
    for path, m in list(model.named_modules()):
        w = m._parameters.get("weight")
        if w is None:
            continue
        f = _float_weight(m, w)
        if f is None:
            continue
        before = f"{type(m).__qualname__} with {type(w).__qualname__}"
        base = next((c for c in type(m).__mro__ if c.__module__.startswith("torch.nn.modules")), type(m))
        if base is not type(m):  # the library's layer is a torch.nn one plus its quantized forward: keep the former
            plain = base.__new__(base)
            plain.__dict__.update(m.__dict__)
            if path in parents:
                parent, name = parents[path]
                parent._modules[name] = plain
            m = plain
        bias = m._parameters.get("bias")
        dtype = bias.dtype if bias is not None and bias.is_floating_point() else f.dtype
        m._parameters["weight"] = torch.nn.Parameter(f.detach().to(dtype).contiguous(), requires_grad=False)
        done.append(f"{path or '<root>'}: {before} -> {type(m).__qualname__} with a {dtype} weight")
    return done
