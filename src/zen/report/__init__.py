"""Forensic reports (`zen report`): `gather` collects what a case, the library and a reuse package
establish into one JSON-able dict; `html` and `markdown` render it; `charts` draws its PNGs.
Nothing here executes recovered code."""
