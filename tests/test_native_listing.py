"""The compiled listing normaliser (zen.native listing.c, issue 50) writes exactly the lines of its reference.

`listing.normalise` runs the instruction loop in C and hands the version-specific instructions to the same Python
(`_special`, `_Inlined.skip`); `normalise_pure` is the reference. They are compared on every code object of real
images of CPython 3.8 (through the 3.11 shape `listing_of` gives older bytecode), 3.11, 3.13 and 3.14, and on random
instruction sequences built to reach every branch: unconditional jumps to short returning blocks, labels, repeated
and out-of-order offsets, constants past the table, superinstructions, inlined comprehensions, and names and kinds
that are not plain str (left to the reference).
"""

from __future__ import annotations

import random

import pytest
from conftest import opened_heap

from zen import native
from zen.cpython.code import listing
from zen.cpython.code.instructions import Instruction, decode, with_consts
from zen.cpython.layout.profile import load_profile
from zen.cpython.program.programmatic import listing_of
from zen.cpython.runtime import Runtime

needs_core = pytest.mark.skipif(native.core is None, reason=f"compiled core not loaded: {native.why}")


def _listings_image(image, monkeypatch) -> int:
    """Every code object's listing (constants shown as `c<i>`, some past the table) compiled and pure."""
    core = native.core
    with opened_heap(image) as (ip, _heap):
        rt = Runtime(ip)
        n = 0
        for addr in rt.code_addrs:
            ci = rt.code(addr)
            if ci is None:
                continue
            consts = [f"c{i}" for i in range(max(0, len(ci.consts) - len(ci.code) % 3))]
            got = listing_of(rt, ci, consts)
            monkeypatch.setattr(native, "core", None)
            try:
                want = listing_of(rt, ci, consts)
            finally:
                monkeypatch.setattr(native, "core", core)
            assert got == want, f"{ip.info.minor}: code object {addr:#x} ({ci.qualname}) lists differently"
            n += 1
    return n


@needs_core
def test_listing_equals_reference_on_a_transformers_image(hf_image, monkeypatch):
    assert _listings_image(hf_image[0], monkeypatch) > 20_000


@needs_core
def test_listing_equals_reference_on_mutated_real_bytecode(hf_image):
    """Real code objects' bytecode with bytes overwritten (what a corrupt page of an image gives the decoder): the
    decoded instructions, whatever they are, list the same both ways."""
    rng = random.Random(7)
    with opened_heap(hf_image[0]) as (ip, _heap):
        rt = Runtime(ip)
        ops, n = ip.P.opcodes, 0
        for addr in rt.code_addrs[::40]:
            ci = rt.code(addr)
            if ci is None or not ci.code:
                continue
            for _ in range(3):
                code = bytearray(ci.code)
                for _ in range(rng.choice([1, 4, 16])):
                    code[rng.randrange(len(code))] = rng.randrange(256)
                ins = decode(bytes(code), ci.names, ci.localsplusnames, [], ops, ci.free_base)
                consts = [f"c{i}" for i in range(len(ci.consts))]
                assert listing.normalise(ins, consts) == listing.normalise_pure(with_consts(ins, consts)), bytes(code).hex()
                n += 1
    assert n > 1_000


@needs_core
@pytest.mark.parametrize("minor", ["3.8", "3.13", "3.14"])
def test_listing_equals_reference_on_other_pythons(foreign_images, minor, monkeypatch):
    got = foreign_images(minor)
    if got is None:
        pytest.skip(f"no CPython {minor} here")
    assert _listings_image(got[1], monkeypatch) > 1_000


KINDS = ("name", "const", "local", "free", "compare", "binop", "jump", "other", "local_pair", "none")
ODD = {"RETURN_VALUE", "RETURN_CONST", "JUMP_FORWARD", "JUMP_BACKWARD", "SWAP", "POP_TOP", "STORE_FAST", "RERAISE",
       "GET_ITER", "FOR_ITER", "END_FOR", "LOAD_FAST_AND_CLEAR", "STORE_FAST_STORE_FAST", "LOAD_FAST_LOAD_FAST",
       "MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE", "CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC",
       "LOAD_SUPER_ATTR", "BINARY_OP", "JUMP_IF_FALSE_OR_POP", "STORE_NAME", "LOAD_SMALL_INT", "CALL_KW", "CALL",
       "NOP", "CACHE", "KW_NAMES", "LOAD_CONST"}  # fmt: skip


def _random_listing(rng: random.Random, names: list[str]) -> tuple[list[Instruction], list[str]]:
    n = rng.randrange(0, 60)
    offsets = list(range(0, 2 * n, 2))
    if rng.random() < 0.08:  # out-of-order offsets: the reference's dict, not a search
        rng.shuffle(offsets)
    elif rng.random() < 0.08:  # a repeated one
        offsets.insert(rng.randrange(n + 1), rng.choice(offsets or [0]))
    out = []
    for off in offsets[:n]:
        name = rng.choice(names)
        kind = rng.choice(KINDS)
        if "JUMP" in name and rng.random() < 0.7 or name == "FOR_ITER":
            kind = "jump"
        if name in ("LOAD_CONST", "RETURN_CONST", "KW_NAMES"):
            kind = "const"
        arg = rng.randrange(0, 12)
        argval: object = {
            "jump": rng.choice([rng.randrange(-4, 2 * n + 4), True, 2.0, "x"]),
            "const": f"<k{arg}>",
            "local_pair": (f"a{arg}", f"b{arg}"),
            "binop": rng.choice(["+", "[]", "*"]),
            "name": rng.choice(["x", "__firstlineno__", "__static_attributes__", "y"]),
        }.get(kind, arg)
        if rng.random() < 0.02:  # unhashable: the reference raises or not depending on where it looks
            argval = [argval]
        out.append(Instruction(off, rng.randrange(256), name, arg, kind, argval))
    consts = [f"c{i}" for i in range(rng.randrange(0, 8))]
    return out, consts


@needs_core
@pytest.mark.parametrize("minor", ["3.8", "3.11", "3.12", "3.13", "3.14"])
def test_listing_equals_reference_on_random_instructions(minor):
    ops = load_profile(minor).opcodes
    names = sorted({ops.name(op) for op in range(256)} | ODD)
    rng = random.Random(f"listing {minor}")
    for _ in range(3000):
        ins, consts = _random_listing(rng, names)
        try:
            want: object = listing.normalise_pure(with_consts(ins, consts))
        except Exception as exc:  # noqa: BLE001 - the compiled loop must raise the same
            want = type(exc)
        try:
            got: object = listing.normalise(ins, consts)
        except Exception as exc:  # noqa: BLE001
            got = type(exc)
        assert got == want, ins


@needs_core
def test_listing_leaves_what_is_not_plain_to_the_reference():
    """A name or kind that is not an exact str, an item that is not a 6-tuple: the compiled loop answers None and
    the reference decides; more distinct names than the compiled memo holds are looked up without it."""

    class Name(str):
        pass

    plain = [Instruction(0, 1, "LOAD_FAST", 0, "local", "x"), Instruction(2, 2, "RETURN_VALUE", 0, "none", 0)]
    tables = listing._compiled_tables()
    assert native.core.listing(plain, None, tables, lambda *a: 0) == ["LOAD_FAST x", "RETURN_VALUE"]
    odd = [Instruction(2, 2, Name("RETURN_VALUE"), 0, "none", 0), Instruction(2, 2, "RETURN_VALUE", 0, Name("none"), 0),
           (2, 2, "X", 0, "none")]  # fmt: skip
    for last in odd:
        assert native.core.listing([plain[0], last], None, tables, lambda *a: 0) is None
    assert listing.normalise(plain[:1] + [Instruction(2, 2, Name("RETURN_VALUE"), 0, "none", 0)]) == [
        "LOAD_FAST x", "RETURN_VALUE"]  # fmt: skip
    many = [Instruction(2 * i, 1, "".join(["OP", str(i)]), i, "other", i) for i in range(3000)]
    many += [Instruction(6000, 1, "JUMP_FORWARD", 0, "jump", 0), Instruction(6002, 1, "BUILD_LIST", 3, "other", 3)]
    assert listing.normalise(many) == listing.normalise_pure(many)


@needs_core
def test_listing_survives_a_hook_that_lists_with_other_tables():
    """The compiled loop's memo belongs to one tables object: a hook that lists something else with another one
    (another thread could, while the hook runs Python) leaves the first listing's lines unchanged."""
    tables = listing._compiled_tables()
    rng = random.Random("reentrant")
    names = sorted({load_profile("3.13").opcodes.name(op) for op in range(256)} | ODD)
    other = (frozenset(names), *tables[1:])  # drops every name: its answers in the first listing would show
    everything = [Instruction(2 * i, 1, n, 0, k, -1) for i, n in enumerate(names) for k in ("other", "local", "jump")]
    for _ in range(300):
        ins, consts = _random_listing(rng, names)
        steps = listing._Steps()

        def hook(*a, steps=steps):
            assert native.core.listing(everything, None, other, lambda *b: 0) == []
            return steps(*a)

        try:
            want: object = listing.normalise_pure(with_consts(ins, consts))
        except TypeError:  # an unhashable argval where the reference looks one up
            want = TypeError
        try:
            got: object = native.core.listing(ins, consts, tables, hook)
            got = got if steps.comp is None else steps.comp.drop_handlers(got)  # type: ignore[arg-type]
        except TypeError:
            got = TypeError
        assert got == want, ins
