"""Build TVM model libraries with ground truth (run as a child: imports torch and TVM).

    python tvm_models.py OUTDIR NAME[:unfused|:detached][@aarch64] ...

`@aarch64`: compiled for aarch64-linux-gnu (LLVM's AArch64 target with NEON, linked by aarch64-linux-gnu-gcc) into
NAME[_mode]_aarch64.so; its TVM outputs come from zen's emulated runtime (zen.compiled.emulation), as a board's would.

For each model: OUTDIR/NAME.so (torch.export -> relax -> tvm.compile(llvm) -> export_library), and
OUTDIR/NAME.json with what the process knows (`:detached`: weights as main() inputs, written to
OUTDIR/NAME_detached.params.safetensors): the layers' hyper-parameters, the outputs of the
original PyTorch model and of the TVM VM on fixed inputs, and sha256 of every parameter's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(8, eps=1e-3)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, groups=2)
        self.conv3 = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=16)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = torch.sigmoid(self.conv2(x))
        x = nn.functional.hardswish(self.conv3(x))
        return self.fc(self.avg(x).flatten(1))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.norm = nn.LayerNorm(64, eps=1e-6)
        self.fc2 = nn.Linear(64, 48)
        self.fc3 = nn.Linear(48, 5)

    def forward(self, x):
        x = nn.functional.gelu(self.norm(self.fc1(x)))
        x = torch.tanh(self.fc2(x))
        return torch.softmax(self.fc3(x), dim=-1)


class ResBlockNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 5, stride=2, padding=2, bias=False)
        self.bn0 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(16)
        self.down = nn.Conv2d(16, 32, 1, stride=2, bias=False)
        self.c3 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32, 7)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn0(self.stem(x))))
        y = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(x + self.b2(self.c2(y)))
        x = nn.functional.silu(self.c3(x) + self.down(x))
        x = nn.functional.avg_pool2d(x, 2)
        return self.fc(torch.mean(x, dim=(2, 3)))


class LeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 5, padding=2)
        self.c2 = nn.Conv2d(6, 16, 5)
        self.f1 = nn.Linear(16 * 5 * 5, 120)
        self.f2 = nn.Linear(120, 10)

    def forward(self, x):
        x = nn.functional.avg_pool2d(torch.tanh(self.c1(x)), 2)
        x = nn.functional.avg_pool2d(torch.tanh(self.c2(x)), 2)
        return self.f2(torch.relu(self.f1(torch.flatten(x, 1))))


class Encoder(nn.Module):
    """A small transformer encoder written out: attention from matmul + softmax, layer norms, GELU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.ff1 = nn.Linear(dim, 64)
        self.ff2 = nn.Linear(64, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.ff2(nn.functional.gelu(self.ff1(self.norm2(x))))
        return self.head(x.mean(dim=1))


class TorchEncoder(nn.Module):
    """nn.TransformerEncoderLayer: its exported attention guards fully-masked rows (equal/where kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.layer(x).mean(dim=1))


class Conv1dNet(nn.Module):
    """A 1-D conv model (keyword-spotting style): strided, dilated and depthwise conv1d, batch norm, pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(4, 16, 5, stride=2, padding=2)
        self.b1 = nn.BatchNorm1d(16)
        self.c2 = nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=16)
        self.c3 = nn.Conv1d(16, 24, 1)
        self.fc = nn.Linear(24, 6)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = nn.functional.max_pool1d(nn.functional.silu(self.c2(x)), 2)
        x = torch.tanh(self.c3(x))
        return self.fc(x.mean(dim=-1))


class DeepMLP(nn.Module):
    """A wider MLP with dropout (identity in eval), ELU-free activations and a residual connection."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(20, 64)
        self.h1 = nn.Linear(64, 64)
        self.h2 = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)
        self.out = nn.Linear(64, 4)

    def forward(self, x):
        x = torch.relu(self.inp(x))
        x = x + torch.sigmoid(self.h1(x)) * self.h2(x)
        return torch.log_softmax(self.out(self.norm(x)), dim=-1)


class MobileBlocks(nn.Module):
    """MobileNetV3 and ShuffleNetV2 building blocks: a hard-swish stem, a squeeze-excite gate with a
    hard sigmoid, a ShuffleNetV2 down-sampling unit (two branches) and two basic units (channel split,
    concatenation, channel shuffle). Fused, TVM puts batch norm + ReLU of both branches, the
    concatenation, the shuffle and the next unit's split into one kernel with two outputs."""

    def __init__(self) -> None:
        super().__init__()
        c = 16
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.se_reduce, self.se_expand = nn.Conv2d(16, 8, 1), nn.Conv2d(8, 16, 1)
        self.down1 = nn.Sequential(
            nn.Conv2d(16, 16, 3, 2, 1, groups=16, bias=False),
            nn.BatchNorm2d(16),
            nn.Conv2d(16, c, 1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
        )
        self.down2 = self._branch(16, c, 2)
        self.unit1, self.unit2 = self._branch(c, c, 1), self._branch(c, c, 1)
        self.fc = nn.Linear(2 * c, 5)

    @staticmethod
    def _branch(cin: int, c: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, c, 1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False),
            nn.BatchNorm2d(c),
            nn.Conv2d(c, c, 1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
        )

    @staticmethod
    def _shuffle(x, groups: int = 2):
        n, ch, h, w = x.shape
        return x.view(n, groups, ch // groups, h, w).transpose(1, 2).contiguous().view(n, ch, h, w)

    def forward(self, x):
        x = self.stem(x)
        gate = nn.functional.adaptive_avg_pool2d(x, 1)
        x = x * nn.functional.hardsigmoid(self.se_expand(torch.relu(self.se_reduce(gate))))
        x = self._shuffle(torch.cat((self.down1(x), self.down2(x)), dim=1))
        for unit in (self.unit1, self.unit2):
            x1, x2 = x.chunk(2, dim=1)
            x = self._shuffle(torch.cat((x1, unit(x2)), dim=1))
        return self.fc(x.mean((2, 3)))


def hf_model(kind: str):
    """A tiny BERT / DistilBERT encoder from transformers (random init from a config, no download). It is fed
    `inputs_embeds` (float) rather than token ids, so the library's input is a float tensor like the others'."""
    import transformers

    if kind == "bert":
        cfg = transformers.BertConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=32,
        )
        enc = transformers.BertModel(cfg, add_pooling_layer=False)
    else:
        cfg = transformers.DistilBertConfig(
            vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=32
        )
        enc = transformers.DistilBertModel(cfg)

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = enc
            self.head = nn.Linear(32, 3)

        def forward(self, x):
            return self.head(self.enc(inputs_embeds=x).last_hidden_state[:, 0])

    return Wrapped


MODELS = {
    "lenet": (LeNet, (1, 1, 28, 28)),
    "encoder": (Encoder, (2, 8, 32)),
    "encoder_mha": (TorchEncoder, (2, 8, 32)),
    "cnn": (SmallCNN, (1, 3, 32, 32)),
    "mlp": (MLP, (2, 32)),
    "resnet": (ResBlockNet, (1, 3, 40, 40)),
    "conv1d": (Conv1dNet, (2, 4, 64)),
    "deep_mlp": (DeepMLP, (4, 20)),
    "mobile": (MobileBlocks, (1, 3, 32, 32)),
}
HF = {"hf_bert_tiny": ("bert", (1, 8, 32)), "hf_distilbert_tiny": ("distilbert", (1, 8, 32))}


# torchvision/timm models (random init, no downloads), from bench/zoo.py's side directory when available
ZOO = {
    "tv_resnet18": ("torchvision.models", "resnet18", (1, 3, 64, 64)),
    "tv_mobilenet_v2": ("torchvision.models", "mobilenet_v2", (1, 3, 64, 64)),
    "tv_squeezenet": ("torchvision.models", "squeezenet1_1", (1, 3, 64, 64)),
    "tv_shufflenet": ("torchvision.models", "shufflenet_v2_x0_5", (1, 3, 64, 64)),
    "timm_vit_tiny": ("timm", "vit_tiny_patch16_224", (1, 3, 32, 32)),
    "timm_resnet10t": ("timm", "resnet10t", (1, 3, 64, 64)),
    "tv_mobilenet_v3_small": ("torchvision.models", "mobilenet_v3_small", (1, 3, 64, 64)),
    "tv_mnasnet": ("torchvision.models", "mnasnet0_5", (1, 3, 64, 64)),
    "tv_regnet_x_400mf": ("torchvision.models", "regnet_x_400mf", (1, 3, 64, 64)),
    "tv_efficientnet_b0": ("torchvision.models", "efficientnet_b0", (1, 3, 64, 64)),
    "tv_densenet121": ("torchvision.models", "densenet121", (1, 3, 32, 32)),
    "tv_googlenet": ("torchvision.models", "googlenet", (1, 3, 64, 64)),
    "timm_convnext_atto": ("timm", "convnext_atto", (1, 3, 64, 64)),
    "timm_mixer": ("timm", "mixer_s16_224", (1, 3, 32, 32)),
    "timm_ghostnet": ("timm", "ghostnet_050", (1, 3, 64, 64)),
}


_PREPARED: list = []


def zoo_model(name: str):
    import importlib

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    from zoo import prepare, zoo_site

    if not _PREPARED:  # registers torchvision's ops: once per process
        prepare(str(zoo_site()))
        _PREPARED.append(True)
    module, fn, shape = ZOO[name]
    lib = importlib.import_module(module)
    if module == "timm":
        kw = {"img_size": shape[-1], "patch_size": 8} if "vit" in fn else {"img_size": shape[-1]} if "mixer" in fn else {}
        return (lambda: lib.create_model(fn, pretrained=False, num_classes=10, **kw)), shape
    kw = {"aux_logits": False, "init_weights": True} if fn == "googlenet" else {}
    return (lambda: getattr(lib, fn)(weights=None, num_classes=10, **kw)), shape


def ground_truth(model: nn.Module) -> list[dict]:
    layers = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d)):
            kind = "conv2d" if isinstance(m, nn.Conv2d) else "conv1d"
            layers.append(
                {
                    "name": name,
                    "type": kind,
                    "stride": m.stride[0],
                    "padding": m.padding[0],
                    "dilation": m.dilation[0],
                    "groups": m.groups,
                }
            )
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)):
            layers.append({"name": name, "type": "layer_norm" if isinstance(m, nn.LayerNorm) else "batch_norm", "eps": m.eps})
        elif isinstance(m, nn.MaxPool2d):
            layers.append({"name": name, "type": "max_pool2d", "kernel": m.kernel_size, "stride": m.stride, "padding": m.padding})
    return layers


INT8 = {"x_scale": 0.02, "x_zp": 5, "w1_scale": 0.01, "h_scale": 0.05, "h_zp": -10}


def build_int8(out: Path, stem: str, fused: bool, arch: str = "") -> None:
    """An int8-quantized MLP written directly in relax (quantize/dequantize ops, int8 weights with per-tensor and
    per-channel scales). torch's PT2E-quantized programs cannot be imported (from_exported_program rejects
    quantized_decomposed ops; see bench/results/decompile.md), so this is the quantized model TVM 0.27 compiles."""
    from tvm.relax import op as R

    rng = np.random.default_rng(3)
    w1 = rng.integers(-127, 128, (16, 32)).astype("int8")
    w2 = rng.integers(-127, 128, (32, 4)).astype("int8")
    w2_scale = rng.uniform(0.005, 0.02, 4).astype("float32")
    b1 = rng.standard_normal(32).astype("float32") * 0.1
    b2 = rng.standard_normal(4).astype("float32") * 0.1
    q = INT8

    def qdq(v, scale, zp):
        s, z = relax.const(scale, "float32"), relax.const(zp, "int8")
        return R.dequantize(R.quantize(v, s, z, axis=-1, out_dtype="int8"), s, z, axis=-1, out_dtype="float32")

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(qdq(x, q["x_scale"], q["x_zp"]))
            w1f = R.dequantize(
                relax.const(w1), relax.const(q["w1_scale"], "float32"), relax.const(0, "int8"), axis=-1, out_dtype="float32"
            )
            h = bb.emit(R.nn.relu(R.add(R.matmul(h, w1f), relax.const(b1))))
            h = bb.emit(qdq(h, q["h_scale"], q["h_zp"]))
            w2f = R.dequantize(relax.const(w2), relax.const(w2_scale), relax.const(0, "int8"), axis=1, out_dtype="float32")
            y = bb.emit_output(R.add(R.matmul(h, w2f), relax.const(b2)))
        bb.emit_func_output(y)
    target = _target(arch)
    mod = bb.get()
    ex = (
        tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
        if fused
        else tvm.compile(mod, target=target)
    )
    _export(ex, out / f"{stem}.so", arch)
    xin = np.random.default_rng(42).standard_normal((2, 16)).astype("float32") * 2
    got = _run_vm(out / f"{stem}.so", [xin])
    dequant = {"w1": w1.astype("float32") * np.float32(q["w1_scale"]), "w2": w2.astype("float32") * w2_scale}
    np.save(out / f"{stem}.input.npy", xin)
    np.save(out / f"{stem}.tvm.npy", got)
    truth = {
        "name": stem,
        "input_shape": [2, 16],
        "layers": [],
        "quant": {**q, "w2_scale": w2_scale.tolist()},
        "dequantized_sha256": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in dequant.items()},
        "int8_sha256": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in (("w1", w1), ("w2", w2))},
        "w2_scale_sha256": hashlib.sha256(w2_scale.tobytes()).hexdigest(),
        "tvm_vs_torch": 0.0,
    }
    (out / f"{stem}.json").write_text(json.dumps(truth, indent=1))


def _target(arch: str):
    if arch == "aarch64":
        return tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]})
    return tvm.target.Target("llvm")


def _export(ex, path: Path, arch: str) -> None:
    if arch == "aarch64":
        from tvm.support import cc

        ex.export_library(str(path), fcompile=cc.cross_compiler("aarch64-linux-gnu-gcc"))
    else:
        ex.export_library(str(path))


def _run_vm(path: Path, arrays: list[np.ndarray]) -> np.ndarray:
    """The library's first output on `arrays`: run here, or in the emulated runtime when it is another CPU's."""
    from zen.compiled.emulation import load_library, runtime_for, tuple_items

    with runtime_for(path) as emulated:
        os.environ.update(emulated)
        try:
            lib, dev = load_library(tvm, path)
            got = relax.VirtualMachine(lib, dev)["main"](*[tvm.runtime.tensor(a, device=dev) for a in arrays])
            return tuple_items(got)[0].numpy()
        finally:
            for k in emulated:
                os.environ.pop(k, None)


def build(out: Path, spec: str) -> None:
    spec, _, arch = spec.partition("@")
    name, _, mode = spec.partition(":")
    if name == "int8_mlp":
        return build_int8(out, name + (f"_{mode}" if mode else "") + (f"_{arch}" if arch else ""), mode != "unfused", arch)
    if name in HF:
        cls, shape = hf_model(HF[name][0]), HF[name][1]
    else:
        cls, shape = MODELS[name] if name in MODELS else zoo_model(name)
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():  # trained-looking statistics, so batch norm is not the identity
        for m in model.modules():
            for prm in m.parameters(recurse=False):  # zero-initialised heads (timm) would make the output constant
                if prm.dim() >= 2 and not prm.any():
                    prm.normal_(0.0, 0.05)
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(42))
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=mode == "detached")
    params = None
    if mode == "detached":  # weights become main()'s inputs, kept apart in a params file
        mod, detached = relax.frontend.detach_params(mod)
        params = [str(p.name) for p in mod["main"].params[1:]], detached["main"]
    target = _target(arch)
    if mode == "unfused":  # tvm.compile's own pipeline legalizes without fusing: one kernel per op
        ex = tvm.compile(mod, target=target)
    else:
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    stem = name + (f"_{mode}" if mode else "") + (f"_{arch}" if arch else "")
    _export(ex, out / f"{stem}.so", arch)
    if params is not None:
        from safetensors.numpy import save_file

        save_file({n: t.numpy() for n, t in zip(*params)}, str(out / f"{stem}.params.safetensors"))
    got = _run_vm(out / f"{stem}.so", [x.numpy(), *([p.numpy() for p in params[1]] if params is not None else [])])
    with torch.no_grad():
        ref = model(x)
    params = {
        k: hashlib.sha256(np.ascontiguousarray(v.numpy()).tobytes()).hexdigest()
        for k, v in model.state_dict().items()
        if v.dtype.is_floating_point
    }
    np.save(out / f"{stem}.input.npy", x.numpy())
    np.save(out / f"{stem}.torch.npy", ref.numpy())
    np.save(out / f"{stem}.tvm.npy", got)
    truth = {
        "name": stem,
        "input_shape": list(shape),
        "layers": ground_truth(model),
        "param_sha256": params,
        "tvm_vs_torch": float(np.abs(got - ref.numpy()).max()),
    }
    (out / f"{stem}.json").write_text(json.dumps(truth, indent=1))


if __name__ == "__main__":
    for spec in sys.argv[2:]:
        build(Path(sys.argv[1]), spec)
