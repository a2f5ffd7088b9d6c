"""Measure CPython struct layouts in a running interpreter (see run.py). Standard library only."""
