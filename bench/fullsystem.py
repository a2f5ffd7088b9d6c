"""Full-system images (issue 14, item 7): cost of recovering a model from a whole-machine image.

    python bench/fullsystem.py [--memory MIB] [--keep DIR]

One run: a QEMU guest (tools/guestvm, Debian's stock kernel) serves the ConvNet family; its RAM
is imaged as a QEMU ELF dump and with LiME from inside, and zen images the same model process
from inside the guest as a process core. Then, each `zen` command in its own process:
  * one sequential cold read of each image (the unit of every ratio),
  * `zen symbols` for the new kernel from its vmlinuz alone (empty symbol cache: a first run),
  * `zen recover` of the model process from the ELF and LiME images, first run (the symbols just
    made, nothing else cached) and again (3 runs alternated with 3 cold reads: medians, each
    recovery from a cold page cache of the image),
  * `zen recover` of the same process from the process core,
with wall time and peak RSS (the child's ru_maxrss). Writes bench/results/fullsystem.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))
from bench_recover import sequential_read  # noqa: E402
from bench_scale import drop_cache  # noqa: E402

QUIESCE = (
    "echo never > /sys/kernel/mm/transparent_hugepage/enabled; "
    "echo never > /sys/kernel/mm/transparent_hugepage/defrag; "
    "echo 0 > /proc/sys/vm/compaction_proactiveness"
)

ZEN = [sys.executable, "-m", "zen"]
REPEATS = 3


def run_child(args: list, env: dict | None = None) -> tuple[float, int, subprocess.CompletedProcess]:
    """(seconds, peak RSS in MB, result) of one zen command, reaped here so ru_maxrss is its own."""
    t = time.perf_counter()
    proc = subprocess.Popen([*ZEN, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t
    rc = os.waitstatus_to_exitcode(status)
    if rc not in (0, 5):
        raise SystemExit(f"zen {' '.join(map(str, args))} failed ({rc}): {err.decode(errors='replace')[-2000:]}")
    return seconds, usage.ru_maxrss // 1024, subprocess.CompletedProcess(args, rc, out.decode(), err.decode())


def _first_difference(a: object, b: object, path: str = "") -> str:
    """Where two JSON values first part, as a dotted path: what a reader of a differing case looks at first."""
    if type(a) is not type(b):
        return f"{path or '.'} ({type(a).__name__} vs {type(b).__name__})"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k} (only in {'the core' if k not in a else 'the image'})"
            if a[k] != b[k]:
                return _first_difference(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        if len(a) != len(b):
            return f"{path} ({len(a)} vs {len(b)} items)"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path or '.'} ({str(a)[:60]!r} vs {str(b)[:60]!r})"


def case_differences(image_case: Path, core_case: Path) -> list[str]:
    """Which of the files a recovery must agree on differ between the two cases, and where first."""
    out = []
    for name in ("mr.json", "pr.json", "weights.safetensors"):
        a, b = (image_case / name).read_bytes(), (core_case / name).read_bytes()
        if a == b:
            continue
        where = _first_difference(json.loads(a), json.loads(b)) if name.endswith(".json") else f"{len(a)} vs {len(b)} bytes"
        out.append(f"{name} at {where}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memory", type=int, default=1536, help="guest RAM in MiB")
    ap.add_argument("--keep", type=Path, help="keep the images and cases in this directory")
    args = ap.parse_args()
    from guestvm import Guest, build_kernel_assets

    work = Path(args.keep or tempfile.mkdtemp(prefix="zen-bench-fs-"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    assets = build_kernel_assets(lime=True)
    share = work / "share"
    out, src = share / "out", share / "src"
    argv = [sys.executable, str(ROOT / "tests/targets/family_target.py"), str(out), "convnet", "--src", str(src)]
    images = {"ELF (QEMU dump-guest-memory)": work / "guest.elf", "LiME (in the guest)": share / "guest.lime"}
    core = share / "process.core"
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with Guest(assets, memory_mib=args.memory, share=share, workload=argv, cwd=ROOT, lime="tcp") as g:
        g.wait_for(out / "truth.json", 900)
        record = g.record()
        timings["boot"] = g.timings.get("boot_s", 0.0)
        timings["dump ELF"] = g.dump_elf(images["ELF (QEMU dump-guest-memory)"])
        g.run(QUIESCE)  # see tests/conftest.py: THP collapse during LiME smears the image
        timings["LiME"] = g.dump_lime(images["LiME (in the guest)"])
        zen_exe = Path(sys.executable).parent / "zen"
        t = time.perf_counter()
        g.run(f"chroot $R {zen_exe} acquire --pid {record['workload_pid']} -o {core}", timeout=900)
        timings["zen acquire in the guest"] = time.perf_counter() - t
    truth = json.loads((out / "truth.json").read_text())
    model = hex(truth["variants"]["convnet_se"]["model_id"])
    cache = work / "xdg-cache"  # an empty user cache: the first run on this kernel
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    rows = []
    sym_s, sym_rss, sym = run_child(["symbols", "--kernel", assets.vmlinuz], env)
    cold_core = sequential_read(core, cold=True)
    drop_cache(core)
    core_s, core_rss, _ = run_child(["recover", core, "-o", work / "case-core", "--model", model], env)
    differs: dict[str, list[str]] = {}
    for label, image in images.items():
        drop_cache(image)
        shutil.rmtree(work / "case-first", ignore_errors=True)  # the previous image's (zen refuses to replace a case)
        first_s, first_rss, _ = run_child(["recover", image, "-o", work / "case-first", "--model", model], env)
        # the virtual disk serves one file at very different speeds from one minute to the next: cold reads and
        # cold recoveries alternate, REPEATS each, and the ratio is of their medians
        colds, agains = [], []
        for _ in range(REPEATS):
            colds.append(sequential_read(image, cold=True))
            drop_cache(image)
            shutil.rmtree(work / "case-again", ignore_errors=True)
            agains.append(run_child(["recover", image, "-o", work / "case-again", "--model", model], env)[:2])
        diff = case_differences(work / "case-again", work / "case-core")
        if diff:  # kept for a look, whether or not --keep was given
            differs[label] = diff
            kept = Path(tempfile.mkdtemp(prefix="zen-bench-fs-differs-"))
            shutil.copytree(work / "case-again", kept / "case-image")
            shutil.copytree(work / "case-core", kept / "case-core")
            diff.append(f"cases kept in {kept}")
        man = json.loads((work / "case-again" / "manifest.json").read_text())
        again_s, again_rss = statistics.median(a[0] for a in agains), max(a[1] for a in agains)
        rows.append((label, image.stat().st_size, statistics.median(colds), first_s, again_s, first_rss, again_rss,
                     man["run"]["seconds"], colds, [a[0] for a in agains]))  # fmt: skip
    lines = [
        "# Full-system images: recovery cost (issue 14)",
        "",
        f"One run of `python bench/fullsystem.py` on {time.strftime('%Y-%m-%d')}: {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; {time.perf_counter() - t_all:.0f} s in all. "
        f"Guest: Debian kernel {assets.version} under QEMU ({record.get('accel', 'tcg')}), {args.memory} MiB, "
        "serving the ConvNet family (4 models); recovered: `convnet_se`.",
        "",
        "## Symbols for a new kernel",
        "",
        f"`zen symbols --kernel vmlinuz-{assets.version}` (BTF + the kallsyms table inside the image, empty cache): "
        f"**{sym_s:.1f} s**, peak RSS {sym_rss} MB.",
        "",
        "## Recovery",
        "",
        f"Every recovery starts from a cold page cache of the image. Cold read and recover again: medians of {REPEATS}, "
        "alternated (range in parentheses); the first run is the first recovery with the symbols just made.",
        "",
        "| image | size | cold read s | recover, first run s (incl. symbols) | ratio to cold read "
        "| recover again s | ratio | peak RSS MB first / again |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, size, cold, first_s, again_s, first_rss, again_rss, _stages, colds, agains in rows:
        lines.append(
            f"| {label} | {size / 2**20:,.0f} MiB | {cold:.2f} ({min(colds):.2f}-{max(colds):.2f}) | {first_s:.2f} "
            f"({first_s + sym_s:.1f}) | {(first_s + sym_s) / cold:.1f}× | {again_s:.2f} ({min(agains):.2f}-{max(agains):.2f}) "
            f"| **{again_s / cold:.1f}×** | {first_rss} / {again_rss} |"
        )
    lines += [
        f"| process core of the same process (`zen acquire` in the guest) | {core.stat().st_size / 2**20:,.0f} MiB | "
        f"{cold_core:.2f} | {core_s:.2f} | {core_s / cold_core:.1f}× | | | {core_rss} |",
        "",
        f"Stages of the second ELF recovery (s): {json.dumps(rows[0][7])}.",
        f"Peak RSS above the process core's: ELF {rows[0][6] - core_rss:+d} MB, LiME {rows[1][6] - core_rss:+d} MB.",
        "Case files (mr.json, pr.json, weights) from each machine image equal the process core's: "
        + ("True." if not differs else "**False**: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in differs.items())),
        "",
        "Guest side (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()) + ".",
    ]
    dest = ROOT / "bench" / "results" / "fullsystem.md"
    dest.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
