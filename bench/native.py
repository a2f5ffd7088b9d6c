"""The compiled core against its pure-Python reference (issue 50), in one run: each path timed both ways, answers compared.

    python bench/native.py --cases DIR --library LIB [--image IMAGE] [--runs N] [--no-write]

DIR holds real recovered cases (`bench/real_cases.py DIR`); LIB a library of 100 real entries (the one
`bench/bench_attribute_cli.py --sizes 100 --work W` builds in W); IMAGE a process image (`bench/bench_digest.py`'s gpt2
target, imaged with `zen acquire`; without it the two rows that need it are left out). Measured, compiled (the
default) and pure (`ZEN_PURE=1`) alternated:

  * the case check (`schema.bounded_record`) of every mr.json, pr.json and ur.json in DIR, in this process;
  * the scan for 19+ digit integers (`jsontext._long_number`) over the same files, in this process;
  * code matching (`pr_similarity.code_similarity`: greedy and optimal) of real fork/base pairs in DIR, each run
    with a fresh IBSS cache (rapidfuzz's work, the same both ways, is in both columns), in this process;
  * decoding every readable code object of IMAGE (`instructions.decode`), and normalising its listing
    (`listing.normalise`: the C loop of listing.c), and reading each with empty caches (`read_code` over the
    object reader of objects.c), in this process;
  * the census' word search over IMAGE (every type address, in the heap's pointer map and over all writable memory);
  * the canonical-marshal rewrite of every code.marshal in DIR, in this process;
  * the tensor files of DIR hashed as a case check hashes them (`tensorfile.read_tensor_file`: the file's sha256 and
    every tensor's, page cache warm), with the compiled sha256 pair and with hashlib, in this process;
  * `zen attribute QUERY --library LIB --json` end to end, one process per run, for the transformers queries;
  * `zen recover IMAGE` end to end, one process per run (warm page cache: the disk is not what differs).

Every pair must give the same answer: the same booleans and instructions, the same attribution JSON, byte-identical
case files but the manifest. Writes the section "Compiled core (issue 50)" of bench/results/perf.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from bench_scale import CPU, timed, write_sections  # noqa: E402

from zen import native  # noqa: E402
from zen.cpython.code.instructions import decode, decode_pure  # noqa: E402
from zen.cpython.code.listing import normalise  # noqa: E402
from zen.cpython.program.programmatic import const_display  # noqa: E402
from zen.cpython.runtime import Runtime  # noqa: E402
from zen.represent import schema  # noqa: E402
from zen.represent.jsontext import loads  # noqa: E402
from zen.represent.mr import ModelMR  # noqa: E402
from zen.represent.pr import ProgrammaticRepresentation, UnifiedRepresentation  # noqa: E402

SECTION = "Compiled core (issue 50)"
RECORDS = {"mr.json": ModelMR, "pr.json": ProgrammaticRepresentation, "ur.json": UnifiedRepresentation}
QUERIES = ("hf_gpt2", "hf_llama", "convnet_se")
PAIRS = (("hf_lora", "hf_gpt2"), ("hf_mistral", "hf_llama"), ("hf_qwen2", "hf_llama"), ("convnet_se", "convnet"),
         ("gptmini_lora", "gptmini"), ("mobile_ghost", "mobile"))  # fmt: skip
WEIGHTS = "weights.safetensors"


def _pair(fast, slow, runs: int) -> tuple[float, float, bool]:
    """Median seconds of `fast()` and `slow()` alternated, and whether every answer agreed. The cyclic collector is
    off while each runs, as zen runs these paths (`gc_paused` in the code stage, `collector_paused` around the case
    check): with it on, its passes over millions of fresh tuples (4 M instructions of a GPT-2 image) are most of the
    time, and whichever side happens to trigger them looks slow."""
    tf, ts, same = [], [], True
    for _ in range(runs):
        for side, times in ((fast, tf), (slow, ts)):
            gc.collect()
            gc.disable()
            try:
                t = time.perf_counter()
                got = side()
                times.append(time.perf_counter() - t)
            finally:
                gc.enable()
            if side is fast:
                a = got
            else:
                same &= a == got
            del got
    return statistics.median(tf), statistics.median(ts), same


def case_check(cases: Path, runs: int) -> dict:
    files = [(p, cls) for c in sorted(cases.glob("case_*")) for name, cls in RECORDS.items() if (p := c / name).exists()]
    data = [(loads(p.read_bytes()), cls) for p, cls in files]
    hdr = ("kind", "format")
    fast, slow, same = _pair(
        lambda: [native.core.record_ok(d, schema._spec(c, hdr), 0, schema.MAX_DEPTH, schema.MAX_STRING) for d, c in data],
        lambda: [schema._record_ok(c, hdr)(d, 0) for d, c in data],
        runs,
    )
    biggest = max(files, key=lambda f: f[0].stat().st_size)[0]
    d, cls = loads(biggest.read_bytes()), RECORDS[biggest.name]
    bf, bs, bsame = _pair(lambda: native.core.record_ok(d, schema._spec(cls, hdr), 0, schema.MAX_DEPTH, schema.MAX_STRING),
                          lambda: schema._record_ok(cls, hdr)(d, 0), runs)  # fmt: skip
    return {"files": len(files), "mb": sum(p.stat().st_size for p, _ in files) / 1e6, "fast": fast, "slow": slow,
            "same": same and bsame, "biggest": f"{biggest.parent.name}/{biggest.name}",
            "biggest_mb": biggest.stat().st_size / 1e6, "bfast": bf, "bslow": bs}  # fmt: skip


def _pure(fn):
    """`fn` run with the compiled core switched off (its callers test `native.core` at each call)."""

    def run():
        core, native.core = native.core, None
        try:
            return fn()
        finally:
            native.core = core

    return run


def scan(cases: Path, runs: int) -> dict:
    from zen.represent import jsontext

    texts = [p.read_bytes() for c in sorted(cases.glob("case_*")) for n in RECORDS if (p := c / n).exists()]

    def both() -> list:
        return [jsontext._long_number(t) for t in texts]

    fast, slow, same = _pair(both, _pure(both), runs)
    return {"files": len(texts), "mb": sum(map(len, texts)) / 1e6, "fast": fast, "slow": slow, "same": same}


def matching(cases: Path, runs: int) -> dict:
    from zen.attribute.code_views import primary_modules, views
    from zen.attribute.matching import IbssCache
    from zen.attribute.pr_similarity import code_similarity
    from zen.represent import case

    pairs = []
    for q, b in PAIRS:
        dirs = [cases / f"case_{n}" for n in (q, b)]
        if all(d.is_dir() for d in dirs):
            pairs.append([views(case.load_pr(d), primary_modules(case.load_mr(d))) for d in dirs])

    def both() -> list:
        out = []
        for d, g in pairs:
            r = code_similarity(d, g, cache=IbssCache())
            out.append(([(p.recovered.address, p.base.address, p.score, p.attr, p.ibss) for p in r.pairs],
                        [c.address for c in r.added], r.cos, r.optimal_cos))  # fmt: skip
        return out

    both()  # the query views compute their features on first use: once, before either side is timed
    _pure(both)()  # and the reference's first call imports scipy.sparse
    fast, slow, same = _pair(both, _pure(both), runs)
    return {"pairs": len(pairs), "views": sum(len(d) + len(g) for d, g in pairs), "fast": fast, "slow": slow, "same": same}


def rewrite(cases: Path, runs: int) -> dict:
    """The canonical-marshal rewrite of every real code.marshal: the compiled one, and the reference."""
    from zen.cpython.code import canonical_marshal as cm

    blobs = [p.read_bytes() for p in sorted(cases.glob("case_*/code.marshal"))]
    layout = cm._layout((3, 11))

    def compiled() -> list:
        return [native.core.canonical(b, layout, cm.EXPANDED_BUDGET + 4 * len(b), cm.MAX_DEPTH) for b in blobs]

    fast, slow, same = _pair(compiled, lambda: [cm._canonical_pure(b, layout) for b in blobs], runs)
    return {"files": len(blobs), "mb": sum(map(len, blobs)) / 1e6, "fast": fast, "slow": slow, "same": same}


def digests(cases: Path, runs: int) -> dict | None:
    """The file's and every tensor's sha256 of each weights file in DIR: the compiled pair (`hashing.update_both`)
    against hashlib's two streams, which `ZEN_PURE=1` and CPUs without the SHA instructions use."""
    import hashlib

    from zen.evidence import hashing
    from zen.represent.tensorfile import read_tensor_file

    files = sorted(cases.glob(f"case_*/{WEIGHTS}"))
    if not files or hashing.sha256 is hashlib.sha256:
        return None

    def both() -> list:
        return [(tf.sha256, tf.digests) for tf in (read_tensor_file(p, reuse=False) for p in files)]

    def plain() -> list:
        pair = hashing.sha256, hashing.update_both
        hashing.sha256, hashing.update_both = hashlib.sha256, hashing._hashlib_both
        try:
            return both()
        finally:
            hashing.sha256, hashing.update_both = pair

    fast, slow, same = _pair(both, plain, runs)
    return {"files": len(files), "mb": sum(p.stat().st_size for p in files) / 1e6, "fast": fast, "slow": slow,
            "same": same}  # fmt: skip


def decode_image(image: Path, runs: int) -> dict:
    from zen.cpython.interp import Interpreter
    from zen.memory import open_space

    space = open_space(image, None)
    try:
        ip = Interpreter.open(space)
        rt = Runtime(ip)
        codes = [ci for a in rt.code_addrs if (ci := rt.code(a)) is not None]
        ops = ip.P.opcodes
        args = [(ci.code, ci.names, ci.localsplusnames, [], ops, ci.free_base) for ci in codes]
        fast, slow, same = _pair(lambda: [decode(*a) for a in args], lambda: [decode_pure(*a) for a in args], runs)
        n = sum(len(decode(*a)) for a in args)
        # the listings of the same code objects, with their constants' real displays (as `listing_of` makes them)
        work = [(decode(*a), [const_display(rt, c) for c in ci.consts]) for a, ci in zip(args, codes)]
        lfast, lslow, lsame = _pair(lambda: [normalise(i, c) for i, c in work], _pure(lambda: [normalise(i, c) for i, c in work]),
                                    runs)  # fmt: skip
        ofast, oslow, osame = _pair(_read_codes(ip, rt.code_addrs, True), _pure(_read_codes(ip, rt.code_addrs, False)), runs)
    finally:
        space.close()
    return {"codes": len(codes), "instructions": n, "fast": fast, "slow": slow, "same": same, "minor": ip.info.minor,
            "lfast": lfast, "lslow": lslow, "lsame": lsame, "ofast": ofast, "oslow": oslow, "osame": osame}  # fmt: skip


def _read_codes(ip, addrs: list[int], compiled: bool):
    """Every code object read from the image with empty caches (what a recovery's closure walk and the system
    table read): through the compiled object reader (objects.c) and deoptimize, or their Python references."""
    from zen.cpython.interp import Interpreter
    from zen.cpython.readers.code import read_code
    from zen.runtime.errors import ZenError

    reader = Interpreter(ip.space, ip.info, ip.P, ip.limits)
    if not compiled:
        reader.fast = None

    def run() -> list:
        reader.clear_caches()
        out = []
        for a in addrs:
            try:
                out.append(read_code(reader, a))
            except ZenError as exc:
                out.append(str(exc))
        return out

    return run


def words(image: Path, runs: int) -> dict:
    """The census' word searches over IMAGE: every type of the process in the heap's pointer map (what each later
    search reads) and the first, mapping pass over all writable memory."""
    from zen.cpython.heap import Heap
    from zen.cpython.interp import Interpreter
    from zen.memory import open_space
    from zen.memory import scan as sc

    space = open_space(image, None)
    try:
        heap = Heap(Interpreter.open(space))
        types = heap.all_types()
        lo, hi = min(types), max(types)
        pieces, chunks = sc.pieces_of(space, heap._memo["pointer_map"]), sc.writable_chunks(space)

        def search() -> list:
            return [x.tolist() for x in sc.find_u64_in(space, types, pieces)]

        def mapped() -> list:
            got = sc.find_u64_in_mapped(space, types, chunks, lo, hi)
            return [got[0].tolist(), got[1].tolist(), got[2]]

        fast, slow, same = _pair(search, _pure(search), runs)
        mfast, mslow, msame = _pair(mapped, _pure(mapped), runs)
        return {"types": len(types), "mb": sum(p.end - p.start for p in pieces) / 1e6, "fast": fast, "slow": slow,
                "wmb": sum(c.end - c.start for c in chunks) / 1e6, "mfast": mfast, "mslow": mslow,
                "same": same and msame}  # fmt: skip
    finally:
        space.close()


def _cli(args: list, pure: bool) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("ZEN_PURE", None)
    if pure:
        env["ZEN_PURE"] = "1"
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        r, wall, _rss = timed([sys.executable, "-m", "zen", *map(str, args)])
    finally:
        os.environ.clear()
        os.environ.update(old)
    if r.returncode not in (0, 5):
        raise SystemExit(f"zen {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return wall, CPU["last"], r.stdout


def attribute(cases: Path, library: Path, runs: int) -> list[dict]:
    rows = []
    for q in QUERIES:
        qdir = cases / f"case_{q}"
        if not qdir.is_dir():
            continue
        _cli(["attribute", qdir, "--library", library, "--json"], False)  # page cache, digest cache
        w = {True: [], False: []}
        c = {True: [], False: []}
        out = {True: set(), False: set()}
        for _ in range(runs):
            for pure in (False, True):
                wall, cpu, text = _cli(["attribute", qdir, "--library", library, "--json"], pure)
                w[pure].append(wall)
                c[pure].append(cpu)
                out[pure].add(text)
        rows.append({"query": q, "fast": statistics.median(w[False]), "slow": statistics.median(w[True]),
                     "cpu_fast": statistics.median(c[False]), "cpu_slow": statistics.median(c[True]),
                     "same": len(out[False] | out[True]) == 1})  # fmt: skip
    return rows


def recover(image: Path, runs: int) -> dict:
    w = {True: [], False: []}
    c = {True: [], False: []}
    files: dict[bool, list] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            for pure in (False, True):
                case = Path(tmp) / f"case-{int(pure)}-{i}"
                wall, cpu, _ = _cli(["recover", image, "-o", case], pure)
                w[pure].append(wall)
                c[pure].append(cpu)
                kept = {p.name: p.read_bytes() for p in case.iterdir() if p.name not in ("manifest.json", WEIGHTS)}
                files[pure].append({**kept, WEIGHTS: (case / WEIGHTS).stat().st_size})  # each tensor's sha256 in mr.json
    same = all(f == files[False][0] for f in files[False] + files[True])
    return {"fast": statistics.median(w[False]), "slow": statistics.median(w[True]), "cpu_fast": statistics.median(c[False]),
            "cpu_slow": statistics.median(c[True]), "same": same, "mb": image.stat().st_size / 1e6}  # fmt: skip


def _r(slow: float, fast: float) -> str:
    return f"**{slow / fast:.2f}×**" if fast > 0 else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, required=True)
    ap.add_argument("--library", type=Path, required=True)
    ap.add_argument("--image", type=Path, help="a process image (the decoding and recover rows need one)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if native.core is None:
        raise SystemExit(f"the compiled core is not loaded here: {native.why}")
    load = os.getloadavg()[0]
    cc = case_check(args.cases, args.runs)
    sc = scan(args.cases, args.runs)
    mt = matching(args.cases, args.runs)
    dc = decode_image(args.image, args.runs) if args.image else None
    wd = words(args.image, args.runs) if args.image else None
    cm = rewrite(args.cases, args.runs)
    dg = digests(args.cases, args.runs)
    at = attribute(args.cases, args.library, args.runs)
    rc = recover(args.image, max(3, args.runs // 2)) if args.image else None
    image = " --image gpt2.core" if args.image else ""
    lines = [f"One run of `python bench/native.py --cases CASES --library LIB-100{image} --runs {args.runs}` on "
             f"{time.strftime('%Y-%m-%d')}: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"load average {load:.1f} at the start. Compiled: `zen.native._core` (C against the CPython API, built by "
             "install.sh); pure: the same code with `ZEN_PURE=1`, its Python reference. Medians, the two alternated; "
             "CLI rows are whole processes (start to exit, wall and CPU of zen and its children).", "",
             "| path | input | pure s | compiled s | ratio | same answers |", "|---|---|---:|---:|---:|---|"]  # fmt: skip

    def row(path: str, what: str, slow: str, fast: str, ratio: str, same: bool, how: str = "yes") -> None:
        lines.append(f"| {path} | {what} | {slow} | {fast} | {ratio} | {how if same else 'NO'} |")

    row("case check (`schema.bounded_record`)", f"{cc['files']} real mr/pr/ur.json, {cc['mb']:.0f} MB", f"{cc['slow']:.3f}",
        f"{cc['fast']:.3f}", _r(cc["slow"], cc["fast"]), cc["same"])  # fmt: skip
    row("case check, largest file", f"{cc['biggest']} ({cc['biggest_mb']:.0f} MB)", f"{cc['bslow']:.3f}", f"{cc['bfast']:.3f}",
        _r(cc["bslow"], cc["bfast"]), cc["same"])  # fmt: skip
    row("integer scan (`jsontext._long_number`)", f"the same {sc['files']} files, {sc['mb']:.0f} MB", f"{sc['slow']:.3f}",
        f"{sc['fast']:.3f}", _r(sc["slow"], sc["fast"]), sc["same"])  # fmt: skip
    row("code matching (`code_similarity`, greedy + optimal)", f"{mt['pairs']} real fork/base pairs, {mt['views']:,} views",
        f"{mt['slow']:.3f}", f"{mt['fast']:.3f}", _r(mt["slow"], mt["fast"]), mt["same"])  # fmt: skip
    if dc is not None:
        row("bytecode decoding (`instructions.decode`)",
            f"every code object of the image: {dc['codes']:,} ({dc['instructions']:,} instructions, CPython {dc['minor']})",
            f"{dc['slow']:.3f}", f"{dc['fast']:.3f}", _r(dc["slow"], dc["fast"]), dc["same"])  # fmt: skip
        row("listing normalisation (`listing.normalise`)", "the same code objects' listings, constants shown",
            f"{dc['lslow']:.3f}", f"{dc['lfast']:.3f}", _r(dc["lslow"], dc["lfast"]), dc["lsame"])  # fmt: skip
        row("object reading (`read_code` over `Interpreter.fast`, `deoptimize`)",
            "the same code objects read with empty caches: headers, names, constants, line tables, bytecode",
            f"{dc['oslow']:.3f}", f"{dc['ofast']:.3f}", _r(dc["oslow"], dc["ofast"]), dc["osame"])  # fmt: skip
    if wd is not None:
        row("word search (`scan.find_u64_in`)", f"{wd['types']:,} type addresses in the heap's pointer map, {wd['mb']:,.0f} MB",
            f"{wd['slow']:.3f}", f"{wd['fast']:.3f}", _r(wd["slow"], wd["fast"]), wd["same"])  # fmt: skip
        row("mapping pass (`scan.find_u64_in_mapped`)", f"the same types, writable memory, {wd['wmb']:,.0f} MB",
            f"{wd['mslow']:.3f}", f"{wd['mfast']:.3f}", _r(wd["mslow"], wd["mfast"]), wd["same"])  # fmt: skip
    row("canonical-marshal rewrite (`canonical_marshal.canonical`)", f"{cm['files']} real code.marshal, {cm['mb']:.0f} MB",
        f"{cm['slow']:.3f}", f"{cm['fast']:.3f}", _r(cm["slow"], cm["fast"]), cm["same"])  # fmt: skip
    if dg is not None:
        row("tensor digests (`hashing.update_both` in `tensorfile.read_tensor_file`)",
            f"{dg['files']} real weights.safetensors, {dg['mb']:,.0f} MB, page cache warm", f"{dg['slow']:.3f}",
            f"{dg['fast']:.3f}", _r(dg["slow"], dg["fast"]), dg["same"], "yes (every digest equal)")  # fmt: skip
    for r in at:
        row("`zen attribute --json`, 100 real entries", r["query"], f"{r['slow']:.2f} (CPU {r['cpu_slow']:.2f})",
            f"{r['fast']:.2f} (CPU {r['cpu_fast']:.2f})", _r(r["slow"], r["fast"]), r["same"])  # fmt: skip
    if rc is not None:
        row("`zen recover` (warm page cache)", f"gpt2 image, {rc['mb']:,.0f} MB", f"{rc['slow']:.2f} (CPU {rc['cpu_slow']:.2f})",
            f"{rc['fast']:.2f} (CPU {rc['cpu_fast']:.2f})", _r(rc["slow"], rc["fast"]), rc["same"],
            "yes (case files byte-identical)")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_sections({SECTION: text})
    same = [cc["same"], sc["same"], mt["same"], cm["same"], *(r["same"] for r in at)]
    same += [x["same"] for x in (dc, wd, rc, dg) if x is not None] + ([dc["lsame"], dc["osame"]] if dc is not None else [])
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
