"""Layout profiles: CPython struct offsets per minor version, as data files.

A profile is the JSON written by `calibrate.py` in an interpreter of that version. Profiles shipped
with zen live in `zen/cpython/layout/profiles/`; users add their own (`zen profile python`) to
`$ZEN_PROFILE_DIR` or `~/.local/share/zen/profiles/`. Readers never hard-code an offset: they
ask the profile, whose attribute access is plain attribute lookup so hot paths stay cheap.
"""

from __future__ import annotations

import json
import os
import struct
from collections import namedtuple
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from zen.cpython.layout.releases import release_tuple, resolve_release
from zen.runtime.errors import ProfileError

PROFILE_FORMAT = 1


class Struct:
    """Offsets of one C struct: `s.co_consts` is the byte offset of that field."""

    def __init__(self, name: str, spec: dict) -> None:
        self._name = name
        self._fields: dict[str, tuple[int, str]] = {k: (int(v[0]), str(v[1])) for k, v in spec.get("fields", {}).items()}
        self.size: int | None = spec.get("size")
        for k, (off, _) in self._fields.items():
            setattr(self, k, off)

    def __getattr__(self, item: str) -> int:
        # Only reached for fields the profile does not have.
        if item.startswith("_"):
            raise AttributeError(item)
        raise ProfileError(
            f"layout profile has no field {self._name}.{item}",
            "the profile is older than this zen; recalibrate it with `zen profile python`",
        )

    def reader(self, *names: str) -> FieldReader:
        """A compiled reader that unpacks the named fields from raw struct bytes in one call."""
        cache = self.__dict__.setdefault("_readers", {})
        fr = cache.get(names)
        if fr is None:
            fr = cache[names] = FieldReader(self, names)
        return fr

    def has(self, field_name: str) -> bool:
        return field_name in self._fields

    def fields(self) -> dict[str, tuple[int, str]]:
        return dict(self._fields)


_CODES = {"ptr": "Q", "u64": "Q", "i64": "q", "i32": "i", "u32": "I", "u16": "H", "i16": "h", "u8": "B", "i8": "b", "f64": "d"}


class FieldReader:
    """Unpack several fields of one struct with a single precompiled `struct.Struct` call."""

    def __init__(self, st: Struct, names: tuple[str, ...]) -> None:
        items = sorted((st._fields[n][0], n, st._fields[n][1]) for n in names if st.has(n))
        missing = [n for n in names if not st.has(n)]
        if missing:
            raise ProfileError(f"layout profile has no field {st._name}.{missing[0]}", "recalibrate with `zen profile python`")
        fmt, pos = "<", 0
        for off, n, t in items:
            code = _CODES.get(t)
            if code is None or off < pos:
                raise ProfileError(f"field {st._name}.{n} cannot be read as a scalar")
            fmt += (f"{off - pos}x" if off > pos else "") + code
            pos = off + struct.calcsize(code)
        self._struct = struct.Struct(fmt)
        self.size = pos
        self.record = namedtuple(f"{st._name}_fields", [n for _, n, _ in items])  # type: ignore[misc]

    def unpack(self, raw: bytes, offset: int = 0):
        return self.record._make(self._struct.unpack_from(raw, offset))


@dataclass
class OpcodeTable:
    """Opcode data of the profiled version: names, de-specialisation map, inline cache sizes."""

    opname: list[str]
    opmap: dict[str, int]
    deopt: dict[int, int]
    cache_entries: dict[int, int]
    names_full: dict[int, str]
    have_argument: int
    extended_arg: int
    hasjrel: frozenset[int]
    hasjabs: frozenset[int]
    hasconst: frozenset[int]
    hasname: frozenset[int]
    haslocal: frozenset[int]
    hasfree: frozenset[int]
    hascompare: frozenset[int]
    name_arg_shift: dict[str, int] = field(default_factory=dict)
    compare_arg_shift: int = 0
    cmp_op: list[str] = field(default_factory=list)
    binary_ops: list[str] = field(default_factory=list)
    jump_base: str = "next"
    jump_unit: int = 2  # bytes per unit of a jump argument (3.8/3.9: 1, jumps counted in bytes)
    backward_jumps: frozenset[int] = frozenset()
    stack_effects: dict[int, list[int]] = field(default_factory=dict)
    enter_executor: int | None = None  # 3.13+: an instruction handed to the tier-2 optimiser

    @classmethod
    def from_json(cls, d: dict) -> OpcodeTable:
        return cls(
            opname=list(d["opname"]),
            opmap=dict(d["opmap"]),
            deopt={int(k): int(v) for k, v in d.get("deopt", {}).items()},
            cache_entries={int(k): int(v) for k, v in d.get("cache_entries", {}).items()},
            names_full={int(k): v for k, v in d.get("opname_full", {}).items()},
            have_argument=int(d["have_argument"]),
            extended_arg=int(d["extended_arg"]),
            hasjrel=frozenset(d.get("hasjrel", [])),
            hasjabs=frozenset(d.get("hasjabs", [])),
            hasconst=frozenset(d.get("hasconst", [])),
            hasname=frozenset(d.get("hasname", [])),
            haslocal=frozenset(d.get("haslocal", [])),
            hasfree=frozenset(d.get("hasfree", [])),
            hascompare=frozenset(d.get("hascompare", [])),
            name_arg_shift=dict(d.get("name_arg_shift", {})),
            compare_arg_shift=int(d.get("compare_arg_shift", 0)),
            cmp_op=list(d.get("cmp_op", [])),
            binary_ops=list(d.get("binary_ops", [])),
            jump_base=d.get("jump_base", "next"),
            jump_unit=int(d.get("jump_unit", 2)),
            backward_jumps=frozenset(d.get("backward_jumps", [])),
            stack_effects={int(k): [int(x) for x in v] for k, v in d.get("stack_effects", {}).items()},
            enter_executor=d.get("enter_executor"),
        )

    def base_op(self, op: int) -> int:
        """The unspecialised opcode for `op` (identity for base opcodes)."""
        return self.deopt.get(op, op)

    def stack_effect(self, op: int, arg: int | None) -> int:
        """Net stack effect of a base opcode in the profiled version (0 when unknown). Measured
        for arguments 0..15; beyond that a linear effect is extrapolated, else the low bits decide
        (flag arguments)."""
        eff = self.stack_effects.get(op)
        if not eff:
            return 0
        if len(eff) == 1 or arg is None:
            return eff[0]
        if arg < len(eff):
            return eff[arg]
        step = eff[1] - eff[0]
        if all(b - a == step for a, b in zip(eff, eff[1:])):
            return eff[0] + step * arg
        return eff[arg % len(eff)]

    def name(self, op: int) -> str:
        return self.names_full.get(op) or (self.opname[op] if op < len(self.opname) else f"<{op}>")


@dataclass
class Profile:
    """A loaded layout profile."""

    minor: str
    version: str
    hexversion: int
    structs: dict[str, Struct]
    constants: dict[str, int]
    opcodes: OpcodeTable
    set_dummy_type_name: str
    provenance: dict[str, str] = field(default_factory=dict)
    source: str = ""
    why: str = ""  # why this profile (and patch-release variant) was chosen for the image

    def __post_init__(self) -> None:
        # Structs become plain attributes (`P.code.co_consts`): readers touch them millions of times.
        for name, st in self.structs.items():
            if name not in self.__dict__:
                setattr(self, name, st)

    def __getattr__(self, item: str) -> Struct:
        if item.startswith("_"):  # copy/pickle probe dunders: not struct names
            raise AttributeError(item)
        raise ProfileError(
            f"layout profile has no struct {item!r}",
            "the profile is older than this zen; recalibrate it with `zen profile python`",
        )

    def c(self, name: str) -> int:
        try:
            return self.constants[name]
        except KeyError:
            raise ProfileError(f"layout profile has no constant {name}", "recalibrate with `zen profile python`") from None

    @property
    def version_tuple(self) -> tuple[int, int]:
        major, minor = self.minor.split(".")
        return int(major), int(minor)


def parse_profile(data: dict, source: str = "", why: str = "") -> Profile:
    if data.get("kind") != "cpython-layout" or data.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"{source or 'profile'} is not a zen CPython layout profile (format {PROFILE_FORMAT})")
    try:
        py = data["python"]
        return Profile(
            minor=py["minor"],
            version=py["version"],
            hexversion=int(py["hexversion"]),
            structs={k: Struct(k, v) for k, v in data["structs"].items()},
            constants={k: int(v) for k, v in data["constants"].items()},
            opcodes=OpcodeTable.from_json(data["opcodes"]),
            set_dummy_type_name=data.get("set_dummy_type_name", "<dummy key> type"),
            provenance=data.get("provenance", {}),
            source=source,
            why=why,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{source or 'profile'} is malformed: {exc}") from None


def user_profile_dir() -> Path:
    env = os.environ.get("ZEN_PROFILE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "zen" / "profiles"


def layout_texts(package: str, name: str) -> list[tuple[str, str]]:
    """(source label, JSON text) of the layout profiles named `name`: the user's (calibrated with
    `zen profile ...`) first, then the one `package` ships in its `profiles/`. Shared by the CPython,
    torch and TensorFlow profile loaders."""
    out = []
    user = user_profile_dir() / name
    if user.is_file():
        out.append((str(user), user.read_text()))
    shipped = resources.files(package).joinpath("profiles", name)
    if shipped.is_file():
        out.append((f"zen:{name}", shipped.read_text()))
    return out


def profile_filename(minor: str, machine: str = "x86_64") -> str:
    """File name of a profile: `minor` is "3.13" (shipped, with variants) or an exact release "3.13.0"."""
    return f"cpython-{minor}-{machine}.json"


def _candidates(minor: str, release: str | None) -> list[tuple[str, str, bool]]:
    """(source label, JSON text, exact) of profiles for an image of `minor`/`release`, best first:
    a user profile calibrated on that exact release, a user profile for the minor version, the
    shipped one. `exact` profiles are used as they are; the others resolve patch-release variants."""
    out = []
    udir = user_profile_dir()
    names = ([(profile_filename(release), True)] if release and release != minor else []) + [(profile_filename(minor), False)]
    for name, exact in names:
        user = udir / name
        if user.is_file():
            out.append((str(user), user.read_text(), exact))
    shipped = resources.files("zen.cpython.layout").joinpath("profiles", profile_filename(minor))
    if shipped.is_file():
        out.append((f"zen:{profile_filename(minor)}", shipped.read_text(), False))
    # last resort: a user profile calibrated on another release of the minor version, nearest first
    others = []
    for path in udir.glob(f"cpython-{minor}.*-*.json") if udir.is_dir() else ():
        rel = release_tuple(path.name.split("-")[1])
        if rel is not None and path.name != profile_filename(release or minor):
            want = release_tuple(release or "") or (rel[0], rel[1], 0)
            others.append((abs(rel[2] - want[2]), str(path)))
    out += [(src, Path(src).read_text(), False) for _, src in sorted(others)]
    return out


@lru_cache(maxsize=8)
def load_profile(minor: str, full_version: str | None = None) -> Profile:
    """The layout profile for CPython `minor` ("3.11"), or a ProfileError saying how to make one.

    `full_version` is the image's exact release when known: the profile's variant for that release
    is applied (see `releases.py`) and the profile's `why` says which layout was chosen and why."""
    release = full_version if full_version and release_tuple(full_version) else None
    for source, text, exact in _candidates(minor, release):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ProfileError(f"profile {source} is not valid JSON: {exc}") from None
        if exact:
            return parse_profile(data, source, f"calibrated on release {release} itself")
        resolved, why = resolve_release(data, release or minor)
        return parse_profile(resolved, source, why)
    shown = full_version or minor
    if minor.count(".") == 1 and minor.split(".")[0] == "3" and minor.split(".")[1].isdigit() and int(minor.split(".")[1]) < 8:
        raise ProfileError(
            f"CPython {shown} is not supported: zen reads images of CPython 3.8 to 3.14",
            "zen has no layout profile for CPython 3.7 and older (code objects without positional-only "
            "arguments, other frame and thread-state layouts); the README's version table lists what is supported",
        )
    raise ProfileError(
        f"no layout profile for CPython {minor} (the image runs Python {shown})",
        f"calibrate one with a CPython {minor} interpreter: `zen profile python --python /path/to/python{minor}`",
    )


def available_profiles() -> list[str]:
    """Versions for which a profile can be loaded: minor versions, and exact releases a user calibrated."""
    found = set()
    for d in (user_profile_dir(),):
        if d.is_dir():
            found.update(p.name for p in d.glob("cpython-*.json"))
    pkg = resources.files("zen.cpython.layout").joinpath("profiles")
    if pkg.is_dir():
        found.update(p.name for p in pkg.iterdir() if p.name.endswith(".json"))
    return sorted(n.split("-")[1] for n in found)
