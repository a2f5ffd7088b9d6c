"""`zen recover --model all`: one case per model root of the process, `CASE/<rank>-<class>/`.

Why: serving processes hold several models (a float reference beside the quantized deployment, an encoder and a
generator, a draft and a target model). `zen recover` picks one (served first: see `frontends.common.served`);
an investigator who wants them all gets one complete case directory per root, each recovered exactly as
`--model ADDRESS` would, so every later command works on each unchanged. Roots holding no tensor and served by no
running code (an exporter's leftover graph, an empty container) are listed but not written; at most `MAX_CASES`.
"""

from __future__ import annotations

import re
from pathlib import Path

from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

MAX_CASES = 16
out, err = consoles()


def _dirname(rank: int, cls: str) -> str:
    return f"{rank}-{re.sub(r'[^A-Za-z0-9_.]+', '_', cls.rsplit('.', 1)[-1])[:60] or 'model'}"


def recover_all(image: Path | None, pid: int | None, output: Path, sign: Path | None = None, **opts) -> list:
    """Every worthwhile root into its own case under `output`; returns the RecoverResults (rank order)."""
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ZenError(f"{output} exists and is not an empty directory", "--model all writes its cases into a new directory")
    created = not output.exists()
    output.mkdir(exist_ok=True)
    results: list = []
    try:
        return _recover_each(image, pid, output, sign, results, opts)
    except BaseException as exc:  # interrupted or failed: say what stands; a half-written case was removed by recover()
        done = ", ".join(r.case_dir.name for r in results) or "none"
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped by an error"
        if results or isinstance(exc, KeyboardInterrupt):  # else the error's own message says it all
            err.print(f"--model all {what}: cases written and complete before: {done}; the case being written was removed")
        if created and not any(output.iterdir()):
            output.rmdir()
        raise


def _recover_each(image, pid, output: Path, sign, results: list, opts: dict) -> list:
    from zen.recover.run import recover

    first_dir = output / ".rank1.partial"
    first = recover(image, pid, first_dir, model="#1", **opts)
    final = output / _dirname(1, first.mr.root.cls)
    first_dir.rename(final)
    first.case_dir = final
    results.append(first)
    todo = [r for r in first.mr.roots[1:] if r.parameters or r.served_by]
    skipped = [r for r in first.mr.roots[1:] if r not in todo]
    for r in todo[: MAX_CASES - 1]:
        results.append(recover(image, pid, output / _dirname(r.rank, r.cls), model=r.address, **opts))
    if sign is not None:
        from zen.represent.signature import sign_case

        for res in results:
            sign_case(res.case_dir, sign)
    for res in results:
        root = res.mr.root
        how = f"served: {root.served_by[0]}" if root.served_by else "alive, used by no running code"
        out.print(f"{res.case_dir.name}: {root.cls} at {root.address} ({how}), {len(res.mr.tensors)} tensors, {res.status}")
    if len(todo) > MAX_CASES - 1:
        err.print(f"[yellow]{len(todo) - MAX_CASES + 1} more roots with tensors not written (at most {MAX_CASES} cases); "
                  "recover them with --model ADDRESS[/yellow]")  # fmt: skip
    if skipped:
        out.print(f"not written (no tensors, used by no running code): {len(skipped)} root(s), e.g. {skipped[0].cls}")
    return results
