"""zen: deep-learning model forensics from memory images of Python processes."""

__version__ = "0.1.0"
