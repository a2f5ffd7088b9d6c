"""Packed quantized Linears rebuilt with PyTorch's own packing (`set_weight_bias`, i.e. `linear_prepack`).

zen reads the int8 weight, its scales and zero points and the bias out of fbgemm's packed object
(`frontends/pytorch/quantized`); the runnable copy packs them again the way the deployed process did, so the
packed buffer, its column offsets and the outputs are those of the deployment. Runs in the reuse child only.
"""

from __future__ import annotations

from typing import Any

SUFFIX = "._packed_params.weight"


def packed_paths(mr) -> dict[str, Any]:
    """Module path of each LinearPackedParams whose weight was unpacked -> the weight's record."""
    return {t.key[: -len(SUFFIX)]: t for t in mr.tensors if t.quantization.get("packed") and t.key.endswith(SUFFIX)}


def repack(objs: dict[str, Any], records: dict[str, Any], tensor, keys: set[str], bias_records: dict[str, Any]) -> int:
    """Give each LinearPackedParams its packed weight again; `tensor(key)` loads a tensor of the weights file,
    whose keys are `keys`."""
    import warnings

    import torch

    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")  # torch's own deprecation
    for path, rec in records.items():
        q = rec.quantization
        data = tensor(rec.key)
        if q["qscheme"] == "per_channel_affine":
            scales = torch.tensor(q["scale"], dtype=torch.float64)
            weight = torch._make_per_channel_quantized_tensor(data, scales, torch.tensor(q["zero_point"]), q.get("axis", 0))
        else:
            weight = torch._make_per_tensor_quantized_tensor(data, float(q["scale"][0]), int(q["zero_point"][0]))
        bias_key = f"{path}._packed_params.bias"
        bias = tensor(bias_key) if bias_key in keys else None
        brec = bias_records.get(bias_key)
        if bias is not None and brec is not None and brec.python_type == "torch.nn.parameter.Parameter":
            bias = torch.nn.Parameter(bias, requires_grad=brec.requires_grad)  # as the deployed module held it
        objs[path].set_weight_bias(weight, bias)
    return len(records)
