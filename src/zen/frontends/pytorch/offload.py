"""Offloaded weights (accelerate): where the data of a `meta` tensor lives, read from the hook's own index.

Why: `device_map` with `cpu`/`disk` entries, `cpu_offload` and `disk_offload` leave the model's parameters on the
`meta` device (no data) and give each module an `AlignDevicesHook` whose `weights_map` says where each tensor is:
a `PrefixedDataset` over either a dict of CPU tensors (CPU offload: the data *is* in the image, in those tensors)
or an `OffloadedWeightsLoader` (its own `state_dict` of CPU tensors, plus `save_folder` and an `index` naming each
disk-offloaded tensor's dtype and shape, and for weights left in the original checkpoint its `safetensors_file` and
`weight_name`). Nothing here runs accelerate's code: the objects are read as the image holds them.

For each meta tensor of the model: found in memory -> its slot takes that tensor's metadata (read bit-exact like
any other, the record says where it came from); found in a file -> the record names the file (status `offloaded`),
and `zen recover --offload DIR|FILE` reads it from the file the investigator supplies (`offload_files.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zen.cpython.interp import Interpreter
from zen.cpython.readers.containers import read_list
from zen.cpython.readers.dicts import read_dict
from zen.cpython.readers.instances import read_instance
from zen.frontends.pytorch.modules import ModuleIndex
from zen.frontends.pytorch.mr import TensorSlot, tensor_record
from zen.frontends.pytorch.tensors import TensorReader
from zen.runtime.errors import ZenError

MAX_INDEX = 1_000_000  # entries of one offload index or in-memory map
MAX_HOOKS = 64  # hooks of one SequentialHook


@dataclass
class Offloaded:
    """Where an offloaded tensor's data is: in memory (a tensor address) or in a file."""

    key: str
    tensor: int = 0  # a CPU tensor in the image holding the data
    file: str = ""  # the file accelerate reads it from
    weight_name: str = ""  # its key in a safetensors file ("" for accelerate's own .dat files)
    dtype: str = ""
    shape: tuple[int, ...] = ()

    def to_json(self) -> dict:
        if self.tensor:
            return {"from": "memory", "tensor": f"{self.tensor:#x}"}
        out = {"from": "file", "file": self.file, "dtype": self.dtype, "shape": list(self.shape)}
        return {**out, "weight_name": self.weight_name} if self.weight_name else out


def _attrs(ip: Interpreter, addr: int | None) -> dict[str, int]:
    if addr is None or ip.is_none(addr) or ip.kind(addr) != "instance":
        return {}
    return read_instance(ip, addr).attrs


def _str_items(ip: Interpreter, addr: int | None) -> list[tuple[str, int]]:
    """A str-keyed dict's items, read once per dict: every module of an offloaded model shares one weights map, so
    a model of N tensors would otherwise read an N-entry map N times."""
    if addr is None or ip.is_none(addr) or ip.kind(addr) != "dict":
        return []
    memo = ip.census_memo.setdefault("offload_maps", {})
    if addr not in memo:  # type: ignore[operator]
        items = read_dict(ip, addr)
        if len(items) > MAX_INDEX:
            raise ZenError(f"an offload map of {len(items):,} entries (more than {MAX_INDEX:,})")
        memo[addr] = dict((ip.str(k), v) for k, v in items if ip.kind(k) == "str")  # type: ignore[index]
    return list(memo[addr].items())  # type: ignore[index]


def align_hooks(ip: Interpreter, module_attrs: dict[str, int]) -> list[dict[str, int]]:
    """The attributes of each accelerate hook of a module (a SequentialHook's hooks, in order)."""
    hook = module_attrs.get("_hf_hook")
    attrs = _attrs(ip, hook)
    inner = attrs.get("hooks")
    if inner is not None and ip.kind(inner) in ("list", "tuple"):
        from zen.cpython.readers.containers import read_tuple

        hooks = read_list(ip, inner) if ip.kind(inner) == "list" else read_tuple(ip, inner)
        return [_attrs(ip, h) for h in hooks[:MAX_HOOKS]]
    return [attrs] if attrs else []


def locate(ip: Interpreter, module_attrs: dict[str, int], name: str) -> Offloaded | None:
    """Where the hook of a module says its parameter/buffer `name` is, or None when no hook names it."""
    for hook in align_hooks(ip, module_attrs):
        wm = _attrs(ip, hook.get("weights_map"))
        if not wm:
            continue
        prefix_addr = wm.get("prefix")
        prefix = ip.str(prefix_addr) if prefix_addr is not None and ip.kind(prefix_addr) == "str" else ""
        key = prefix + name
        ds = wm.get("dataset")
        if ds is None:
            continue
        if ip.kind(ds) == "dict":  # cpu_offload: a dict of CPU tensors
            hit = dict(_str_items(ip, ds)).get(key)
            if hit is not None:
                return Offloaded(key, tensor=hit)
            continue
        loader = _attrs(ip, ds)  # OffloadedWeightsLoader
        hit = dict(_str_items(ip, loader.get("state_dict"))).get(key)
        if hit is not None:
            return Offloaded(key, tensor=hit)
        entry = dict(_str_items(ip, loader.get("index"))).get(key)
        if entry is not None:
            return _from_index(ip, key, entry, loader.get("save_folder"))
    return None


def _from_index(ip: Interpreter, key: str, entry: int, folder: int | None) -> Offloaded:
    e = dict(_str_items(ip, entry))
    dtype = ip.str(e["dtype"]) if "dtype" in e and ip.kind(e["dtype"]) == "str" else ""
    shape: tuple[int, ...] = ()
    if "shape" in e and ip.kind(e["shape"]) in ("list", "tuple"):
        shape = tuple(int(v) for v in ip.value(e["shape"], 2))
    if "safetensors_file" in e:
        return Offloaded(key, file=ip.str(e["safetensors_file"]), weight_name=ip.str(e.get("weight_name", e["safetensors_file"])),
                         dtype=dtype, shape=shape)  # fmt: skip
    base = ip.str(folder) if folder is not None and ip.kind(folder) == "str" else ""
    return Offloaded(key, file=os.path.join(base, f"{key}.dat"), dtype=dtype, shape=shape)


def resolve(ip: Interpreter, reader: TensorReader, index: ModuleIndex, root: int, slots: list[TensorSlot]) -> list[str]:
    """Give each meta tensor of the model its data's place: read from memory, or named (status "offloaded").
    Returns problems (a hook that could not be read)."""
    problems: list[str] = []
    paths = {path: node for path, node in index.walk(root)}
    for i, s in enumerate(slots):
        if s.meta is None or s.meta.device != "meta":
            continue
        path, _, name = s.key.rpartition(".")
        node = paths.get(path)
        if node is None:
            continue
        try:
            where = locate(ip, node.attrs, name)
        except ZenError as exc:
            problems.append(f"{s.key}: the accelerate hook that holds its data could not be read ({exc})")
            continue
        if where is None:
            continue
        if where.tensor:
            try:
                meta = reader.meta(where.tensor)
            except ZenError as exc:
                problems.append(f"{s.key}: accelerate's offloaded copy at {where.tensor:#x} is unreadable ({exc})")
                continue
            # the slot stays the model's (meta) parameter, so the module's keys still name it; its data is the copy's
            rec = tensor_record(s.key, s.kind, s.addr, meta, reader=reader)
            rec.device, rec.python_type, rec.offload = "meta", s.record.python_type, where.to_json()
            rec.note = "read from accelerate's offload map in memory (the module's AlignDevicesHook weights_map)"
            slots[i] = TensorSlot(s.key, s.addr, s.kind, meta, rec)
        else:
            s.record.status = "offloaded"
            s.record.offload = where.to_json()
            what = f"{where.weight_name!r} in " if where.weight_name else ""
            s.record.note = (f"offloaded by accelerate: the data is {what}{where.file} ({where.dtype} {list(where.shape)}), "
                             "not in the image; give that file with --offload DIR|FILE")  # fmt: skip
    return problems
