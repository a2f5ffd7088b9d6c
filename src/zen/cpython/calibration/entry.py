"""The command-line entry shared by the calibrators (CPython, PyTorch, TensorFlow), run in the interpreter measured.

Stdlib only, like the calibrators: they run in interpreters that have none of zen's dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable


def run_main(argv: list[str] | None, description: str, calibrate: Callable[[], dict], failure: type[Exception],
             needs: str | None = None) -> int:  # fmt: skip
    """Parse `-o`, import `needs` (the framework measured) first, run `calibrate`, write its profile as JSON."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("-o", "--output", help="write the profile here (default: stdout)")
    args = ap.parse_args(argv)
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError:
            print(f"calibration failed: {needs} is not importable in this interpreter", file=sys.stderr)
            return 1
    try:
        prof = calibrate()
    except failure as exc:
        print(f"calibration failed: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(prof, indent=1) + "\n"
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
