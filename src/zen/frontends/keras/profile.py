"""TensorFlow layout profiles: tensor/variable struct offsets, shape encodings and the dtype table, per TF minor.

Written by `zen profile tf` (calibration.py) in an environment with that TensorFlow installed. Shipped profiles live
in `zen/frontends/keras/profiles/`, user ones next to the CPython and torch profiles (`$ZEN_PROFILE_DIR` or
`~/.local/share/zen/profiles/`), and a user profile wins: it was measured on the investigator's own build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from zen.cpython.layout.profile import Struct, layout_texts
from zen.frontends.keras.layout import TensorLayout
from zen.runtime.errors import ProfileError

TF_PROFILE_FORMAT = 1


@dataclass(frozen=True)
class TFDType:
    enum: int  # tensorflow::DataType
    name: str
    itemsize: int  # 0: not a fixed-size element (string, resource)
    safetensors: str | None
    floating: bool
    complex: bool


@dataclass
class TFProfile:
    minor: str
    version: str
    structs: dict[str, Struct]
    constants: dict[str, int]
    dtypes: dict[int, TFDType]
    layout: TensorLayout
    provenance: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def off(self, struct_name: str, field_name: str) -> int:
        st = self.structs.get(struct_name)
        if st is None or not st.has(field_name):
            raise ProfileError(f"TF layout profile has no field {struct_name}.{field_name}",
                               "recalibrate it with `zen profile tf --python /path/to/python`")  # fmt: skip
        return getattr(st, field_name)


def parse_tf_profile(data: dict, source: str = "") -> TFProfile:
    if not isinstance(data, dict) or data.get("kind") != "tf-layout" or data.get("format") != TF_PROFILE_FORMAT:
        raise ProfileError(f"{source or 'profile'} is not a zen TF layout profile (format {TF_PROFILE_FORMAT})")
    try:
        structs = {k: Struct(k, v) for k, v in data["structs"].items()}
        constants = {k: int(v) for k, v in data["constants"].items()}
        return TFProfile(
            minor=data["tensorflow"]["minor"],
            version=data["tensorflow"]["version"],
            structs=structs,
            constants=constants,
            dtypes={
                int(k): TFDType(
                    int(k), v["name"], int(v["itemsize"]), v.get("safetensors"), bool(v["floating"]), bool(v["complex"])
                )  # fmt: skip
                for k, v in data["dtypes"].items()
            },
            layout=TensorLayout.from_profile(data["structs"], constants),
            provenance=data.get("provenance", {}),
            source=source,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{source or 'TF profile'} is malformed: {exc}") from None


def tf_profile_filename(minor: str, machine: str = "x86_64") -> str:
    return f"tf-{minor}-{machine}.json"


@lru_cache(maxsize=8)
def load_tf_profile(minor: str, full_version: str | None = None) -> TFProfile:
    """The layout profile for TensorFlow `minor` ("2.21"), or a ProfileError (exit 4) saying how to make one."""
    for source, text in layout_texts("zen.frontends.keras", tf_profile_filename(minor)):
        try:
            return parse_tf_profile(json.loads(text), source)
        except ValueError as exc:
            raise ProfileError(f"TF profile {source} is not valid JSON: {exc}") from None
    raise ProfileError(
        f"no layout profile for TensorFlow {minor} (the image has TensorFlow {full_version or minor})",
        f"calibrate one with an interpreter that has TensorFlow {minor} installed: `zen profile tf --python /path/to/python`",
    )
