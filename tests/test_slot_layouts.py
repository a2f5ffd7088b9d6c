"""`read_slots` reads where each class keeps its `__slots__` members once per class, not once per instance.

Ground truth here is the per-instance reading it replaced (`_reference`, kept below): on every instance of every
slotted class of a real torch process image, and on the same image with the classes' dicts, member descriptors and
instances corrupted, the values (or the error: its type and message) are the same. The values themselves are
checked against the live process in tests/test_readers.py.
"""

from __future__ import annotations

import random

import pytest
from conftest import opened_heap

from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import read_dict
from zen.cpython.readers.instances import read_slots
from zen.cpython.readers.types import read_type
from zen.memory.overlay import overlay
from zen.runtime.errors import ZenError


def _reference(ip, addr: int, mro: list[int]) -> dict[str, int]:
    """The class dict read again for each instance (zen before the layouts were kept)."""
    out: dict[str, int] = {}
    md_kind = ip.wk.types.get("member_descriptor")
    if md_kind is None:
        return out
    MD, MDef = ip.P.memberdescr, ip.P.memberdef
    t_object_ex = ip.P.constants.get("T_OBJECT_EX", 16)
    for cls in mro:
        try:
            ct = read_type(ip, cls)
        except ZenError:
            continue
        if not ct.is_heap or not ct.slot_names or not ct.dict_addr:
            continue
        for k, v in read_dict(ip, ct.dict_addr):
            if ip.kind(k) != "str" or ip.header(v)[1] != md_kind:
                continue
            if ip.ptr(v + MD.d_type) != cls:
                continue
            mdef = ip.ptr(v + MD.d_member)
            offset = ip.space.i64(mdef + MDef.offset)
            mtype = ip.space.u32(mdef + MDef.type)
            if mtype not in (t_object_ex, 6) or not 0 < offset < ct.basicsize:
                continue
            out[ip.str(k)] = ip.ptr(addr + offset)
    return out


def _outcome(fn, ip, addr: int, mro: list[int]):
    try:
        return "ok", fn(ip, addr, mro)
    except ZenError as exc:
        return type(exc).__name__, str(exc)


@pytest.fixture(scope="module")
def slotted(zoo_image):
    """(image, {slotted class: its instances}) of a real torch process."""
    image, _ = zoo_image
    with opened_heap(image) as (ip, heap):
        classes = []
        for t in heap.all_types():
            try:
                mro = [read_type(ip, b) for b in read_type(ip, t).mro_addrs]
            except ZenError:
                continue
            if any(b.is_heap and b.slot_names for b in mro):
                classes.append(t)
        found = heap.instances_of_types(classes)
        yield image, {t: a.tolist() for t, a in found.items() if len(a)}


def test_every_slotted_instance_of_a_real_image(slotted):
    image, found = slotted
    assert sum(map(len, found.values())) > 500 and len(found) > 20  # dataclass fields, torch's slotted classes
    with opened_heap(image) as (ip, _):
        compared = nonempty = 0
        for cls, addrs in found.items():
            mro = read_type(ip, cls).mro_addrs
            for a in addrs:
                new, old = _outcome(read_slots, ip, a, mro), _outcome(_reference, ip, a, mro)
                assert new == old, hex(a)
                compared += 1
                nonempty += new[0] == "ok" and bool(new[1])
        assert ip.census_memo["slot_layouts"]  # the layouts were kept
        assert nonempty > 500, (compared, nonempty)


@pytest.mark.parametrize("seed", range(40))
def test_corrupted_classes_and_instances_agree(slotted, seed):
    """Words of the slotted classes' dicts, their member descriptors and definitions, and of the instances
    overwritten: each instance's outcome (values, or the error's type and message) is the reference's, with one
    interpreter (the layouts kept across instances, as in a recovery)."""
    image, found = slotted
    rng = random.Random(seed)
    classes = rng.sample(sorted(found), min(6, len(found)))
    with opened_heap(image) as (ip0, _):
        patches: dict[int, bytes] = {}
        targets = []
        for cls in classes:
            ct = read_type(ip0, cls)
            targets += [ct.dict_addr, cls]
            for b in ct.mro_addrs:
                bt = read_type(ip0, b)
                if bt.slot_names and bt.dict_addr:
                    for k, v in read_dict(ip0, bt.dict_addr)[:8]:
                        targets += [k, v, ip0.ptr(v + ip0.P.memberdescr.d_member)]
            targets += found[cls][:3]
        for at in rng.sample(targets, min(len(targets), rng.randint(1, 6))):
            off = rng.randrange(-16, 96) & ~7
            word = rng.choice([0, 1, 0xFFFF_FFFF_FFFF_FFFF, rng.getrandbits(64), at, at + 8])
            patches[at + off] = word.to_bytes(8, "little")
        ip = Interpreter(overlay(ip0.space, patches), ip0.info, ip0.P)
        for cls in classes:
            try:
                mro = read_type(ip, cls).mro_addrs
            except ZenError:
                continue
            for a in found[cls][:20]:
                assert _outcome(read_slots, ip, a, mro) == _outcome(_reference, ip, a, mro), (seed, hex(cls), hex(a))


def test_a_members_value_is_read_before_its_name(slotted):
    """Per instance, a member's value was read before its name: where both fail (the name's str corrupted, the
    instance's memory missing) the instance's error is the one raised, as before."""
    image, found = slotted
    with opened_heap(image) as (ip0, _):
        for cls in sorted(found):
            ct = read_type(ip0, cls)
            if not ct.slot_names:
                continue
            first = next((k for k, v in read_dict(ip0, ct.dict_addr) if ip0.kind(k) == "str" and ip0.str(k) in ct.slot_names
                          and ip0.kind(v) == "member_descriptor"), None)  # fmt: skip
            if first is not None:
                break
        else:
            pytest.skip("no slotted class with its own member descriptors")
        length = int(ip0.P.unicode.length)
        ip = Interpreter(overlay(ip0.space, {first + length: (1 << 62).to_bytes(8, "little")}), ip0.info, ip0.P)
        ip._type_cache.update(ip0._type_cache)  # the class as read before (its __slots__ tuple holds the same str)
        nowhere = 0x10  # no instance memory there
        new, old = _outcome(read_slots, ip, nowhere, [cls]), _outcome(_reference, ip, nowhere, [cls])
        assert new == old and old[0] != "ok" and "0x" in old[1], (new, old)
        again = _outcome(read_slots, ip, nowhere, [cls])  # from the kept layout
        assert again == old
        assert _outcome(read_slots, ip, found[cls][0], [cls]) == _outcome(_reference, ip, found[cls][0], [cls])
