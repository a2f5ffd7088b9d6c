"""Running a reading's PyTorch steps and scoring them against a kernel's measured outputs (probing child).

A step is `(op, attrs, operands, save)`; its expression text comes from zen.compiled.ops, so what is
scored here is what codegen writes into the rebuilt model. Scores are max abs differences scaled by
the reference's magnitude, so one tolerance serves small and large activations alike.
"""

from __future__ import annotations

import numpy as np

from zen.compiled import ops


def close(got, ref: np.ndarray) -> float:
    """Max abs difference scaled by the reference's magnitude; inf for shape mismatches."""
    g = got.detach().numpy() if hasattr(got, "detach") else np.asarray(got)
    if g.shape != ref.shape:
        return float("inf")
    if ref.dtype.kind == "b" and g.dtype.kind != "b":  # a mask must stay a mask: torch.where rejects floats
        return float("inf")
    if ref.dtype.kind in "iub":
        return 0.0 if np.array_equal(g.astype(ref.dtype), ref) else float("inf")
    g = g.astype(np.float64)
    r = ref.astype(np.float64)
    if (np.isnan(r) != np.isnan(g)).any():
        return float("inf")
    same = (g == r) | np.isnan(r)  # equal infinities and NaN positions agree
    d = np.where(same, 0.0, np.abs(np.where(same, 0.0, g - r)))
    return float(d.max(initial=0.0) / (1.0 + np.abs(np.where(np.isfinite(r), r, 0.0)).max(initial=0.0)))


def operand_name(operand) -> str:
    """The variable an operand is bound to, in probing and in the generated code alike."""
    return {"cur": "cur", "in": "a{}", "saved": "s{}"}[operand[0]].format(*operand[1:])


def evaluate(expr: str, env: dict):
    return eval(expr, {"torch": env["torch"], "F": env["F"]}, env)  # noqa: S307 - zen's own op templates


def run_steps(steps: list, env_base: dict):
    """The value a step list computes on the inputs bound in `env_base` (a0, a1, ...)."""
    torch = env_base["torch"]
    cur = None
    saved: dict = {}
    for j, (op, attrs, operands, save) in enumerate(steps):
        argn = [operand_name(o) for o in operands]
        if save is not None:
            saved[f"s{save}"] = cur
        env = dict(env_base, cur=cur, **saved)
        if op == "gather":  # index and shift tables become tensors, as codegen makes them buffers
            attrs = dict(attrs)
            if "index" in attrs:
                env[f"gi{j}"] = torch.tensor(attrs["index"], dtype=torch.int64)
                attrs["index_name"] = f"gi{j}"
            if isinstance(attrs.get("shift"), list):
                env[f"gs{j}"] = torch.tensor(attrs["shift"], dtype=torch.float32).reshape(attrs["shape"])
                attrs["shift_name"] = f"gs{j}"
        cur = evaluate(ops.expression(op, attrs, argn), env)
    return cur


def score(k, steps: list, env_base: dict, output: int = 0) -> float:
    with k.torch.no_grad():
        return close(run_steps(steps, env_base), k.outputs[output])


def refine(k, steps: list, env_base: dict, torch) -> list:
    """Re-measure epsilons on inputs where epsilon dominates (tiny activations, zero variance)."""
    eps_steps = [i for i, s in enumerate(steps) if "eps" in s[1]]
    if not eps_steps:
        return steps
    arrays = [np.array(a) for a in k.inputs]
    for s in steps:
        if s[0] == "batch_norm":
            for j in (3, 4):
                o = s[2][j]
                if o[0] == "in":
                    arrays[o[1]] = np.zeros_like(arrays[o[1]])
    for i, spec in enumerate(k.spec["inputs"]):
        if spec["kind"] != "const" and arrays[i].dtype.kind == "f":
            arrays[i] = arrays[i] * 1e-4
    ref = k.run(arrays)[0]
    env = dict(env_base)
    for i, a in enumerate(arrays):
        env[f"a{i}"] = torch.from_numpy(a)
    for i in eps_steps:
        scored = []
        for e in ops.EPS:
            trial = [(op, dict(a, eps=e) if j == i else a, o, sv) for j, (op, a, o, sv) in enumerate(steps)]
            with torch.no_grad():
                got = run_steps(trial, env).numpy().astype(np.float64)
            r = ref.astype(np.float64)
            scored.append((float(np.abs(got - r).max() / (np.abs(r).max() + 1e-30)), e))
        steps[i] = (steps[i][0], dict(steps[i][1], eps=min(scored)[1]), steps[i][2], steps[i][3])
    return steps
