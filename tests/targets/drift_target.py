"""A model learning online, paused on request so that it can be imaged: ground truth for `zen drift`.

Run: python drift_target.py OUTDIR
A training thread updates `model` (SGD with momentum, train mode) on a seeded stream of batches,
without pause. On each stdin line `snap` the process waits for at least MIN_STEPS steps since it
last resumed, stops between two steps, saves the state_dict it holds at that instant to
OUTDIR/snap_I.safetensors, prints `SAVED I` and stays stopped (the test acquires it now); `resume`
lets training go on (printing `RESUMED`). `embed` is frozen throughout; `hidden` is frozen until
the first `resume` after snapshot 1, so it first changes at snapshot 2; `norm`'s running
statistics and `head` change at every snapshot. `activations` is a model with no weights at all, and
`other` a model with weights but another architecture (for the refusals).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import torch
from safetensors.torch import save_file
from torch import nn

torch.set_num_threads(1)
MIN_STEPS = 20


class OnlineNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.norm = nn.BatchNorm1d(32)
        self.hidden = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(torch.relu(self.norm(self.embed(x))))))


class Trainer(threading.Thread):
    def __init__(self, model: OnlineNet) -> None:
        super().__init__(daemon=True)
        self.model = model
        self.cond = threading.Condition()
        self.paused = False
        self.steps = 0
        self.since_resume = 0
        self.gen = torch.Generator().manual_seed(0)
        self.teacher = torch.randn(16, 4, generator=self.gen)
        self.opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)

    def run(self) -> None:
        while True:
            with self.cond:
                while self.paused:
                    self.cond.wait()
                x = torch.randn(32, 16, generator=self.gen)
                y = (x @ self.teacher).argmax(1)
                self.opt.zero_grad()
                nn.functional.cross_entropy(self.model(x), y).backward()
                self.opt.step()
                self.steps += 1
                self.since_resume += 1
                self.cond.notify_all()

    def pause(self) -> None:
        with self.cond:
            while self.since_resume < MIN_STEPS:
                self.cond.wait()
            self.paused = True

    def resume(self) -> None:
        with self.cond:
            self.paused, self.since_resume = False, 0
            self.cond.notify_all()


def main(outdir: str) -> None:
    torch.manual_seed(0)
    model = OnlineNet().train()
    model.embed.requires_grad_(False)
    model.hidden.requires_grad_(False)
    activations = nn.Sequential(nn.ReLU(), nn.Tanh())
    other = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    globals().update(model=model, activations=activations, other=other)
    trainer = Trainer(model)
    truth = {"pid": os.getpid(), "models": {"model": {"id": id(model)}, "activations": {"id": id(activations)},
                                            "other": {"id": id(other)}}, "snapshots": []}  # fmt: skip
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    trainer.start()
    print("READY", flush=True)
    snap = 0
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "snap":
            trainer.pause()
            state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
            save_file(state, os.path.join(outdir, f"snap_{snap}.safetensors"))
            truth["snapshots"].append({"index": snap, "steps": trainer.steps})
            with open(os.path.join(outdir, "truth.json"), "w") as fh:
                json.dump(truth, fh)
            print(f"SAVED {snap}", flush=True)
            snap += 1
        elif cmd == "resume":
            if snap == 2:  # after snapshot 1: `hidden` starts learning
                model.hidden.requires_grad_(True)
                trainer.opt.add_param_group({"params": list(model.hidden.parameters())})
            trainer.resume()
            print("RESUMED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
