"""ART on the rebuilt model: the classifier wrapper, FGSM/PGD, Neural Cleanse. Child process only.

The protocol is fixed and recorded so that anyone can reproduce it with ART on the original
model and get the same adversarial examples bit for bit (the tests do, against a real process):
`PyTorchClassifier(model, CrossEntropyLoss(), input_shape, nb_classes, clip_values)`; for each
epsilon, `FastGradientMethod(eps=eps, batch_size=B)` and `ProjectedGradientDescent(eps=eps,
eps_step=eps/4, max_iter=T, num_random_init=1, batch_size=B)`, each preceded by
`np.random.seed(seed)` and `torch.manual_seed(seed)`; `generate(x, y)` with one-hot labels when
there are labels, else `y=None` (ART then attacks the model's own predictions).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from art.attacks.evasion import FastGradientMethod, ProjectedGradientDescent
from art.estimators.classification import PyTorchClassifier

from zen.reuse.runtime import first_tensor

ATTACKS = ("fgsm", "pgd")


class Logits(torch.nn.Module):
    """The rebuilt model as ART needs it: one logits tensor out (a model returning a tuple, a dict or
    an object with `.logits` is reduced to that tensor), float32 out, inputs in the model's dtype.
    For a float32 model returning a tensor both casts are no-ops: the arithmetic is the model's own."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = first_tensor(self.model(x.to(self.dtype)))
        if out is None:
            raise TypeError("the model returned no tensor")
        return out.float()


def classifier(model: torch.nn.Module, input_shape: tuple[int, ...], nb_classes: int, clip: tuple[float, float] | None,
               device_type: str) -> PyTorchClassifier:  # fmt: skip
    return PyTorchClassifier(model=model, loss=torch.nn.CrossEntropyLoss(), input_shape=input_shape, nb_classes=nb_classes,
                             clip_values=clip, device_type=device_type)  # fmt: skip


def make_attack(name: str, clf: PyTorchClassifier, eps: float, batch_size: int, pgd_steps: int):
    if name == "fgsm":
        return FastGradientMethod(clf, eps=eps, batch_size=batch_size)
    return ProjectedGradientDescent(clf, eps=eps, eps_step=eps / 4, max_iter=pgd_steps, num_random_init=1,
                                    batch_size=batch_size, verbose=False)  # fmt: skip


def predict(clf: PyTorchClassifier, x: np.ndarray, batch_size: int) -> np.ndarray:
    return np.argmax(clf.predict(x, batch_size=batch_size), axis=1)


def run_attacks(clf: PyTorchClassifier, x: np.ndarray, labels: np.ndarray | None, attacks: list[str], eps_list: list[float],
                seed: int, batch_size: int, pgd_steps: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:  # fmt: skip
    """(results, adversarial examples keyed ATTACK@EPS)."""
    y = None if labels is None else np.eye(clf.nb_classes, dtype=np.float32)[labels]
    clean = predict(clf, x, batch_size)
    res: dict[str, Any] = {"labelled": labels is not None, "samples": int(len(x)),
                           "clean_accuracy": float(np.mean(clean == labels)) if labels is not None else None,
                           "attacks": {a: [] for a in attacks}}  # fmt: skip
    advs: dict[str, np.ndarray] = {}
    for eps in eps_list:
        for name in attacks:
            np.random.seed(seed)
            torch.manual_seed(seed)
            adv = make_attack(name, clf, eps, batch_size, pgd_steps).generate(x, y=y)
            pred = predict(clf, adv, batch_size)
            delta = (adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1)
            row = {"eps": eps, "key": f"{name}@{eps!r}", "changed": float(np.mean(pred != clean)),
                   "accuracy": float(np.mean(pred == labels)) if labels is not None else None,
                   "max_linf": float(np.abs(delta).max()) if delta.size else 0.0,
                   "mean_l2": float(np.linalg.norm(delta, axis=1).mean()) if delta.size else 0.0}  # fmt: skip
            res["attacks"][name].append(row)
            advs[row["key"]] = np.ascontiguousarray(adv, dtype=np.float32)
    return res, advs


def run_neural_cleanse(model: torch.nn.Module, x: np.ndarray, labels: np.ndarray | None, nb_classes: int,
                       clip: tuple[float, float] | None, device_type: str, seed: int, steps: int,
                       batch_size: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:  # fmt: skip
    """(results, masks and patterns keyed mask_K / pattern_K) of ART's Neural Cleanse outlier detection."""
    from art.utils import to_categorical

    from zen.analyze.neural_cleanse import THRESHOLD, TorchNeuralCleanse, anomaly_indices

    value_range = clip if clip is not None else (float(x.min()), float(x.max()))
    nc = TorchNeuralCleanse(model, input_shape=tuple(x.shape[1:]), nb_classes=nb_classes, clip_values=clip,
                            value_range=value_range, device_type=device_type, seed=seed, steps=steps,
                            batch_size=batch_size)  # fmt: skip
    y = labels if labels is not None else predict(nc, x, batch_size)
    flagged = sorted(int(label) for label, _mask, _pattern in nc.outlier_detection(x, to_categorical(y, nb_classes)))
    l1 = [nc.per_class[k]["l1"] for k in range(nb_classes)]
    index = anomaly_indices(l1)
    classes = [{"class": k, "l1": l1[k], "anomaly_index": index[k], "flagged": k in flagged,
                "reached_threshold": nc.per_class[k]["reached_threshold"], "steps": nc.per_class[k]["steps"]}
               for k in range(nb_classes)]  # fmt: skip
    arrays = {}
    for k in range(nb_classes):
        arrays[f"mask_{k}"] = np.ascontiguousarray(nc.per_class[k]["mask"], dtype=np.float32)
        arrays[f"pattern_{k}"] = np.ascontiguousarray(nc.per_class[k]["pattern"], dtype=np.float32)
    res = {"detector": "Neural Cleanse (ART NeuralCleanseMixin, PyTorch trigger optimiser)", "threshold": THRESHOLD,
           "flagged": flagged, "classes": classes, "samples": int(len(x)), "value_range": list(value_range),
           "labels": "given" if labels is not None else "the model's predictions",
           "parameters": {"steps": steps, "batch_size": batch_size, "seed": seed, "init_cost": nc.init_cost,
                          "learning_rate": nc.learning_rate, "attack_success_threshold": nc.attack_success_threshold,
                          "patience": nc.patience, "early_stop_patience": nc.early_stop_patience, "norm": 1}}  # fmt: skip
    return res, arrays
