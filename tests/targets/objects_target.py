"""A real "deployed" Python process for reader tests: a torch model plus objects of every kind.

Run: python objects_target.py OUTDIR
It builds and runs a small CNN, creates plain-Python objects covering every reader, then writes
OUTDIR/truth.json (ids, types, reprs, expected fields) and OUTDIR/functions.marshal (code objects
of every function reachable from sys.modules, keyed by function id), prints READY and waits until
stdin closes. Everything referenced by the ground truth is kept alive in KEEP.
"""

from __future__ import annotations

import abc
import asyncio  # noqa: F401 - imported so its functions are part of the census
import collections
import enum
import gc
import json
import marshal
import os
import sys
import types

from object_truth import _cell_full, code_fields, collect_functions, instrument  # beside this file

LIGHT = "--light" in sys.argv  # no torch: a quick pure-Python target for live-process tests
if not LIGHT:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
else:
    nn = types.SimpleNamespace(Module=object)

KEEP: list = []


# ---------------------------------------------------------------------------------------------
# classes of every shape
# ---------------------------------------------------------------------------------------------
class Plain:
    """instances keep inline values (never materialised)"""


class HotThing:
    pass


class Materialised:
    pass


class Slotted:
    __slots__ = ("alpha", "beta", "gamma")


class SlotsAndDict:
    __slots__ = ("s1", "__dict__")


class SlottedBase:
    __slots__ = ("base_slot",)


class DictOverSlots(SlottedBase):
    """instances have a slot before their attribute values (3.14 keeps those inline after it)"""


class Base1:
    def who(self):
        return "base1"


class Base2(Base1):
    pass


class Base3(Base1):
    pass


class Diamond(Base2, Base3):
    class Nested:
        def deep(self):
            return 42

    def who(self):
        return "diamond:" + super().who()

    @staticmethod
    def smeth(x, y=3):
        return x * y

    @classmethod
    def cmeth(cls, z):
        return (cls, z)

    @property
    def prop(self):
        """property doc"""
        return 7


class Meta(abc.ABC):
    @abc.abstractmethod
    def run(self): ...


class Concrete(Meta):
    def run(self):
        return 1


class MyInt(int):
    pass


class MyStr(str):
    pass


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


def with_everything(a, b=2, /, c=(1, "x"), *args, d, e={"k": [1, 2]}, **kw) -> annotated:  # noqa: F821, B006 - samples
    """function doc"""
    return a, b, c, d, e, args, kw


def make_closure():
    first = "closed-over"
    second = [1, 2, 3]

    def inner(x):
        return first, second, x

    return inner


def swapping(x, y, z):
    """Tuple assignments: ROT_TWO / ROT_THREE before 3.11, stores in reverse order from 3.11."""
    cos, sin = x * 2, y + 1
    a, b, c = z, x, y
    x, y = y, x
    return cos, sin, a, b, c, x, y


def make_empty_cell():
    def uses_later():
        return later  # noqa: F821 - cell is empty until assigned below

    cell_fn = uses_later
    return cell_fn
    later = 1  # noqa: F841 - never reached: the cell stays empty


def generator_fn(n):
    for i in range(n):
        yield i * 2


async def async_fn(x):
    return x


def uses_comprehension(xs):
    return [x * x for x in xs if x % 2], {k: v for k, v in zip(xs, xs)}, lambda q: q + 1


def hot_loop(n):
    """run many times so its bytecode is specialised (exercises de-specialisation)"""
    total = 0
    p = HotThing()  # not Plain: specialising attribute access on a class stops inline values for it
    p.v = 1
    for i in range(n):
        total += i * p.v + len(str(i))
    return total


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = x.mean(dim=(2, 3))
        return self.fc(x)


def as_builtin(value):
    """The value converted to its builtin base type (what a reader of raw memory returns)."""
    builtins_ = (bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, frozenset, set)
    if type(value) in builtins_:
        return value
    for base in builtins_:
        if isinstance(value, base):
            return base(value)
    return value


def tagged(value, kind):
    entry = {
        "id": id(value),
        "kind": kind,
        "type": f"{type(value).__module__}.{type(value).__qualname__}",
        "repr": repr(as_builtin(value)),
    }
    if isinstance(value, (set, frozenset)):  # set order depends on the hash seed: compare members
        entry["set_items"] = sorted(map(repr, value))
    return entry


def main(outdir: str) -> None:
    truth: dict = {"python": sys.version.split()[0], "torch": None if LIGHT else torch.__version__, "pid": os.getpid()}
    for _ in range(300):
        hot_loop(50)
    with_everything(1, d=4)
    make_closure()("y")
    list(generator_fn(3))
    uses_comprehension([1, 2, 3])

    if not LIGHT:
        model = Net().eval()
        x = torch.randn(2, 3, 8, 8)
        with torch.no_grad():
            y = model(x)
        KEEP.extend([model, x, y])
        truth["model"] = {"id": id(model), "training": model.training, "children": list(model._modules)}
    else:
        model = Plain()

    # -- plain values ----------------------------------------------------------------------
    values = {
        "none": None,
        "true": True,
        "false": False,
        "ellipsis": ...,
        "int_zero": 0,
        "int_small": 7,
        "int_neg": -123456,
        "int_big": 2**200 + 12345,
        "int_huge_neg": -(7**1200),
        "int_enum": Color.GREEN,
        "int_sub": MyInt(99),
        "float": 3.14159,
        "float_neg_zero": -0.0,
        "float_inf": float("inf"),
        "float_nan": float("nan"),
        "complex": complex(1.5, -2.25),
        "str_empty": "",
        "str_ascii": "hello world",
        "str_latin1": "caf\xe9 cr\xe8me",
        "str_ucs2": "snow \u2603 \u0100",
        "str_ucs4": "smile \U0001f600 \U0001f4a9",
        "str_long": "x" * 100_000 + "\u2603",
        "str_sub": MyStr("subclassed"),
        "bytes_empty": b"",
        "bytes": b"\x00\x01binary\xff",
        "bytes_big": bytes(range(256)) * 1000,
        "bytearray": bytearray(b"mutable bytes"),
        "tuple_empty": (),
        "tuple": (1, "two", 3.0, (4, (5,))),
        "list_empty": [],
        "list": [1, [2, [3, "four"]], None],
        "dict_unicode": {"a": 1, "b": [2], "c": {"d": None}},
        "dict_general": {1: "one", (2, 3): "tuple key", 4.5: "float key", None: "none key"},
        "dict_deleted": {f"key{i}": i for i in range(20)},
        "dict_width2": {f"w2_{i}": i for i in range(1000)},
        "dict_width4": {i: i * 2 for i in range(50_000)},
        "ordered": collections.OrderedDict([("z", 1), ("y", 2)]),
        "set_small": {"s1", "s2", "s3"},
        "set_dummy": {f"d{i}" for i in range(10)},
        "set_big": set(range(5000)),
        "frozenset": frozenset({"f1", 2, (3, 4)}),
        "frozenset_empty": frozenset(),
    }
    for i in range(0, 20, 3):
        del values["dict_deleted"][f"key{i}"]
    for i in range(0, 10, 2):
        values["set_dummy"].discard(f"d{i}")
    ba = bytearray(b"0123456789")
    del ba[:4]  # ob_start moves past ob_bytes
    values["bytearray_shifted"] = ba
    cyc: list = [1]
    cyc.append(cyc)
    values["list_cycle"] = cyc
    KEEP.append(values)
    truth["values"] = {}
    for k, v in values.items():
        entry = tagged(v, "value")
        if k == "float_nan":
            entry["repr"] = "nan"
        truth["values"][k] = entry

    # -- instances ------------------------------------------------------------------------------
    # Attributes are set from these dicts and the ground truth is taken from them, because asking
    # an instance for vars() would materialise the very dict whose absence we want to test.
    def build(cls, attrs):
        obj = cls()
        for k, v in attrs.items():
            setattr(obj, k, v)
        return obj, {k: repr(v) for k, v in attrs.items()}

    p, p_attrs = build(Plain, {"first": "inline-1", "second": [1, 2], "third": None})
    p2, p2_attrs = build(Plain, {"third": 3, "first": 1})  # other insertion order on the shared keys
    m, _ = build(Materialised, {"a": 1, "b": "bee"})
    m.__dict__["c"] = 3.5
    s = Slotted()
    s.alpha = "A"
    s.gamma = (1, 2)
    sd = SlotsAndDict()
    sd.s1 = "slot"
    sd.extra = "in dict"
    dos, dos_attrs = build(DictOverSlots, {"x": "after the slot", "y": 2})
    dos.base_slot = "in the slot"
    mi = MyInt(5)
    mi.tag = "dict at tp_dictoffset"
    dia, dia_attrs = build(Diamond, {"attr": 1})
    conc = Concrete()
    instances = {
        "plain": (p, "inline-values", p_attrs),
        "plain_order": (p2, "inline-values", p2_attrs),
        "materialised": (m, "managed-dict", None),
        "slotted": (s, "none", {}),
        "slots_and_dict": (sd, None, None),
        # 3.12+ gives int subclasses a managed dict too; the type's own flag says which it is
        "int_subclass": (mi, "managed-dict" if MyInt.__flags__ & (1 << 4) else "dict-offset", None),
        "diamond": (dia, "inline-values", dia_attrs),
        # 3.13 inlines values only for instances without fields of their own; 3.14 after any fields
        "dict_over_slots": (
            dos,
            "managed-dict" if DictOverSlots.__flags__ & (1 << 4) and sys.version_info[:2] == (3, 13) else "inline-values",
            dos_attrs,
        ),
        "concrete": (conc, "inline-values", {}),
    }
    if sys.version_info < (3, 11):  # noqa: UP036 - run by 3.10 too; no managed dicts: every __dict__ sits at tp_dictoffset, made on first use
        instances = {k: (o, None if st is None or attrs == {} else "dict-offset" if st != "none" else st, attrs)
                     for k, (o, st, attrs) in instances.items()}  # fmt: skip
    KEEP.append(instances)
    truth["instances"] = {}
    for k, (obj, storage, attrs) in instances.items():
        slots = {}
        for cls in type(obj).__mro__:
            for name in cls.__dict__.get("__slots__", ()):
                if name in ("__dict__", "__weakref__"):
                    continue
                slots[name] = repr(getattr(obj, name)) if hasattr(obj, name) else None
        if attrs is None:  # these instances have a real dict already: reading it changes nothing
            attrs = {n: repr(v) for n, v in vars(obj).items()}
        truth["instances"][k] = {
            "id": id(obj),
            "type": f"{type(obj).__module__}.{type(obj).__qualname__}",
            "attrs": attrs,
            "slots": slots,
            "storage": storage,
        }

    # -- types -----------------------------------------------------------------------------------
    tlist = {
        "int": int,
        "dict": dict,
        "OrderedDict": collections.OrderedDict,
        "Plain": Plain,
        "Diamond": Diamond,
        "Nested": Diamond.Nested,
        "Concrete": Concrete,
        "Meta": Meta,
        "Slotted": Slotted,
        "MyInt": MyInt,
        "Color": Color,
    }
    if not LIGHT:
        tlist.update(Net=Net, Conv2d=nn.Conv2d, Tensor=torch.Tensor)
    truth["types"] = {
        k: {
            "id": id(t),
            "name": t.__name__,
            "qualname": t.__qualname__,
            "module": t.__module__,
            "bases": [f"{b.__module__}.{b.__qualname__}" for b in t.__bases__],
            "mro": [f"{b.__module__}.{b.__qualname__}" for b in t.__mro__],
            "dict_keys": sorted(k2 for k2 in t.__dict__ if isinstance(k2, str)),
            "slots": list(getattr(t, "__slots__", ())) if "__slots__" in t.__dict__ else [],
            "flags": t.__flags__,
            "basicsize": t.__basicsize__,
        }
        for k, t in tlist.items()
    }

    # -- modules ---------------------------------------------------------------------------------
    truth["modules"] = {
        n: {"id": id(mod), "file": getattr(mod, "__file__", None)}
        for n, mod in sys.modules.items()
        if isinstance(mod, types.ModuleType)
    }
    truth["sys_modules_keys"] = list(sys.modules)  # includes non-module entries (typing.io is a class)
    truth["module_sample"] = ["sys", "builtins", "os", "__main__", "collections"] + (
        [] if LIGHT else ["torch", "torch.nn.modules.conv"]
    )

    # -- functions and friends -----------------------------------------------------------------
    closure = make_closure()
    empty = make_empty_cell()
    bound = dia.who
    lam = lambda q=5: q * 2  # noqa: E731
    funcs = {
        "with_everything": with_everything,
        "closure": closure,
        "empty_cell": empty,
        "generator": generator_fn,
        "async": async_fn,
        "lambda": lam,
        "hot_loop": hot_loop,
        "comprehension": uses_comprehension,
        "method_fn": Diamond.who,
        "nested_method": Diamond.Nested.deep,
    }
    if not LIGHT:
        funcs["forward"] = Net.forward
    KEEP.extend([closure, empty, bound, lam])
    truth["functions"] = {}
    for k, f in funcs.items():
        truth["functions"][k] = {
            "id": id(f),
            "name": f.__name__,
            "qualname": f.__qualname__,
            "module": f.__module__,
            "code": id(f.__code__),
            "globals": id(f.__globals__),
            "defaults": repr(f.__defaults__),
            "kwdefaults": repr(f.__kwdefaults__),
            "closure": [[id(c.cell_contents), repr(c.cell_contents)] if _cell_full(c) else None for c in (f.__closure__ or ())],
            "annotations": repr(f.__annotations__),
            "doc": f.__doc__,
        }
    truth["cells"] = [
        {"id": id(c), "value": repr(c.cell_contents) if _cell_full(c) else None} for f in (closure, empty) for c in f.__closure__
    ]
    truth["method"] = {"id": id(bound), "func": id(bound.__func__), "self": id(bound.__self__)}
    sm, cm, pr = Diamond.__dict__["smeth"], Diamond.__dict__["cmeth"], Diamond.__dict__["prop"]
    truth["staticmethod"] = {"id": id(sm), "func": id(sm.__func__)}
    truth["classmethod"] = {"id": id(cm), "func": id(cm.__func__)}
    truth["property"] = {"id": id(pr), "fget": id(pr.fget), "fset": id(pr.fset), "fdel": id(pr.fdel), "doc": pr.__doc__}

    # -- every function reachable from sys.modules, with its code marshalled -------------------
    allf = collect_functions()
    KEEP.append(allf)
    index = []
    blobs = []
    fields = []
    for f, where in allf:
        try:
            blob = marshal.dumps(f.__code__)
        except ValueError:
            continue
        if LIGHT:
            fields.append(code_fields(f.__code__))
        index.append(
            {
                "id": id(f),
                "code": id(f.__code__),
                "where": where,
                "qualname": f.__qualname__,
                "stacksize": f.__code__.co_stacksize,
            }
        )
        blobs.append(blob)
    with open(os.path.join(outdir, "functions.marshal"), "wb") as fh:
        marshal.dump(blobs, fh)
    if LIGHT:
        # Code objects field by field, for analysers of another Python version that cannot
        # unmarshal this version's code objects.
        with open(os.path.join(outdir, "code_fields.json"), "w") as fh:
            json.dump(fields, fh)
    truth["all_functions"] = index
    truth["gc_tracked_sample"] = [id(o) for o in (p, m, dia, model, values["list"], values["dict_unicode"])]
    truth["threads"] = 1
    truth["instrumented"] = instrument([hot_loop, with_everything, Diamond.who])
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh)
    gc.collect()
    print("READY", flush=True)
    sys.stdin.read()  # wait until the test closes our stdin


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--")][0])
