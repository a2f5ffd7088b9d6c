"""The demo's deployed fork served as TorchScript: `torch.jit.trace` of its TinyClassifier (issue 48).

(Traced: the fork's `channel_shuffle` helper is not annotated for `torch.jit.script`, as much real code is not.)

Run: python scripted_fork.py OUTDIR. Same weights, request and truth files as the demo's deployed process
(`zen.demo.serving`), but the served object is a RecursiveScriptModule whose state lives in its C++ module.
"""

import sys

import torch

from zen.demo.deployed_model import TinyClassifier
from zen.demo.serving import serve_model

if __name__ == "__main__":
    serve_model(torch.jit.trace(TinyClassifier().eval(), torch.zeros(1, 3, 32, 32)), sys.argv[1], seed=1234)
