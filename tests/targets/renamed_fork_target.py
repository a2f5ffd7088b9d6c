"""A fork of transformers' GPT-2 living in a package of its own (issue 35, item 5).

Run: python renamed_fork_target.py OUTDIR
Copies the installed transformers' `models/gpt2/modeling_gpt2.py` into OUTDIR/pkg/mygpt/modeling.py (relative
imports made absolute), changes GPT2MLP.forward (the activation scaled by 1.01) and adds a subclass of
GPT2LMHeadModel with a gate module, then serves that model built with the test library's GPT-2 configuration
(bench/families/hf.py). Writes OUTDIR/fork.io.pt (input, output) and OUTDIR/truth.json (pid, model id), prints
READY and waits on stdin. Rebuilding it on the library's transformers GPT-2 maps `mygpt.modeling` to
`transformers.models.gpt2.modeling_gpt2`; every class's MRO must then match the image's through that mapping.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import torch

FORK_CLASSES = """

class GPT2Gate(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.g = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * self.g


class GPT2ForkModel(GPT2LMHeadModel):
    def __init__(self, config):
        super().__init__(config)
        self.gate = GPT2Gate(config.n_embd)
"""


def write_fork(pkg: Path) -> None:
    import transformers.models.gpt2.modeling_gpt2 as original

    text = Path(original.__file__).read_text()
    text = re.sub(r"^from \.\.\. import ", "from transformers import ", text, flags=re.M)
    text = re.sub(r"^from \.\.\.", "from transformers.", text, flags=re.M)
    text = re.sub(r"^from \.configuration_gpt2", "from transformers.models.gpt2.configuration_gpt2", text, flags=re.M)
    changed = text.replace("hidden_states = self.act(hidden_states)\n", "hidden_states = self.act(hidden_states) * 1.01\n", 1)
    assert changed != text, "GPT2MLP.forward not found in this transformers: update the fork"
    (pkg / "mygpt").mkdir(parents=True, exist_ok=True)
    (pkg / "mygpt" / "__init__.py").write_text("")
    (pkg / "mygpt" / "modeling.py").write_text(changed + FORK_CLASSES)


def main(outdir: str) -> None:
    import transformers

    out = Path(outdir)
    write_fork(out / "pkg")
    sys.path.insert(0, str(out / "pkg"))
    from mygpt.modeling import GPT2ForkModel

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)  # as reuse_check.py runs the rebuilt model: same kernels, same bits
    torch.manual_seed(10)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=101, n_positions=32, bos_token_id=0,
                                  eos_token_id=0)  # fmt: skip
    model = GPT2ForkModel(cfg).eval()
    x = torch.randint(0, 101, (1, 9))
    with torch.no_grad():
        y = model(x).logits
    torch.save({"input": x, "output": y}, os.path.join(outdir, "fork.io.pt"))
    (out / "truth.json").write_text(json.dumps({"pid": os.getpid(), "id": id(model)}))
    globals()["model"] = model
    print("READY", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1])
