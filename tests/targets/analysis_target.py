"""A deployed classifier that runs ART on itself: ground truth for `zen analyze` (issue 33).

Run: python analysis_target.py OUTDIR
Trains the two TinyCNNs of analysis_models.py (a clean one, `clean_model`, and a trojaned twin,
`trojan_model`), then attacks the clean one with ART itself, exactly as `zen analyze` is documented
to (PyTorchClassifier with cross-entropy, clip values (0, 1), batch size 32; FastGradientMethod and
ProjectedGradientDescent at eps 0.01, 0.03, 0.1 with eps_step eps/4, 10 iterations and one random
start; np.random.seed and torch.manual_seed(SEED) before each attack), on its validation batch
without labels (ART then attacks its own predictions) and with them. Writes OUTDIR/adversarial.safetensors
(key ATTACK@EPS, and ATTACK@EPS/labels), OUTDIR/val.safetensors (x, labels) and OUTDIR/truth.json
(ids, the parameters, accuracies, prediction-change rates, the trojan's attack success rate), feeds
the validation batch to both models (the input zen recovers), prints READY and waits on stdin.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys

import numpy as np
import torch
from art.attacks.evasion import FastGradientMethod, ProjectedGradientDescent
from art.estimators.classification import PyTorchClassifier
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analysis_models as am  # noqa: E402

torch.set_num_threads(1)
SEED, EPS, BATCH, ITER = 0, (0.01, 0.03, 0.1), 32, 10


def attacks(model: torch.nn.Module, x: np.ndarray, y: np.ndarray | None) -> dict[str, np.ndarray]:
    clf = PyTorchClassifier(model=model, loss=torch.nn.CrossEntropyLoss(), input_shape=x.shape[1:], nb_classes=am.CLASSES,
                            clip_values=(0.0, 1.0), device_type="cpu")  # fmt: skip
    out = {}
    for eps in EPS:
        for name in ("fgsm", "pgd"):
            np.random.seed(SEED)
            torch.manual_seed(SEED)
            if name == "fgsm":
                attack = FastGradientMethod(clf, eps=eps, batch_size=BATCH)
            else:
                attack = ProjectedGradientDescent(clf, eps=eps, eps_step=eps / 4, max_iter=ITER, num_random_init=1,
                                                  batch_size=BATCH, verbose=False)  # fmt: skip
            out[f"{name}@{eps}"] = attack.generate(x, y=y)
    return out


def main(outdir: str) -> None:
    x, y = am.samples(600, 10)
    xv, yv = am.samples(200, 11)
    clean_model = am.train(x, y, 0)
    trojan_model = am.train(*am.poisoned(x, y), 0)
    del x, y
    gc.collect()
    xn, yn = xv.numpy(), yv.numpy()
    with torch.no_grad():
        clean_pred = clean_model(xv).argmax(1).numpy()
        others = yv != am.TARGET
        asr = float((trojan_model(am.stamp(xv[others])).argmax(1) == am.TARGET).float().mean())
    unlabelled = attacks(clean_model, xn, None)
    labelled = attacks(clean_model, xn, np.eye(am.CLASSES, dtype=np.float32)[yn])
    truth = {"pid": os.getpid(), "seed": SEED, "eps": list(EPS), "batch_size": BATCH, "max_iter": ITER, "clip": [0.0, 1.0],
             "models": {"clean_model": {"id": id(clean_model)}, "trojan_model": {"id": id(trojan_model)}},
             "target_class": am.TARGET, "trojan_attack_success": asr, "input_id": id(xv),
             "input_sha256": hashlib.sha256(xn.tobytes()).hexdigest(),
             "clean_accuracy": float((clean_pred == yn).mean()), "adversarial": {}}  # fmt: skip
    tensors = {}
    for key, adv in unlabelled.items():
        with torch.no_grad():
            pred = clean_model(torch.from_numpy(adv)).argmax(1).numpy()
            pred_l = clean_model(torch.from_numpy(labelled[key])).argmax(1).numpy()
        truth["adversarial"][key] = {"changed": float((pred != clean_pred).mean()), "accuracy": float((pred_l == yn).mean())}
        tensors[key] = torch.from_numpy(adv)
        tensors[f"{key}/labels"] = torch.from_numpy(labelled[key])
    save_file(tensors, os.path.join(outdir, "adversarial.safetensors"))
    save_file({"x": xv, "labels": yv}, os.path.join(outdir, "val.safetensors"))
    del tensors, unlabelled, labelled  # only the validation batch may fit the first layer (see recover_inputs)
    gc.collect()
    with torch.no_grad():  # what the deployed models were last fed: the input zen recovers
        clean_model(xv)
        trojan_model(xv)
    globals().update(clean_model=clean_model, trojan_model=trojan_model, batch=xv, labels=yv)
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    print("READY", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1])
