"""Readings of a fused kernel's op list as data flow over its inputs (no torch, no TVM).

TVM passes a fused kernel's inputs in the order its ops first use them. A reading walks the op
tokens keeping a running value: an anchor (conv, matmul, norm) either continues the chain or, on
a fresh input, starts a second branch (the running value is saved: a residual block's two batch
norms); a binary op takes the next input, rejoins a saved branch, or takes no input at all (a
scalar baked into the kernel, then part of an elementwise run that is identified by behaviour).
Probing tries the readings in order and keeps the first one whose computation matches.
"""

from __future__ import annotations

from zen.compiled import ops

MAX_PLANS = 256
FALLBACK_1 = ("act", "reshape", "transpose", "softmax", "log_softmax", "mean", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")
FALLBACK_2 = ("conv2d", "conv1d", "matmul", "add", "multiply", "subtract", "divide", "maximum", "minimum")
FALLBACK_N = {3: ("layer_norm", "where"), 5: ("batch_norm",)}


def plans(tokens: list[str] | None, n_in: int) -> list[list[dict]]:
    """Step lists; a step is {"op", "operands": [("cur",) | ("in", k) | ("saved", j)], "save"?: j, "hint"?}."""
    if not tokens:  # hashed or renamed kernel: try single ops, recognised by behaviour alone
        if n_in == 1:
            return [[{"op": o, "operands": [("in", 0)]}] for o in FALLBACK_1]
        ops_n = FALLBACK_2 if n_in == 2 else FALLBACK_N.get(n_in, ())
        return [[{"op": o, "operands": [("in", k) for k in range(n_in)]}] for o in ops_n]
    out: list[list[dict]] = []

    def flush(steps: list[dict], run: list[str], have_cur: bool) -> list[dict]:
        if not run:
            return steps
        return steps + [{"op": "act", "operands": [("cur",)] if have_cur else [("in", 0)], "hint": list(run)}]

    def walk(
        i: int,
        q: int,
        stack: tuple[int, ...],
        saved: int,
        steps: list[dict],
        run: list[str],
        cur: bool,
        pend: tuple[int, ...] = (),
    ) -> None:
        if len(out) >= MAX_PLANS:
            return
        if i == len(tokens):
            if q == n_in and not stack and not pend:
                final = flush(steps, run, cur)
                if final:
                    out.append(final)
            return
        t = tokens[i]
        if not cur and not run:  # the first op reads only inputs
            if t in ops.ANCHORS:
                a = ops.ANCHORS[t]
                if q + a <= n_in:
                    walk(
                        i + 1,
                        q + a,
                        stack,
                        saved,
                        steps + [{"op": t, "operands": [("in", q + k) for k in range(a)]}],
                        [],
                        True,
                        pend,
                    )
                if q + 1 + a <= n_in and "concatenate" in tokens[i + 1 :]:  # the first input waits for the concatenation
                    walk(
                        i + 1,
                        q + 1 + a,
                        stack,
                        saved,
                        steps + [{"op": t, "operands": [("in", q + 1 + k) for k in range(a)]}],
                        [],
                        True,
                        (q,),
                    )
            elif t in ops.BINARY and q + 2 <= n_in:
                walk(i + 1, q + 2, stack, saved, steps + [{"op": t, "operands": [("in", q), ("in", q + 1)]}], [], True, pend)
            elif t in ops.BINARY or t in ops.UNARY_TOKENS:
                walk(i + 1, q + 1 if n_in else q, stack, saved, steps, [t], False, pend)
            elif t == "concatenate":  # joins a run of inputs; later ops (a fused batch norm) may take the rest
                for end in range(n_in, q, -1):
                    walk(
                        i + 1,
                        end,
                        stack,
                        saved,
                        steps + [{"op": t, "operands": [("in", k) for k in range(q, end)]}],
                        [],
                        True,
                        pend,
                    )
            else:
                take = 1 if q < n_in and t not in ("zeros", "ones", "full") else 0
                walk(i + 1, q + take, stack, saved, steps + [{"op": t, "operands": [("in", q)] if take else []}], [], True, pend)
            return
        if t == "quantize" and run:  # quantize-dequantize is measured as one step of its own (see fitting.fake_quant)
            steps, run, cur = flush(steps, run, cur), [], True
        if t in ops.UNARY_TOKENS:
            walk(i + 1, q, stack, saved, steps, run + [t], cur, pend)
            if cur and not run and q < n_in:  # an elementwise op on a fresh input starts a second branch
                walk(
                    i + 1,
                    q + 1,
                    stack + (saved,),
                    saved + 1,
                    steps + [{"op": "act", "operands": [("in", q)], "hint": [t], "save": saved}],
                    [],
                    True,
                    pend,
                )
            return
        base = flush(steps, run, cur)
        if t in ops.BINARY:
            if q < n_in:
                walk(i + 1, q + 1, stack, saved, base + [{"op": t, "operands": [("cur",), ("in", q)]}], [], True, pend)
            if stack:
                walk(
                    i + 1, q, stack[:-1], saved, base + [{"op": t, "operands": [("cur",), ("saved", stack[-1])]}], [], True, pend
                )
            walk(i + 1, q, stack, saved, steps, run + [t], cur, pend)
            for k in range(q):  # an input read again (a residual connection around a fused block)
                walk(i + 1, q, stack, saved, base + [{"op": t, "operands": [("cur",), ("in", k)]}], [], True, pend)
            return
        if t in ops.ANCHORS:
            a = ops.ANCHORS[t]
            if q + a - 1 <= n_in:
                walk(
                    i + 1,
                    q + a - 1,
                    stack,
                    saved,
                    base + [{"op": t, "operands": [("cur",)] + [("in", q + k) for k in range(a - 1)]}],
                    [],
                    True,
                    pend,
                )
            if q + a <= n_in:  # a second branch on fresh inputs; the running value waits to be rejoined
                walk(
                    i + 1,
                    q + a,
                    stack + (saved,),
                    saved + 1,
                    base + [{"op": t, "operands": [("in", q + k) for k in range(a)], "save": saved}],
                    [],
                    True,
                    pend,
                )
            if a >= 3 and stack and q + a - 2 <= n_in:  # where(cond, x, y): the condition, an input, a saved branch
                walk(
                    i + 1,
                    q + a - 2,
                    stack[:-1],
                    saved,
                    base + [{"op": t, "operands": [("cur",)] + [("in", q + k) for k in range(a - 2)] + [("saved", stack[-1])]}],
                    [],
                    True,
                    pend,
                )
            return
        if t == "concatenate":
            if pend:  # inputs set aside by the first op (a channel-split branch passed through)
                waiting = [("in", k) for k in pend]
                walk(i + 1, q, stack, saved, base + [{"op": t, "operands": waiting + [("cur",)]}], [], True)
                walk(i + 1, q, stack, saved, base + [{"op": t, "operands": [("cur",)] + waiting}], [], True)
                return
            if stack:  # two branches rejoined by the concatenation
                sv = ("saved", stack[-1])
                walk(i + 1, q, stack[:-1], saved, base + [{"op": t, "operands": [sv, ("cur",)]}], [], True, pend)
                walk(i + 1, q, stack[:-1], saved, base + [{"op": t, "operands": [("cur",), sv]}], [], True, pend)
            for end in range(n_in, q, -1):  # the running value first or last among the joined tensors
                fresh = [("in", k) for k in range(q, end)]
                walk(i + 1, end, stack, saved, base + [{"op": t, "operands": [("cur",)] + fresh}], [], True, pend)
                walk(i + 1, end, stack, saved, base + [{"op": t, "operands": fresh + [("cur",)]}], [], True, pend)
            return
        walk(i + 1, q, stack, saved, base + [{"op": t, "operands": [("cur",)]}], [], True, pend)
        if t == "cast" and q < n_in:  # a cast of a fresh input starts a second branch
            walk(
                i + 1,
                q + 1,
                stack + (saved,),
                saved + 1,
                base + [{"op": t, "operands": [("in", q)], "save": saved}],
                [],
                True,
                pend,
            )

    walk(0, 0, (), 0, [], [], False)
    return out
