"""The zoo sweep's catalogue and the models it deploys (see zoo.py): every torchvision builder,
the timm architectures and small-config transformers architectures, an obfuscated fork of
torchvision's ResNet-18 with renamed methods, and a ResNet-18 whose head holds every kind of value
a module attribute, class attribute or default can hold (issue 15). Imported by the deployed
process, which builds one entry seeded and runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# -- the catalogue -------------------------------------------------------------------------------
TIMM = ["resnet18", "resnet26d", "resnext26ts", "seresnext26d_32x4d", "regnetx_002", "regnety_002", "efficientnet_b0",
        "efficientnet_lite0", "tf_efficientnet_b0", "mobilenetv2_050", "mobilenetv3_small_050", "mobilenetv3_large_075",
        "ghostnet_050", "convnext_atto", "convnextv2_atto", "vit_tiny_patch16_224", "deit_tiny_patch16_224",
        "deit_tiny_distilled_patch16_224", "swin_tiny_patch4_window7_224", "swinv2_cr_tiny_ns_224", "beit_base_patch16_224",
        "mixer_s16_224", "resmlp_12_224", "gmlp_ti16_224", "cait_xxs24_224", "coat_lite_tiny", "convit_tiny", "crossvit_tiny_240",
        "levit_128s", "pit_ti_224", "tnt_s_patch16_224", "twins_svt_small", "xcit_nano_12_p16_224", "poolformer_s12",
        "efficientformer_l1", "mobilevit_xxs", "edgenext_xx_small", "densenet121", "dla34", "dpn48b", "hrnet_w18_small",
        "inception_v3", "mnasnet_050", "rexnet_100", "selecsls42b", "vgg11", "repvgg_a0", "res2net50_14w_8s", "cspresnet50",
        "darknet17", "fbnetc_100", "hardcorenas_a", "lcnet_050", "tinynet_e", "nfnet_l0", "regnetz_b16", "botnet26t_256",
        "halonet26t", "maxvit_nano_rw_256", "coatnet_nano_rw_224", "fastvit_t8", "efficientvit_b0",
        "vit_small_patch16_224"]  # fmt: skip
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37, "vocab_size": 99,
         "max_position_embeddings": 64}  # fmt: skip
HF: dict[str, dict] = {
    "bert": SMALL, "roberta": SMALL, "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37, "vocab_size": 99},
    "albert": {**SMALL, "embedding_size": 16}, "electra": {**SMALL, "embedding_size": 16}, "deberta-v2": SMALL,
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 99, "n_positions": 64},
    "gpt_neox": SMALL, "gptj": {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 99, "n_positions": 64, "rotary_dim": 4},
    "opt": {**SMALL, "ffn_dim": 37, "word_embed_proj_dim": 32},
    "bloom": {"hidden_size": 32, "n_layer": 2, "n_head": 4, "vocab_size": 99},
    "llama": {**SMALL, "num_key_value_heads": 2}, "mistral": {**SMALL, "num_key_value_heads": 2},
    "qwen2": {**SMALL, "num_key_value_heads": 2}, "phi": SMALL, "gemma": {**SMALL, "num_key_value_heads": 2, "head_dim": 8},
    "falcon": {**SMALL, "num_kv_heads": 4, "new_decoder_architecture": False},
    "gpt_neo": {**SMALL, "attention_types": [[["global", "local"], 1]]},
    "mpt": {"d_model": 32, "n_layers": 2, "n_heads": 4, "vocab_size": 99, "max_seq_len": 64, "expansion_ratio": 2},
    "t5": {"d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 37, "d_kv": 8, "vocab_size": 99, "decoder_start_token_id": 0},
    "bart": {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
             "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "vocab_size": 99, "max_position_embeddings": 64},
    "whisper": {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
                "decoder_attention_heads": 4,
                "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "vocab_size": 99, "num_mel_bins": 16, "max_source_positions": 16,
                "max_target_positions": 32, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 0},
    "vit": {**SMALL, "image_size": 32, "patch_size": 8}, "clip": {},
    "convnext": {"hidden_sizes": [8, 16, 24, 32], "depths": [1, 1, 1, 1]},
    "swin": {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4},
    "mobilebert": {**SMALL, "embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16,
                   "num_feedforward_networks": 1},
}  # fmt: skip
TIES = {"timm_vit_tiny_patch16_224": "timm builds DeiT-Tiny as the same VisionTransformer class with the same "
        "hyper-parameters, and the sweep seeds every model alike: the two processes hold the same model, weights "
        "included (only timm's `pretrained_cfg` names differ), so either attribution is right."}  # fmt: skip
FORKS = {"tvfork_resnet18_obf": "tv_resnet18"}  # fork -> its base (which must run first)
OWN_CODE = ("tvvalues_resnet18",)  # models whose own module (in their deploy directory) is their base's code


def torchvision_names(site: str) -> list[str]:
    """Every classification builder plus the segmentation and detection builders (listed by a child)."""
    code = (
        "import sys; sys.path.insert(0, %r); from zoo import prepare; prepare(%r); import torchvision.models as m; "
        "print(' '.join(m.list_models(module=m) + m.list_models(module=m.segmentation) + m.list_models(module=m.detection)))"
    )
    res = subprocess.run([sys.executable, "-c", code % (str(HERE), site)], capture_output=True, text=True, timeout=300)
    return [f"tv_{n}" for n in res.stdout.split()] if res.returncode == 0 else []


def catalogue(site: str | None) -> list[str]:
    tv = torchvision_names(site) if site else []
    if "tv_resnet18" in tv:  # the fork's base, then the fork and the values model, then the rest
        tv = ["tv_resnet18", *FORKS, *OWN_CODE] + [n for n in tv if n != "tv_resnet18"]
    return [f"hf_{n}" for n in HF] + [f"timm_{n}" for n in TIMM] * bool(site) + tv


def library_of(name: str) -> str:
    kind = name.split("_", 1)[0]
    return {"timm": "timm", "hf": "transformers"}.get(kind, "torchvision")  # tv, tvfork, tvvalues


# -- the deployed process --------------------------------------------------------------------------
def _fork_resnet(outdir: Path):
    """torchvision's ResNet as an obfuscated fork would ship it: another module name, renamed methods
    (`_forward_impl`, `_make_layer`), a property and a class attribute the base lacks that forward
    uses, and BasicBlock given a new base class whose method its forward calls (changed bases)."""
    import importlib.util

    import torchvision.models.resnet as base

    src = Path(base.__file__).read_text()
    edits = [("_forward_impl", "_q9"), ("_make_layer", "_q3"),
             ("class BasicBlock(nn.Module):", "class _K1(nn.Module):\n    def _q1(self, x):\n        return self.relu(x)\n\n\n"
              "class BasicBlock(_K1):"),
             ("        out += identity\n        out = self.relu(out)\n",
              "        out += identity\n        out = self._q1(out)\n"),
             ("    def forward(self, x: Tensor) -> Tensor:\n        return self._q9(x)\n",
              "    _q7 = 1\n\n    @property\n    def _q5(self):\n        return self._q7\n\n"
              "    def forward(self, x: Tensor) -> Tensor:\n        return self._q9(x) * self._q5\n")]  # fmt: skip
    for old, new in edits:
        assert old in src, f"torchvision's resnet.py changed: {old!r} not found"
        src = src.replace(old, new, 1 if old.startswith("        out +=") else -1)  # BasicBlock's, not Bottleneck's
    src = src.replace("from ..", "from torchvision.").replace("from .", "from torchvision.models.")
    src = src.replace("@register_model()\n", "")  # the fork's builders are not in torchvision's registry
    path = outdir / "m_5ca1ab.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("m_5ca1ab", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["m_5ca1ab"] = mod
    spec.loader.exec_module(mod)
    return mod.ResNet(mod.BasicBlock, [2, 2, 2, 2])


VALUES_SOURCE = '''"""A classifier head holding every kind of value issue 15 lists, each used by forward, and two
values no rebuild can restore (a lock, a class made inside a function) that forward does not use."""
import collections
import dataclasses
import enum
import functools
import operator
import threading

import torch
from torch import nn


class Mode(enum.Enum):
    A = 1
    B = 2


class Flags(enum.Flag):
    X = 1
    Y = 2


@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: float
    mode: Mode


Pair = collections.namedtuple("Pair", "lo hi")


def make_local_class():
    class Local:
        pass
    return Local


def make_scaler(k):
    def scaler(x):
        return x * k
    return scaler


class Head(nn.Module):
    clamp_hi = functools.partial(torch.clamp, max=50.0)  # a partial as a class attribute

    def __init__(self, fc):
        super().__init__()
        self.fc = fc
        self.act = functools.partial(torch.clamp, min=-50.0)
        self.norm_cls = nn.Identity
        self.mode, self.flags = Mode.B, Flags.X | Flags.Y
        self.cfg = Cfg(1.0, Mode.A)
        self.pair = Pair(0, None)
        self.fn = lambda x: x + 0.0
        self.scaler = make_scaler(1.0)
        self.pick = operator.getitem
        self.bound = self.prepare
        self.dtype, self.device, self.size = torch.float32, torch.device("cpu"), torch.Size([1, 1000])
        self.fmt = torch.contiguous_format
        self.sl, self.ell, self.fs = slice(None, None, 1), ..., frozenset({1, 2})
        shared = [1, 2]
        self.shared = {"x": shared, "y": shared}
        cyc = [3]
        cyc.append(cyc)
        self.cyc = cyc
        self.cache = {"cpu": torch.zeros(1000)}  # a tensor in a plain attribute (timm's LeViT caches so)
        self.lock = threading.Lock()  # not rebuildable (state in C), unused by forward: reported
        self.local_cls = make_local_class()  # made inside a function: rebuilt from its bases and __dict__

    def prepare(self, x):
        return x

    def post(self, y, op=functools.partial(torch.mul, other=1.0), f=lambda t: t - 0.0, *, sl=slice(None)):
        return f(op(y))[sl]  # a partial, a lambda and a slice as defaults

    def forward(self, x):
        y = self.post(self.clamp_hi(self.norm_cls()(self.act(self.fc(self.bound(x))))))
        y = self.fn(self.scaler(y)) * self.cfg.scale + self.cache[self.device.type]
        assert self.mode is Mode.B and Flags.X in self.flags and self.pair.hi is None and self.cfg.mode is Mode.A
        assert self.shared["x"] is self.shared["y"] and self.cyc[1] is self.cyc and 2 in self.fs and self.ell is ...
        y = self.pick(y, (self.ell, self.sl)).to(self.dtype).to(self.device).contiguous(memory_format=self.fmt)
        assert y.shape == self.size
        return y
'''


def _values_resnet(outdir: Path):
    """torchvision's resnet18 with `Head` (VALUES_SOURCE, module `zoo_values`) as its classifier."""
    import importlib

    import torchvision.models as tvm

    (outdir / "zoo_values.py").write_text(VALUES_SOURCE)
    sys.path.insert(0, str(outdir))
    model = tvm.resnet18()
    model.fc = importlib.import_module("zoo_values").Head(model.fc)
    return model


def build(name: str, outdir: Path) -> tuple[Any, list, dict]:
    """(model, args, kwargs) of one catalogue entry, seeded."""
    import torch

    kind, _, arch = name.partition("_")
    g = torch.Generator().manual_seed(1)
    if kind == "tvfork":
        return _fork_resnet(outdir), [torch.randn(1, 3, 64, 64, generator=g)], {}
    if kind == "tvvalues":
        return _values_resnet(outdir), [torch.randn(1, 3, 64, 64, generator=g)], {}
    if kind == "tv":
        import torchvision.models as tvm

        heads = tvm.list_models(module=tvm.detection) + tvm.list_models(module=tvm.segmentation)
        extra = {"weights_backbone": None} if arch in heads else {}  # no download of backbone weights
        extra.update({"aux_logits": False, "init_weights": True} if arch in ("googlenet", "inception_v3") else {})
        model = tvm.get_model(arch, weights=None, **extra)
        size = 224 if arch.startswith(("vit", "swin", "maxvit")) else 96 if arch == "inception_v3" else 64
        return model, [torch.randn(1, 3, size, size, generator=g)], {}
    if kind == "timm":
        import timm

        model = timm.create_model(arch, pretrained=False)
        size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        return model, [torch.randn(1, *size, generator=g)], {}
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model(arch, **HF[arch])
    if arch == "clip":
        cfg = AutoConfig.for_model("clip", text_config={**SMALL}, vision_config={**SMALL, "image_size": 32, "patch_size": 8},
                                   projection_dim=16)  # fmt: skip
    model = AutoModel.from_config(cfg, attn_implementation="eager")
    ids = torch.randint(3, 99, (1, 12), generator=g)
    if arch in ("vit", "convnext", "swin"):
        return model, [torch.randn(1, 3, 32, 32, generator=g)], {}
    if arch == "clip":
        return model, [ids], {"pixel_values": torch.randn(1, 3, 32, 32, generator=g)}
    if arch == "whisper":
        return model, [torch.randn(1, 16, 32, generator=g)], {"decoder_input_ids": ids[:, :4]}
    if arch in ("t5", "bart"):
        return model, [ids], {"decoder_input_ids": ids[:, :5]}
    return model, [ids], {}
