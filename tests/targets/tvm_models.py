"""Build TVM model libraries with ground truth (run as a child: imports torch and TVM).

    python tvm_models.py OUTDIR NAME[:unfused|:detached] ...

For each model: OUTDIR/NAME.so (torch.export -> relax -> tvm.compile(llvm) -> export_library), and
OUTDIR/NAME.json with what the process knows (`:detached`: weights as main() inputs, written to
OUTDIR/NAME_detached.params.safetensors): the layers' hyper-parameters, the outputs of the
original PyTorch model and of the TVM VM on fixed inputs, and sha256 of every parameter's bytes.
"""

from __future__ import annotations

import hashlib
import json
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


MODELS = {"lenet": (LeNet, (1, 1, 28, 28)), "encoder": (Encoder, (2, 8, 32)), "encoder_mha": (TorchEncoder, (2, 8, 32)),
          "cnn": (SmallCNN, (1, 3, 32, 32)), "mlp": (MLP, (2, 32)), "resnet": (ResBlockNet, (1, 3, 40, 40))}


# torchvision/timm models (random init, no downloads), from bench/zoo.py's side directory when available
ZOO = {"tv_resnet18": ("torchvision.models", "resnet18", (1, 3, 64, 64)),
       "tv_mobilenet_v2": ("torchvision.models", "mobilenet_v2", (1, 3, 64, 64)),
       "tv_squeezenet": ("torchvision.models", "squeezenet1_1", (1, 3, 64, 64)),
       "tv_shufflenet": ("torchvision.models", "shufflenet_v2_x0_5", (1, 3, 64, 64)),
       "timm_vit_tiny": ("timm", "vit_tiny_patch16_224", (1, 3, 32, 32)),
       "timm_resnet10t": ("timm", "resnet10t", (1, 3, 64, 64))}


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
        kw = {"img_size": shape[-1], "patch_size": 8} if "vit" in fn else {}
        return (lambda: lib.create_model(fn, pretrained=False, num_classes=10, **kw)), shape
    return (lambda: getattr(lib, fn)(weights=None, num_classes=10)), shape


def ground_truth(model: nn.Module) -> list[dict]:
    layers = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            layers.append({"name": name, "type": "conv2d", "stride": m.stride[0], "padding": m.padding[0],
                           "dilation": m.dilation[0], "groups": m.groups})
        elif isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            layers.append({"name": name, "type": "batch_norm" if isinstance(m, nn.BatchNorm2d) else "layer_norm",
                           "eps": m.eps})
        elif isinstance(m, nn.MaxPool2d):
            layers.append({"name": name, "type": "max_pool2d", "kernel": m.kernel_size, "stride": m.stride,
                           "padding": m.padding})
    return layers


def build(out: Path, spec: str) -> None:
    name, _, mode = spec.partition(":")
    cls, shape = MODELS[name] if name in MODELS else zoo_model(name)
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():  # trained-looking statistics, so batch norm is not the identity
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
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
    target = tvm.target.Target("llvm")
    if mode == "unfused":  # tvm.compile's own pipeline legalizes without fusing: one kernel per op
        ex = tvm.compile(mod, target=target)
    else:
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    stem = name + (f"_{mode}" if mode else "")
    ex.export_library(str(out / f"{stem}.so"))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out / f"{stem}.so")), tvm.cpu())
    if params is not None:
        from safetensors.numpy import save_file

        save_file({n: t.numpy() for n, t in zip(*params)}, str(out / f"{stem}.params.safetensors"))
        got = vm["main"](tvm.runtime.tensor(x.numpy()), *params[1])
    else:
        got = vm["main"](tvm.runtime.tensor(x.numpy()))
    got = got[0] if not hasattr(got, "numpy") else got
    with torch.no_grad():
        ref = model(x)
    params = {k: hashlib.sha256(np.ascontiguousarray(v.numpy()).tobytes()).hexdigest()
              for k, v in model.state_dict().items() if v.dtype.is_floating_point}
    np.save(out / f"{stem}.input.npy", x.numpy())
    np.save(out / f"{stem}.torch.npy", ref.numpy())
    np.save(out / f"{stem}.tvm.npy", got.numpy())
    truth = {"name": stem, "input_shape": list(shape), "layers": ground_truth(model), "param_sha256": params,
             "tvm_vs_torch": float(np.abs(got.numpy() - ref.numpy()).max())}
    (out / f"{stem}.json").write_text(json.dumps(truth, indent=1))


if __name__ == "__main__":
    for spec in sys.argv[2:]:
        build(Path(sys.argv[1]), spec)
