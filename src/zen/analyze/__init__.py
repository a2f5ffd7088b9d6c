"""What investigators do with a recovered model: white-box analysis and weight drift.

- `zen analyze` (run.py): the model rebuilt from a case or a reuse package, attacked with ART's
  FGSM and PGD and searched for backdoors with Neural Cleanse. The rebuilt model EXECUTES code
  recovered from an image, so everything that touches it (worker.py, attacks.py,
  neural_cleanse.py: torch and ART) runs in a child process started through `zen.runtime.childproc`;
  the parent only prepares, checks and renders.
- `zen drift` (drift.py): cases recovered from snapshots of one process at different times,
  checked to be one model (sameness.py) and compared tensor by tensor from their safetensors files
  (tensors.py, numpy only: nothing is rebuilt or run).

Nothing here is imported by the packages below it (represent, reuse, report's gathering reads only
the JSON files these commands write).
"""
