"""The search for a kernel's computation (probing child): readings of its op list, attribute settings
per step, each candidate computed in PyTorch and compared with what the kernel computed.

Order of search, per kernel: the readings of its name's op list (zen.compiled.kernels.plans), or single
operators when the name says nothing; then, for such a kernel, the fusions TVM is known to make
(ops.fusion_patterns), each a reading list of its own. Within a reading, steps are filled depth
first, attribute settings in the order ops.candidates gives (common settings first), and the first
complete reading that matches the kernel within tolerance wins. How far a search may go is counted
in work (zen.compiled.kernels.budget), so that where it stops, and so the answer, is the same on every
machine at any load.
"""

from __future__ import annotations

import numpy as np

from zen.compiled import ops
from zen.compiled.kernels.budget import Budget, SearchLimits
from zen.compiled.kernels.evaluate import close, evaluate, operand_name, refine, run_steps, score
from zen.compiled.kernels.fitting import fitted, quantize, samples
from zen.compiled.kernels.plans import plans
from zen.compiled.kernels.probe_linear import probe_linear

NOT_REPRODUCED = "no candidate computation reproduced the kernel"


def search(k, tokens: list[str] | None, limits: SearchLimits, tol: float = 2e-4) -> dict:
    """The first reading of the kernel (from its name's ops, else single ops, else known fusions) whose
    computation matches its outputs, within `limits`."""
    budget = Budget.for_kernel(limits)
    res = _readings(k, tokens, tol, budget, True)
    res["trials"] = budget.spent
    if res["status"] == "ok" or tokens is not None:
        return res
    # a hashed or renamed kernel that no single op explains: the fusions TVM is known to make, sharing
    # one budget, each pattern bounded on its own so that none spends the others' share
    shared = Budget.for_patterns(limits)
    tried = 0
    patterns = ops.fusion_patterns()
    for pattern in patterns:
        if shared.exhausted:
            break
        if pattern[-1] == "split" and len(k.outputs) < 2 or pattern[-1] != "split" and len(k.outputs) > 1:
            continue
        if not plans(pattern[:-1] if pattern[-1] == "split" else pattern, len(k.inputs)):
            continue  # the pattern cannot read this many inputs
        tried += 1
        found = _readings(k, pattern, tol, shared, False)
        if found["status"] == "ok":
            found["reading"] = "fusion pattern " + "_".join(pattern)
            found["trials"] = budget.spent + shared.spent
            return found
    res["trials"] = budget.spent + shared.spent
    stopped = shared.stopped()
    if stopped:
        res["reason"] += f"; {tried} of {len(patterns)} fusion patterns tried, search stopped at {stopped}"
        res["stopped"] = ", ".join(filter(None, [res.get("stopped"), stopped]))
    return res


def _readings(k, tokens: list[str] | None, tol: float, budget: Budget, top: bool) -> dict:
    """One reading list (a name's op list, or a fusion pattern). top: the kernel's own name (or single
    ops): the linear probe and, for a name whose ops fit no reading, single ops come after it."""
    if tokens and tokens[-1] == "split" and len(k.outputs) > 1:
        found = _search_split(k, tokens, tol, budget, top)
        if found is not None:
            return found
    return _search(k, tokens, tol, budget, top)


class _Joined:
    """A split kernel seen as the tensor it splits: its outputs concatenated along `dim`, so the search
    reproduces one tensor and a split step per output is added after it."""

    def __init__(self, k, dim: int) -> None:
        self.__dict__.update(k.__dict__)
        self.base, self.dim = k, dim
        self.outputs = [np.concatenate(k.outputs, axis=dim)]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate(self.base.run(arrays), axis=self.dim)]


def _search_split(k, tokens: list[str], tol: float, budget: Budget, top: bool) -> dict | None:
    shapes = [o.shape for o in k.outputs]
    for d in sorted(range(len(shapes[0])), key=lambda d: (shapes[0][d] == 1, d)):  # a real axis before batch 1
        if any(len(s) != len(shapes[0]) or s[:d] + s[d + 1 :] != shapes[0][:d] + shapes[0][d + 1 :] for s in shapes):
            continue
        res = _readings(_Joined(k, d), tokens[:-1], tol, budget, top)
        if res["status"] == "ok":
            sizes = [s[d] for s in shapes]
            res["per_output"] = [
                res["steps"] + [("split", {"dim": d, "sizes": sizes, "index": o}, [("cur",)], None)] for o in range(len(shapes))
            ]
            res["steps"] = res["per_output"][0]
            return res
    return None


def _act_candidates(hint: list[str]) -> list[dict]:
    named = {
        "relu": "relu",
        "sigmoid": "sigmoid",
        "tanh": "tanh",
        "erf": "gelu",
        "exp": "exp",
        "sqrt": "sqrt",
        "rsqrt": "rsqrt",
        "negative": "negative",
        "clip": "relu6",
        "gelu": "gelu",
        "silu": "silu",
        "logical_not": "logical_not",
    }
    first = [named[h] for h in hint if h in named]
    if "equal" in hint:  # a comparison with a constant baked into the kernel: with a negation after it, "not equal"
        first = (["ne_neginf", "ne_zero", "isfinite"] if "logical_not" in hint else ["eq_neginf", "eq_zero"]) + first
    if hint == ["sigmoid", "multiply"]:
        first = ["silu"] + first
    if "clip" in hint and "divide" in hint:  # relu6(x + 3) / 6, times x for hard-swish
        first = (["hardswish"] if "multiply" in hint else ["hardsigmoid"]) + first
    order = list(
        dict.fromkeys(
            first + [k for k in ops.ACTIVATIONS if k not in ("affine", "leaky_relu", "clamp", "fake_quant", "quantize")]
        )
    )
    strong = {h for h in hint if h in ops.UNARY_TOKENS and h not in ("quantize", "dequantize", "act")}
    if strong:  # a run naming clip or erf is not a sigmoid: fewer leaves per reading, more readings within budget
        order = [f for f in order if f in first or f not in ops.ACT_TOKENS or strong <= ops.ACT_TOKENS[f]]
    return [{"fn": f} for f in order]


def _search(k, tokens: list[str] | None, tol: float, budget: Budget, top: bool) -> dict:
    torch = k.torch
    import torch.nn.functional as F

    ref = k.outputs[0]
    out_shape = tuple(ref.shape)
    tens = [torch.from_numpy(np.array(a)) for a in k.inputs]
    env_base = {"torch": torch, "F": F}
    for i, t in enumerate(tens):
        env_base[f"a{i}"] = t
    leaves = 0
    best: tuple[float, list] | None = None
    special = _special_trial(k, tokens, torch, env_base)

    def names(step: dict) -> list[str]:
        return [operand_name(o) for o in step["operands"]]

    def stop() -> bool:
        if leaves >= budget.leaves:
            budget.leaves_hit = True
            return True
        return budget.exhausted

    def dfs(steps: list[dict], i: int, cur, chosen: list, saved: dict) -> list | None:
        nonlocal leaves, best
        if stop():
            return None
        if i == len(steps):
            leaves += 1
            err = close(cur, ref)
            if best is None or err < best[0]:
                best = (err, list(chosen))
            if err <= tol and special is not None:  # comparisons: also agree on -inf, 0 and masked rows
                try:
                    with torch.no_grad():
                        err = close(run_steps(list(chosen), special[0]), special[1])
                except (RuntimeError, ValueError, TypeError, IndexError, KeyError):
                    err = float("inf")
            return list(chosen) if err <= tol else None
        step = steps[i]
        op = step["op"]
        later_keep = all(s["op"] in ops.SHAPE_PRESERVING for s in steps[i + 1 :])
        # a later binary op with a fresh or saved operand may broadcast the running value (squeeze-excite gates)
        widen = later_keep and any(s["op"] in ops.BINARY and any(o[0] != "cur" for o in s["operands"]) for s in steps[i + 1 :])
        target = out_shape if later_keep else None
        if op in ops.RESHAPES and all(s["op"] in ops.SHAPE_PRESERVING | ops.RESHAPES for s in steps[i + 1 :]):
            target = out_shape  # an elementwise op commutes with a reshape: reshape straight to the final shape
        argn = names(step)
        if "save" in step:
            saved = dict(saved, **{f"s{step['save']}": cur})
            cur = None
        env = dict(env_base, cur=cur, **saved)
        if cur is not None:
            x_shape = tuple(cur.shape)
        else:
            x_shape = tuple(tens[step["operands"][0][1]].shape) if step["operands"] else out_shape
        if op == "act":
            cands = _act_candidates(step.get("hint", []))
            if (
                i == len(steps) - 1
                and ref.dtype.kind in "iu"
                and len(k.inputs) == 1
                and argn[0] == "a0"
                and k.inputs[0].dtype.kind == "f"
                and k.inputs[0].size == ref.size
            ):
                cands += quantize(*samples(k), ref.dtype)  # float -> integer: many runs pin the scale down
            elif i == len(steps) - 1:
                cands += fitted(evaluate(argn[0], env), ref, torch)
        else:
            operand_shapes = [tuple(env[n].shape) for n in argn[1:]]
            # with a broadcasting op ahead, the output shape does not pin the settings: common ones first,
            # any whose output neither equals nor broadcasts to the kernel's is dropped right after it runs
            cands = ops.candidates(op, x_shape, operand_shapes, None if widen and op in ops.ANCHORS else target, str(ref.dtype))
            if op == "reshape" and target is None and not any(s["op"] in ops.ANCHORS or s["op"] == "act" for s in steps[:i]):
                cands = []  # pure data movement is read faster by the linear probe than by guessing shapes
        tried: list = []  # settings computing the same tensor as one already tried (padding on a 1x1 map) lead nowhere new
        for attrs in cands:
            if stop():  # nothing below can be compared any more: do not compute what cannot be used
                return None
            expr = ops.expression(op, attrs, argn)
            budget.spend()
            try:
                with torch.no_grad():
                    val = evaluate(expr, env)
            except (RuntimeError, ValueError, TypeError, IndexError, KeyError):
                continue
            if hasattr(val, "shape") and any(
                t.shape == val.shape and t.dtype == val.dtype and torch.equal(t, val) for t in tried
            ):
                continue
            if hasattr(val, "shape") and len(tried) < 64:
                tried.append(val)
            if (
                later_keep
                and tuple(val.shape) != out_shape
                and op != "act"
                and not (widen and _broadcasts(tuple(val.shape), out_shape))
            ):
                continue
            found = dfs(steps, i + 1, val, chosen + [(op, attrs, step["operands"], step.get("save"))], saved)
            if found is not None:
                return found
        return None

    if not k.inputs and ref.size and np.all(ref == ref.flat[0]):
        v = ref.flat[0].item()
        return {"status": "ok", "steps": [("full", {"shape": list(out_shape), "value": v}, [], None)], "error": 0.0}
    readings = plans(tokens, len(k.inputs)) or []
    if tokens and top:  # a name whose op list fits no reading (a dequantize taking a scale tensor)
        readings += plans(None, len(k.inputs))
    for steps in readings:
        found = dfs(steps, 0, None, [], {})
        if found is not None:
            return {"status": "ok", "steps": refine(k, found, env_base, torch), "error": score(k, found, env_base)}
    linear = probe_linear(k) if top else None
    if linear is not None:
        outs = linear.get("per_output", [linear["steps"]])
        linear["error"] = max(score(k, steps, env_base, o) for o, steps in enumerate(outs))
        if linear["error"] <= tol:
            return linear
    stopped = budget.stopped()
    res = {
        "status": "unresolved",
        "error": best[0] if best else None,
        "reason": NOT_REPRODUCED + (f" (search stopped at {stopped})" if stopped else ""),
    }
    return {**res, "stopped": stopped} if stopped else res


def _broadcasts(shape: tuple, out: tuple) -> bool:
    """Whether a tensor of `shape` broadcasts to `out` without changing its rank."""
    return len(shape) == len(out) and all(a in (1, b) for a, b in zip(shape, out))


COMPARISONS = {"equal", "not_equal", "less", "greater", "where", "logical_not"}


def _special_trial(k, tokens: list[str] | None, torch, env_base: dict) -> tuple[dict, np.ndarray] | None:
    """For kernels that compare with constants baked into them: inputs holding -inf, 0 and whole rows of
    -inf (a fully masked attention row), with the kernel's output on them. None for other kernels."""
    if not tokens or not COMPARISONS & set(tokens):
        return None
    rng = np.random.default_rng(11)
    arrays = []
    for spec, a in zip(k.spec["inputs"], k.inputs):
        a = np.array(a)
        if spec["kind"] != "const" and a.dtype.kind == "f" and a.size:
            r = rng.random(a.shape)
            a[r < 0.2] = -np.inf
            a[(r >= 0.2) & (r < 0.25)] = 0
            if a.ndim >= 2:
                a[(0,) * (a.ndim - 1)] = -np.inf  # one whole row along the last axis
        arrays.append(a)
    try:
        ref = k.run(arrays)[0]
    except (RuntimeError, ValueError, TypeError):
        return None
    env = dict(env_base)
    for i, a in enumerate(arrays):
        env[f"a{i}"] = torch.from_numpy(a)
    return env, ref
