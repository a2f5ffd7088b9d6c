"""The bounds zen puts on what it accepts from an image, settable with `--limit NAME=VALUE`.

Images are untrusted: every size, count and depth read from one is capped so that a corrupt or
hostile image costs bounded time and memory. The caps live with the code they protect
(`cpython.interp.Limits` for object readers, `frontends.pytorch.mr.ModelLimits` for the module
tree); this module only parses the user's overrides and applies them. Hitting a cap is never
silent: the object is recorded as a problem at its path and the case is marked `partial`. The values
in effect are recorded in the case's manifest (`limits`): a case follows from the image and them,
never from the time a run took. `overrides` parses every command's `--limit` (`zen decompile`'s
search limits are zen.compiled.kernels.budget's, `zen diff`'s decompiler limit zen.diff.decompile's).
"""

from __future__ import annotations

import dataclasses

from zen.cpython.interp import Limits
from zen.frontends.pytorch.mr import ModelLimits
from zen.memory.gpu.space import GpuLimits
from zen.runtime.errors import ZenError


def defaults() -> dict[str, int]:
    """Every limit with its default value (README's table is generated from the same classes)."""
    return {f.name: f.default for cls in (Limits, ModelLimits, GpuLimits) for f in dataclasses.fields(cls)}  # type: ignore[misc]


def parse(items: list[str] | None) -> tuple[Limits, ModelLimits, GpuLimits]:
    """`["max_str=1e9", ...]` -> the three limit objects with those fields replaced."""
    values = overrides(items, defaults())

    def of(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    return of(Limits), of(ModelLimits), of(GpuLimits)


def gpu_limits(items: list[str] | None) -> GpuLimits:
    """`zen info`'s `--limit`: only the GPU core bounds apply to it."""
    known = {f.name: f.default for f in dataclasses.fields(GpuLimits)}
    return GpuLimits(**overrides(items, known))  # type: ignore[arg-type]


def in_effect(bounds: tuple) -> dict[str, int]:
    """Every limit's value for a run, as the manifest records it (`limits`): part of what a case follows from."""
    return {k: v for b in bounds for k, v in dataclasses.asdict(b).items()}


def overrides(items: list[str] | None, known: dict[str, int]) -> dict[str, int]:
    """`NAME=VALUE` items (any command's `--limit`) checked against the limits `known` (name -> default)."""
    values: dict[str, int] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            listing = ", ".join(f"{k} (default {v:,})" for k, v in known.items())
            raise ZenError(f"unknown limit {item!r}", f"known limits: {listing}")
        try:
            value = int(float(raw)) if any(c in raw for c in ".eE") else int(raw, 0)
        except ValueError:
            raise ZenError(f"limit {name} needs an integer value, not {raw!r}") from None
        if value <= 0:
            raise ZenError(f"limit {name} must be positive, not {value}")
        values[name] = value
    return values
