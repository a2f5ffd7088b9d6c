"""PyTorch layout profiles: TensorImpl/StorageImpl offsets and the dtype table, per torch minor version.

Written by `zen profile torch` (calibration.py) in an environment with that torch installed.
Shipped profiles live in `zen/frontends/pytorch/profiles/`, user ones next to the CPython
profiles (`$ZEN_PROFILE_DIR` or `~/.local/share/zen/profiles/`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from zen.cpython.layout.profile import Struct, layout_texts
from zen.runtime.errors import ProfileError

TORCH_PROFILE_FORMAT = 1


@dataclass(frozen=True)
class DType:
    index: int
    name: str
    itemsize: int
    safetensors: str | None
    floating: bool
    complex: bool


@dataclass
class TorchProfile:
    minor: str
    version: str
    structs: dict[str, Struct]
    constants: dict[str, int]
    dtypes: dict[int, DType]
    device_types: dict[int, str]
    provenance: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        for name, st in self.structs.items():
            setattr(self, name, st)

    def __getattr__(self, item: str) -> Struct:
        raise ProfileError(f"torch layout profile has no struct {item!r}", "recalibrate it with `zen profile torch`")


def parse_torch_profile(data: dict, source: str = "") -> TorchProfile:
    if data.get("kind") != "torch-layout" or data.get("format") != TORCH_PROFILE_FORMAT:
        raise ProfileError(f"{source or 'profile'} is not a zen torch layout profile (format {TORCH_PROFILE_FORMAT})")
    try:
        return TorchProfile(
            minor=data["torch"]["minor"],
            version=data["torch"]["version"],
            structs={k: Struct(k, v) for k, v in data["structs"].items()},
            constants={k: int(v) for k, v in data["constants"].items()},
            dtypes={
                int(k): DType(
                    int(k), v["name"], int(v["itemsize"]), v.get("safetensors"), bool(v["floating"]), bool(v["complex"])
                )
                for k, v in data["dtypes"].items()
            },
            device_types={int(k): v for k, v in data["device_types"].items()},
            provenance=data.get("provenance", {}),
            source=source,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{source or 'torch profile'} is malformed: {exc}") from None


def torch_profile_filename(minor: str, machine: str = "x86_64") -> str:
    return f"torch-{minor}-{machine}.json"


@lru_cache(maxsize=8)
def load_torch_profile(minor: str, full_version: str | None = None) -> TorchProfile:
    """The layout profile for torch `minor` ("2.13"), or a ProfileError saying how to make one."""
    for source, text in layout_texts("zen.frontends.pytorch", torch_profile_filename(minor)):
        try:
            return parse_torch_profile(json.loads(text), source)
        except ValueError as exc:
            raise ProfileError(f"torch profile {source} is not valid JSON: {exc}") from None
    raise ProfileError(
        f"no layout profile for torch {minor} (the image has torch {full_version or minor})",
        f"calibrate one with an interpreter that has torch {minor} installed: `zen profile torch --python /path/to/python`",
    )
