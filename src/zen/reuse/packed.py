"""Packed quantized Linears, Conv2ds, Conv1ds and embedding tables rebuilt with PyTorch's own packing
(`set_weight_bias`: `linear_prepack`, `conv2d_prepack` with the module's own stride, padding, dilation and groups;
an embedding table's `set_weight`: `embedding_bag_prepack`).

zen reads the int8 weight, its scales and zero points and the bias out of fbgemm's packed Linear or the weight
oneDNN's packed convolution keeps (`frontends/pytorch/quantized`); the runnable copy packs them again the way the
deployed process did, so the packed buffer, its column offsets and the outputs are those of the deployment. Runs
in the reuse child only.
"""

from __future__ import annotations

from typing import Any

SUFFIX = "._packed_params.weight"
TABLE = "._packed_weight"  # a quantized Embedding's or EmbeddingBag's table, under its EmbeddingPackedParams
CONVS = ("conv2d", "conv1d", "conv3d", "convtranspose2d", "convtranspose1d")  # 1-d: set_weight_bias unsqueezes


def packed_paths(mr) -> dict[str, Any]:
    """Module path of each LinearPackedParams whose weight was unpacked, and of each quantized Conv2d whose packed
    object's weight was read (`PATH.weight`, kind conv2d) -> the weight's record."""
    out = {}
    for t in mr.tensors:
        packed = t.quantization.get("packed") if t.quantization else None
        if not packed:
            continue
        if packed.get("kind") == "embedding" and t.key.endswith(TABLE):
            out[t.key[: -len(TABLE)]] = t
        elif packed.get("kind") in CONVS and t.key.endswith("weight"):
            out[t.key[: -len(".weight")] if "." in t.key else ""] = t
        elif t.key.endswith(SUFFIX):
            out[t.key[: -len(SUFFIX)]] = t
    return out


def repack(objs: dict[str, Any], records: dict[str, Any], tensor, keys: set[str], bias_records: dict[str, Any]) -> int:
    """Give each LinearPackedParams and quantized Conv2d its packed weight again; `tensor(key)` loads a tensor of the
    weights file, whose keys are `keys`."""
    import warnings

    import torch

    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")  # torch's own deprecation
    engine = deployed_engine(records)
    if engine and engine in torch.backends.quantized.supported_engines:  # pack as the deployment did
        torch.backends.quantized.engine = engine
    for path, rec in records.items():
        q = rec.quantization
        data = tensor(rec.key)
        if q["packed"].get("kind") == "embedding":  # rows with float scales and zero points: prepacked again
            scales, zps = (torch.tensor(q[k], dtype=torch.float32) for k in ("scale", "zero_point"))
            if q.get("dtype") == "quint4x2":  # two values a byte: the bytes are the quint4x2 tensor's storage
                table = torch._empty_per_channel_affine_quantized((data.shape[0], q["packed"]["columns"]), scales=scales,
                                                                  zero_points=zps, axis=0, dtype=torch.quint4x2)  # fmt: skip
                table.untyped_storage().copy_(data.contiguous().reshape(-1).untyped_storage())
                objs[path].set_weight(table)
            else:
                objs[path].set_weight(torch._make_per_channel_quantized_tensor(data, scales, zps, 0))
            continue
        if q.get("dtype") == "float16":  # dynamic float16: the float32 weight, packed to float16 again by prepack
            weight = data
        elif q["qscheme"] == "per_channel_affine":
            scales = torch.tensor(q["scale"], dtype=torch.float64)
            weight = torch._make_per_channel_quantized_tensor(data, scales, torch.tensor(q["zero_point"]), q.get("axis", 0))
        else:
            weight = torch._make_per_tensor_quantized_tensor(data, float(q["scale"][0]), int(q["zero_point"][0]))
        conv = q["packed"].get("kind") in CONVS  # a quantized convolution: its state_dict keys are PATH.weight, PATH.bias
        bias_key = (f"{path}.bias" if path else "bias") if conv else f"{path}._packed_params.bias"
        bias = tensor(bias_key) if bias_key in keys else None
        brec = bias_records.get(bias_key)
        if bias is not None and brec is not None and brec.python_type == "torch.nn.parameter.Parameter":
            bias = torch.nn.Parameter(bias, requires_grad=brec.requires_grad)  # as the deployed module held it
        objs[path].set_weight_bias(weight, bias)
    return len(records)


def deployed_engine(records: dict[str, Any]) -> str | None:
    """The quantized engine the deployment packed with, where its objects say so: QNNPACK objects exist only under
    the qnnpack engine and oneDNN Linears only under onednn; fbgemm convolutions (and no oneDNN ones) are packed with
    fbgemm again. Otherwise the default x86 engine is left to pick per convolution, as it did when deployed."""
    packed = [(r.quantization["packed"].get("engine"), r.quantization["packed"].get("kind")) for r in records.values()]
    if any(e == "qnnpack" for e, _ in packed):
        return "qnnpack"
    if any(e == "onednn" and k == "linear" for e, k in packed):
        return "onednn"
    if any(e == "fbgemm" and k in CONVS for e, k in packed) and not any(e == "onednn" for e, _ in packed):
        return "fbgemm"  # x86 would pack a symmetric weight with oneDNN on a VNNI CPU: other kernels, other bits
    return None
