"""Encoding image objects as JSON so a live process can rebuild them (model reuse)."""
