"""Which inputs `zen analyze` attacks, decided before the model is loaded, and said in the results.

In order of preference:
1. `--inputs FILE` (safetensors): the tensor `x`, else the first other key in sorted order, is the
   batch; an integer tensor `labels` (one per sample) gives labels, and with them accuracies;
2. the inputs zen recovered from the image (the case's inputs.safetensors, carried by its package):
   `input_0`, the candidate `zen recover` ranked first (what the model was last fed);
3. inputs made from the model's input spec, its first layer in the MR: [N, in_features] for a
   linear layer, [N, in_channels, S, S] for a convolution, with S the first of SIDES the model
   accepts (probed in the child) unless `--input-shape` gives the sample shape; N seeded uniform
   samples over the clip range (default [0, 1]).
FGSM and PGD perturb real values: token ids (an embedding's input) cannot be attacked this way,
and are refused with that reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zen.analyze.subject import Subject
from zen.analyze.tensors import TensorFile
from zen.runtime.errors import ZenError

FLOATS = ("F64", "F32", "F16", "BF16")
INTS = ("I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64")
SIDES = (224, 32, 28, 64, 16, 96, 128, 256, 299, 384, 8, 12, 512)
TOKENS_HINT = "FGSM and PGD perturb real-valued inputs; for a token model attack its embeddings in your own script"


def _from_file(path: Path, source: str, key: str | None = None) -> dict[str, Any]:
    tf = TensorFile(path)
    names = sorted(k for k in tf.tensors if k != "labels")
    if not names:
        raise ZenError(f"{path} holds no input tensor", "store the batch as tensor 'x' (and labels as 'labels')")
    key = key or ("x" if "x" in tf.tensors else names[0])
    info = tf.tensors[key]
    if info.dtype in INTS:
        raise ZenError(f"the inputs in {path} ({key}) are integers (token ids?): they cannot be perturbed", TOKENS_HINT)
    if info.dtype not in FLOATS or len(info.shape) < 2 or info.shape[0] < 1:
        raise ZenError(f"the inputs in {path} ({key}: {info.dtype}{list(info.shape)}) are not a batch of real-valued samples",
                       "give a float tensor of shape [N, ...] as 'x'")  # fmt: skip
    plan = {"source": source, "file": str(Path(path).resolve()), "key": key, "shape": list(info.shape), "dtype": info.dtype,
            "labels_key": None}  # fmt: skip
    lab = tf.tensors.get("labels")
    if lab is not None:
        if lab.dtype not in INTS or list(lab.shape) != [info.shape[0]]:
            raise ZenError(f"labels in {path} must be integers, one per sample ({info.shape[0]}), not "
                           f"{lab.dtype}{list(lab.shape)}", "store class indices as an int64 tensor 'labels'")  # fmt: skip
        plan["labels_key"] = "labels"
    return plan


def plan_inputs(subject: Subject, given: Path | None, input_shape: list[int] | None, samples: int) -> dict[str, Any]:
    """What the child loads or makes, with a sentence saying which (`describe`)."""
    if given is not None:
        if not Path(given).is_file():
            raise ZenError(f"no such inputs file: {given}", "give a safetensors file with the batch as 'x'")
        plan = _from_file(Path(given), "given")
        plan["describe"] = f"given with --inputs ({Path(given).name}: {plan['key']} {plan['dtype']}{plan['shape']}" + \
            (", with labels)" if plan["labels_key"] else ", no labels)")  # fmt: skip
        return plan
    rec = subject.recovered_inputs
    if rec is not None and input_shape is None:
        tf = TensorFile(rec)
        if "input_0" in tf.tensors:
            plan = _from_file(rec, "recovered", "input_0")
            where = next((i for i in subject.mr.inputs if i.get("key") == "input_0"), {})
            plan["address"] = where.get("address")
            why = where.get("reason", "fits the first layer")
            plan["describe"] = (f"recovered from the image (input_0, {plan['dtype']}{plan['shape']} at "
                                f"{where.get('address', '?')}: {why}; no labels)")  # fmt: skip
            return plan
    return _from_spec(subject, input_shape, samples)


def _from_spec(subject: Subject, input_shape: list[int] | None, samples: int) -> dict[str, Any]:
    from zen.frontends.pytorch.inputs import first_layer

    plan: dict[str, Any] = {"source": "spec", "samples": samples, "labels_key": None}
    if input_shape is not None:
        plan.update(
            sample_shape=list(input_shape),
            probe=None,
            describe=f"made from the input spec given with --input-shape {list(input_shape)} ({samples} seeded samples)",
        )
        return plan
    layer = first_layer(subject.mr)
    if layer is None:
        raise ZenError("no inputs: none were recovered from the image and the model's first layer gives no input spec",
                       "give --inputs FILE.safetensors or --input-shape C,H,W")  # fmt: skip
    kind, size, dims, module = layer
    if kind == "embedding":
        raise ZenError(f"the model's first layer ({module.path}) is an embedding: its inputs are token ids", TOKENS_HINT)
    if kind == "linear":
        plan.update(sample_shape=[size], probe=None)
        what = f"[{size}] from {module.cls_qualname} '{module.path}'"
    else:
        plan.update(sample_shape=None, probe={"channels": size, "dims": dims, "sides": list(SIDES)})
        what = f"{size} channels from {module.cls_qualname} '{module.path}', side probed"
    plan["describe"] = f"made from the model's input spec ({what}; {samples} seeded uniform samples; no labels)"
    return plan
