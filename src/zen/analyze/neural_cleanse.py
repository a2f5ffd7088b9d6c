"""Neural Cleanse for PyTorch classifiers, on ART's own Neural Cleanse machinery.

ART (1.20) ships Neural Cleanse (Wang et al., S&P 2019) as `NeuralCleanseMixin` — outlier detection
over the reverse-engineered triggers of every class, mitigation — with a trigger optimiser for
Keras models only (`KerasNeuralCleanse`). A model zen rebuilds is a PyTorch module, so this class
gives ART's mixin a PyTorch backend: `generate_backdoor` is the Keras optimiser's algorithm
(tanh-parametrised mask and pattern, Adam with beta 0.5/0.9, cost raised and lowered with patience
and early stop) in torch, and everything else — which classes are flagged (`outlier_detection`),
examples and mitigation — is ART's code, unchanged.

Differences from the Keras backend, and why:
- the mask is one plane (H x W) shared by every channel, as in the paper: its L1 norm is then the
  trigger's area in pixels, comparable between classes and readable by an investigator;
- the pattern spans the input range (the clip values, else the inputs' min..max) instead of [0, 1],
  so that models fed normalised inputs get triggers in their own units;
- every random choice (initial mask and pattern, the order of the minibatches) comes from one
  seeded generator per class, so the same model and inputs give the same triggers;
- the per-class L1 norms and the anomaly index (ART computes and drops them) are kept for the report.

Imports torch and ART: only the analysis child process (`zen.analyze.worker`) imports this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from art.estimators.classification import PyTorchClassifier
from art.estimators.poison_mitigation.neural_cleanse.neural_cleanse import NeuralCleanseMixin

CONSISTENCY = 1.4826  # ART's (and the paper's) MAD consistency constant for a normal distribution
THRESHOLD = 2.0  # anomaly index above which ART flags a class (the paper's choice)


class TorchNeuralCleanse(NeuralCleanseMixin, PyTorchClassifier):
    """ART's Neural Cleanse over a PyTorch classifier; `generate_backdoor` is torch, the rest ART's."""

    def __init__(self, model: Any, *, input_shape: tuple[int, ...], nb_classes: int, clip_values: tuple[float, float] | None,
                 value_range: tuple[float, float], device_type: str, seed: int, steps: int, batch_size: int,
                 init_cost: float = 1e-3, learning_rate: float = 0.1, attack_success_threshold: float = 0.99,
                 patience: int = 5, early_stop_patience: int = 10, cost_multiplier: float = 1.5) -> None:  # fmt: skip
        super().__init__(steps=steps, model=model, loss=torch.nn.CrossEntropyLoss(), input_shape=input_shape,
                         nb_classes=nb_classes, clip_values=clip_values, device_type=device_type, init_cost=init_cost,
                         norm=1, learning_rate=learning_rate, attack_success_threshold=attack_success_threshold,
                         patience=patience, early_stop=True, early_stop_threshold=0.99,
                         early_stop_patience=early_stop_patience, cost_multiplier=cost_multiplier,
                         batch_size=batch_size)  # fmt: skip
        self.seed = seed
        self.value_range = (float(value_range[0]), float(value_range[1]))
        self.per_class: dict[int, dict[str, Any]] = {}

    # -- ART's hooks --------------------------------------------------------------------------------

    def _predict_classifier(self, x: np.ndarray, batch_size: int = 128, training_mode: bool = False, **kwargs) -> np.ndarray:
        return PyTorchClassifier.predict(self, x.astype(np.float32), batch_size=batch_size, training_mode=training_mode)

    def predict(self, x: np.ndarray, batch_size: int = 128, training_mode: bool = False, **kwargs) -> np.ndarray:
        return PyTorchClassifier.predict(self, x, batch_size=batch_size, training_mode=training_mode, **kwargs)

    def generate_backdoor(self, x_val: np.ndarray, y_val: np.ndarray, y_target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask broadcast to the input shape, pattern) of the smallest trigger found that sends
        `x_val` to class argmax(y_target); also recorded in `per_class`."""
        target = int(np.argmax(y_target))
        rng = np.random.default_rng([self.seed, target])
        shape = tuple(self.input_shape)
        plane = shape[-2:] if len(shape) >= 2 else shape
        dev = self._device
        mask_raw = torch.tensor(rng.uniform(-1, 1, size=plane), dtype=torch.float32, device=dev, requires_grad=True)
        pattern_raw = torch.tensor(rng.uniform(-1, 1, size=shape), dtype=torch.float32, device=dev, requires_grad=True)
        opt = torch.optim.Adam([mask_raw, pattern_raw], lr=self.learning_rate, betas=(0.5, 0.9))
        lo, hi = self.value_range
        x_all = torch.from_numpy(np.ascontiguousarray(x_val, dtype=np.float32)).to(dev)
        labels = torch.full((self.batch_size,), target, dtype=torch.long, device=dev)
        eps = 1e-7
        model = self.model  # the classifier's own module (ART wraps it for its layer API)
        model.eval()

        def current() -> tuple[torch.Tensor, torch.Tensor]:
            mask = torch.tanh(mask_raw) / (2 - eps) + 0.5
            pattern = lo + (hi - lo) * (torch.tanh(pattern_raw) / (2 - eps) + 0.5)
            return mask, pattern

        cost = self.init_cost
        best_mask = best_pattern = None
        reg_best = float("inf")
        early_reg_best = reg_best
        set_counter = up_counter = down_counter = early_counter = 0
        up_flag = down_flag = False
        n = len(x_all)
        nbatches = max(1, n // self.batch_size)
        steps_run = 0
        for _ in range(self.steps):
            steps_run += 1
            order = torch.from_numpy(rng.permutation(n)).to(dev)
            regs, accs = [], []
            for b in range(nbatches):
                xb = x_all[order[b * self.batch_size : (b + 1) * self.batch_size]]
                mask, pattern = current()
                x_adv = (1 - mask) * xb + mask * pattern
                out = model(x_adv)
                loss_ce = torch.nn.functional.cross_entropy(out, labels[: len(xb)])
                loss_reg = mask.abs().sum()
                loss = loss_ce + cost * loss_reg
                opt.zero_grad()
                loss.backward()
                opt.step()
                regs.append(float(loss_reg.detach()))
                accs.append(float((out.argmax(1) == target).float().mean()))
            reg, acc = float(np.mean(regs)), float(np.mean(accs))
            if acc >= self.attack_success_threshold and reg < reg_best:
                with torch.no_grad():
                    m, p = current()
                best_mask, best_pattern, reg_best = m.cpu().numpy(), p.cpu().numpy(), reg
            if reg_best < float("inf"):
                early_counter = early_counter + 1 if reg_best >= self.early_stop_threshold * early_reg_best else 0
            early_reg_best = min(reg_best, early_reg_best)
            if down_flag and up_flag and early_counter >= self.early_stop_patience:
                break
            if acc >= self.attack_success_threshold:
                set_counter += 1
                if set_counter >= self.patience:
                    cost, up_counter, down_counter, up_flag, down_flag = self.init_cost, 0, 0, False, False
                up_counter, down_counter = up_counter + 1, 0
            else:
                set_counter, up_counter, down_counter = 0, 0, down_counter + 1
            if up_counter >= self.patience:
                up_counter, cost, up_flag = 0, cost * self.cost_multiplier_up, True
            elif down_counter >= self.patience:
                down_counter, cost, down_flag = 0, cost / self.cost_multiplier_down, True
        found = best_mask is not None
        if not found:
            with torch.no_grad():
                m, p = current()
            best_mask, best_pattern = m.cpu().numpy(), p.cpu().numpy()
        self.per_class[target] = {"mask": best_mask, "pattern": best_pattern, "l1": float(np.abs(best_mask).sum()),
                                  "reached_threshold": found, "steps": steps_run}  # fmt: skip
        return np.broadcast_to(best_mask, shape).copy(), best_pattern


def anomaly_indices(l1: list[float]) -> list[float]:
    """ART's anomaly index per class: |l1 - median| / (1.4826 * MAD). A class is flagged when its
    index exceeds 2 and its trigger is smaller than the median (`outlier_detection`). With MAD 0
    (every trigger the same size) no class stands out: 0 for all."""
    norms = np.asarray(l1, dtype=np.float64)
    median = np.median(norms)
    mad = CONSISTENCY * np.median(np.abs(norms - median))
    if mad == 0:
        return [0.0] * len(norms)
    return [float(v) for v in np.abs(norms - median) / mad]
