"""`zen recover`: image (or live PID) -> case directory with the model's MR and weights.

Pipeline: open the evidence, find the interpreter, pick the front end by what the image holds
(PyTorch, or Keras on TensorFlow: `frontends/keras/stage.py`), load its layout profile, find every
model and pick the root, build the MR, stream every readable tensor into weights.safetensors,
recover candidate inputs (PyTorch), the code stage (`code_stage.py`), mr.json and the manifest, the
same case contract for both front ends. The image's sha256 (for the record) and the tensor files
are made by forked children while the analysis runs (`jobs.py`); the analysis itself stays in
this process, which has the highest priority: it is the longest chain of work.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from zen import __version__
from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import dict_get
from zen.cpython.readers.modules import read_module
from zen.frontends.common import NoModelFound, references
from zen.frontends.pytorch.modules import MODULE_BASE, TENSOR_BASE, ModuleIndex
from zen.frontends.pytorch.mr import build_mr, root_record, summarize
from zen.frontends.pytorch.profile import load_torch_profile
from zen.frontends.pytorch.tensors import TensorReader
from zen.frontends.pytorch.torchscript.models import is_scripted, script_mr, script_roots
from zen.memory import open_space, require_image_file
from zen.memory.space import RESIDENT_SOFT_LIMIT
from zen.recover import deployment, evidence_record
from zen.recover.jobs import TensorFiles
from zen.represent import case, textio
from zen.runtime import collector
from zen.runtime.errors import ObjectError, TruncatedImage, ZenError

Progress = Callable[[str, int, int], None]
READ = ("ok", "composite")  # tensor statuses of state that was read (composite: in its inner tensors)


@dataclass
class RecoverResult:
    case_dir: Path
    manifest: dict
    mr: object
    status: str
    problems: list[str] = field(default_factory=list)


def torch_version(ip: Interpreter, heap: Heap) -> str:
    mods = heap.sys_modules()
    if "torch" not in mods:
        raise NoModelFound("no PyTorch models found: torch is not imported in this process",
                           "zen recovers PyTorch models; `zen info` shows what the process has loaded")  # fmt: skip
    # `torch.__version__` first; its module dict is large (1,500 names), so in an image taken while
    # the machine ran (LiME, AVML: pages can move during acquisition) it may be damaged while the
    # small `torch.version` module still reads.
    errors = []
    for name in ("torch", "torch.version"):
        if name not in mods:
            continue
        try:
            v = dict_get(ip, read_module(ip, mods[name]).dict, "__version__")
        except ObjectError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if v is not None:
            return str(ip.value(v))
    raise ZenError(
        "torch is imported but its __version__ is not readable in the image" + (f" ({'; '.join(errors)})" if errors else ""),
        "the image may be damaged where torch's module dict lies (smear in a live acquisition?)",
    )


def select_root(roots, choice: str | None):
    if choice is None:
        return roots[0], "rank 1 (served by running code)" if roots[0].served_by else "rank 1 (most likely model)"
    c = choice.strip()
    if c.startswith("#") and c[1:].isdigit() and 1 <= int(c[1:]) <= len(roots):
        return roots[int(c[1:]) - 1], f"--model {c}"
    for r in roots:
        if (
            c.lower() in (r.address, hex(int(r.address, 16)))
            or c in r.referenced_from
            or any(x.endswith("." + c) or x.endswith(": " + c) for x in r.referenced_from)
        ):
            return r, f"--model {c}"
    return None, c


def recover(
    image: Path | None,
    pid: int | None,
    out: Path,
    *,
    model: str | None = None,
    progress: Progress | None = None,
    symbols: list[Path] | None = None,
    limits: list[str] | None = None,
    gpu: list[Path] | None = None,
    rehash: bool = False,
    offload: list[Path] | None = None,
    force: bool = False,
) -> RecoverResult:
    """Recover the model of an image (or live PID) into the case directory `out`.

    `limits` are `NAME=VALUE` overrides of the bounds in `zen.recover.limits` (parsed before anything runs);
    `gpu` names GPU cores of the process (tensors on cuda:N are read from them); `offload`, files or folders holding
    the data of tensors accelerate offloaded to disk (read only for tensors whose hook names that file); `force`
    replaces an existing case (else refused: a case is evidence)."""
    from zen.recover import limits as zl

    bounds = zl.parse(limits)
    t0 = time.perf_counter()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for f in [image, *(gpu or [])] if image is not None else list(gpu or []):
        require_image_file(f)  # before anything is created: a FIFO or device is refused cleanly
    for f in (f for f in offload or [] if not (Path(f).is_dir() or Path(f).is_file())):
        raise ZenError(f"--offload {f}: no such file or directory", "give the folder accelerate offloaded to, or a file")
    created = not Path(out).exists()
    out = case.prepare(out, force=force)  # an existing case is replaced only with force
    try:
        with collector.paused():  # the census and model stage too, not only the code stage (`collector`)
            return _recover(image, pid, out, model, progress, symbols, t0, started, bounds, list(gpu or []), rehash,
                            offload)  # fmt: skip
    except BaseException:
        case.discard(out, remove_dir=created)  # a failed run leaves no half-written case behind
        raise


def _recover(image, pid, out, model, progress, symbols, t0, started, bounds, gpu, rehash, offload=None) -> RecoverResult:
    # The image (and each GPU image) is hashed while it is analysed (`image_digest`: a forked child, else a thread),
    # started first; a digest computed before for the unchanged file is reused (`digest_cache`).
    hasher = evidence_record.Digests(image, gpu, rehash, progress)
    try:
        space = open_space(image, pid, symbols=symbols, gpu=gpu, gpu_limits=bounds[2])
    except BaseException:
        hasher.cancel()
        raise
    timings: dict[str, float] = {}
    if getattr(space, "system", None) is not None:
        timings["open_image"] = time.perf_counter() - t0
    tensors_out: TensorFiles | None = None
    written: dict = {}  # the code stage's files still being written (pr.json): waited for on every way out
    try:
        ip = Interpreter.open(space, limits=bounds[0])
        heap = Heap(ip)
        if _framework(ip, heap, model) == "keras":
            return _recover_keras(out, space, image, pid, hasher, ip, heap, model, progress, t0, started, timings, bounds)
        tv = torch_version(ip, heap)
        tprof = load_torch_profile(".".join(tv.split("+")[0].split(".")[:2]), tv)
        reader = TensorReader(ip, tprof)
        timings["interpreter"] = time.perf_counter() - t0
        t = time.perf_counter()
        # One pass over memory finds both the modules and every tensor object (inputs need those).
        tensor_types = {ti.addr for ti in heap.subclasses_of(TENSOR_BASE)}
        module_types = {ti.addr for ti in heap.subclasses_of(MODULE_BASE)}
        code_types = {ip.wk.types["function"], ip.wk.types["code"]}
        from zen.frontends.pytorch.forms import ort_session_types, ort_sessions

        ort_types = ort_session_types(heap)
        found = heap.instances_of_types(tensor_types | module_types | code_types | ort_types)
        sessions = ort_sessions(ip, found, ort_types)
        index = ModuleIndex(ip, heap, found)
        root_addrs = index.roots()
        if not root_addrs:
            deployment.no_model(space, sessions, "torch is loaded but no nn.Module instance is alive")
        refs = references(ip, heap, set(root_addrs))
        roots = [root_record(index, reader, a, refs.get(a, [])) for a in root_addrs]
        deployment.served(ip, heap, index, roots)
        scripted = deployment.scripted(ip, index, reader, tprof, roots, refs)
        if scripted is not None:
            roots = script_roots(scripted, roots, refs)
        roots.sort(key=lambda r: (not r.served_by, not r.referenced_from, -r.parameter_elements, -r.modules, r.address))
        for i, r in enumerate(roots, 1):
            r.rank = i
        chosen, how = select_root(roots, model)
        if chosen is None:
            sub = _submodule_root(index, reader, model, refs)
            if sub is None:
                raise ZenError(
                    f"--model {model!r} matches no model root", "use a root's address, #RANK, or a name from `referenced_from`"
                )
            chosen, how = sub, f"--model {model}"
        if scripted is not None and int(chosen.address, 16) in scripted.objects:  # TorchScript: the C++ tree
            mr, slots, deployed = script_mr(ip, scripted, chosen, roots, bounds[1], heap.sys_modules())
        else:
            chosen, how, deployed = deployment.unwrap_form(ip, index, reader, chosen, how, refs)
            mr, slots = build_mr(ip, index, reader, chosen, roots, tensor_types, bounds[1])
            deployment.offloaded(ip, reader, index, mr, slots, space, offload)
        if sessions and not mr.tensors and model is None:  # a leftover module (an exporter's fx graph) is not the model
            deployment.no_model(space, sessions, f"the only nn.Module roots hold no tensors (the first: {chosen.cls})")
        mr.problems += [f"an ONNX Runtime session ({s}) holds a model in C++ state zen does not read" for s in sessions]
        mr.deployment = deployed
        if scripted is not None and is_scripted(ip, index, int(chosen.address, 16)):
            mr.problems += scripted.problems  # why a scripted root's C++ module was not read (its audit names it)
        if deployed.get("form") == "torchscript":
            extra: list = []  # a TorchScript module's state is its C++ tree, read above; no Python state to encode
        else:
            deployment.audit_form(ip, reader, index, mr, slots, tensor_types)
            from zen.frontends.pytorch.state import module_states

            extra = module_states(ip, index, reader, mr, slots, tensor_types)
        from zen.frontends.pytorch.forms import eager_state

        eager_state(mr)
        space.release(unless_under=RESIDENT_SOFT_LIMIT)  # the code stage reads the same heap pages again
        timings["model"] = time.perf_counter() - t
        problems = list(dict.fromkeys([*space.problems, *mr.problems, *heap.problems]))
        timings["weights"] = 0.0  # the writer's own time, set when it is joined (it overlaps what follows)
        tensors_out = TensorFiles(out, reader, slots, extra, progress, "pt")
        t = time.perf_counter()
        from zen.frontends.pytorch.inputs import recover_inputs

        tensors = {t: a for t, a in found.items() if t in tensor_types}
        # The stages after the weights degrade alone: a corrupt object there is a problem, and the
        # model and its weights (already written) stay a sound, partial case.
        try:
            mr.inputs = recover_inputs(ip, reader, mr, slots, tensors, out / case.INPUTS)
        except ZenError as exc:
            problems.append(f"candidate inputs not recovered: {exc}")
        timings["inputs"] = time.perf_counter() - t
        from zen.frontends.pytorch.dataflow import dataflow_edges

        try:
            if deployed.get("form") != "torchscript":  # TorchScript's forward is a C++ graph, not bytecode
                mr.graph.update(dataflow_edges(ip, index, mr))
        except ZenError as exc:
            problems.append(f"data-flow edges not recovered: {exc}")
        written = _code_stage(out, ip, heap, found, index, mr, space, problems, timings)
        digests = tensors_out.result()  # the tensors' sha256 go into mr.json
        timings["weights"] = tensors_out.seconds
        mr.summary = summarize(mr)
        textio.write_text(out / case.MR_FILE, mr.dumps())
    except BaseException as exc:
        if tensors_out is not None:
            tensors_out.cancel()
        _join(written)
        hasher.cancel()
        space.close()
        cut = space.truncation()
        if cut and isinstance(exc, ZenError) and not isinstance(exc, TruncatedImage) and exc.exit_code in (2, 3, 6):
            raise TruncatedImage(f"{cut}; what is left does not hold the model ({exc.message})",
                                 "acquire the image again, or find a complete copy") from None  # fmt: skip
        raise
    sections = {"torch": {"version": tv}}
    return _finish(
        out,
        space,
        image,
        pid,
        hasher,
        ip,
        mr,
        slots,
        extra,
        chosen,
        how,
        roots,
        problems,
        timings,
        t0,
        started,
        sections,
        {"cpython": ip.P.source, "torch": tprof.source},
        {**digests, **written},
        bounds,
    )


def _framework(ip: Interpreter, heap: Heap, model: str | None) -> str:
    """Which front end reads this image: "keras" when TensorFlow/Keras is loaded and torch is not (or when
    `--model` names a Keras layer, or torch holds no module while Keras has layers), else "pytorch"."""
    from zen.frontends.keras.presence import has_tensorflow

    if not has_tensorflow(heap):
        return "pytorch"
    from zen.frontends.keras import stage

    if "torch" not in heap.sys_modules():
        return "keras"
    if model is not None and stage.keras_roots_match(ip, heap, model):
        return "keras"
    counts = heap.census([t.addr for t in heap.subclasses_of(MODULE_BASE)])
    return "pytorch" if any(counts.values()) else "keras"


def _recover_keras(out, space, image, pid, hasher, ip, heap, model, progress, t0, started, timings, bounds) -> RecoverResult:
    """The Keras front end's stage, then the same case files as for PyTorch (weights keyed by variable path)."""
    from zen.frontends.keras.stage import keras_model

    timings["interpreter"] = time.perf_counter() - t0
    t = time.perf_counter()
    km = keras_model(ip, heap, model, space.description)
    space.release(unless_under=RESIDENT_SOFT_LIMIT)  # the code stage reads the same heap pages again
    timings["model"] = time.perf_counter() - t
    mr = km.mr
    problems = list(dict.fromkeys([*space.problems, *mr.problems, *heap.problems]))
    timings["weights"] = 0.0  # the writer's own time, set when it is joined
    tensors_out = TensorFiles(out, km.reader, km.slots, km.extra, progress, "tf")
    written: dict = {}
    try:
        written = _code_stage(out, ip, heap, km.found, km.index, mr, space, problems, timings)
        digests = tensors_out.result()
    except BaseException:
        tensors_out.cancel()
        _join(written)
        raise
    timings["weights"] = tensors_out.seconds
    mr.summary["status"] = dict(sorted(Counter(t.status for t in mr.tensors).items()))
    textio.write_text(out / case.MR_FILE, mr.dumps())
    sections = {**km.versions, "framework": "keras"}
    profiles = {"cpython": ip.P.source, "tf": km.profile.source if km.profile else None}
    return _finish(
        out,
        space,
        image,
        pid,
        hasher,
        ip,
        mr,
        km.slots,
        km.extra,
        km.chosen,
        km.how,
        mr.roots,
        problems,
        timings,
        t0,
        started,
        sections,
        profiles,
        {**digests, **written},
        bounds,
    )


def _code_stage(out, ip, heap, found, index, mr, space, problems, timings) -> dict:
    """The code stage's files; returns the digests of those it hashes from memory (none where it failed)."""
    t = time.perf_counter()
    written: dict = {}
    try:
        written = _write_code(out, ip, heap, found, index, mr, space)
    except ZenError as exc:
        for name in (case.PR_FILE, case.UR_FILE, case.CODE_FILE, case.REQUIREMENTS):
            (out / name).unlink(missing_ok=True)
        problems.append(f"the model's code was not recovered (no pr.json, ur.json, code.marshal): {exc}")
    timings["code"] = time.perf_counter() - t
    return written


def _finish(out, space, image, pid, hasher, ip, mr, slots, extra, chosen, how, roots, problems, timings, t0, started,
            sections: dict, profiles: dict, digests: dict, bounds) -> RecoverResult:  # fmt: skip
    """Status, evidence and manifest: the same for every front end. `digests`: sha256 of the weight files, taken
    while they were written (hashing them again would read GBs twice), and of pr.json, from the bytes written (a
    `hashing.Meanwhile`: its threads may still be writing and hashing it, waited for first).
    `bounds`: the limits in effect (`--limit`), recorded: a case follows from the image and them."""
    from zen.recover.limits import in_effect

    try:
        digests = {n: _hex(d) for n, d in digests.items()}  # files still being written and hashed: done here
        status = "partial" if problems or any(s.record.status not in READ for s in slots) else "complete"
        problems += [f"extra tensor {s.key}: {s.record.status} ({s.record.note})" for s in extra if s.record.status != "ok"]
        evidence = evidence_record.evidence(space, image, pid, hasher)
        timings.update(hasher.timings())
    finally:
        space.close()
    names = (case.MR_FILE, case.WEIGHTS, case.INPUTS, case.PR_FILE, case.UR_FILE, case.CODE_FILE, case.REQUIREMENTS, case.EXTRA)
    files = {n: _hex(digests.get(n)) or case.file_sha256(out / n) for n in names if (out / n).exists()}
    manifest = {
        "format": case.CASE_FORMAT,
        "kind": "zen-case",
        "tool": {"name": "zen", "version": __version__},
        "evidence": evidence,
        "python": {
            "version": ip.info.version,
            "how": ip.info.how,
            "static_build": ip.info.static_build,
            "debug_offsets": ip.info.debug_offsets,
            "profile_why": ip.P.why,  # which layout (patch-release variant) was used, and why
        },
        **sections,
        "profiles": profiles,
        "model": {"root": chosen.address, "class": chosen.cls, "selected_by": how, "roots_found": len(roots)},
        "status": status,
        "problems": problems + [f"{s.key}: {s.record.status} ({s.record.note})" for s in slots if s.record.status not in READ],
        "files": files,
        "limits": in_effect(bounds),
        "run": {"started": started, "seconds": {k: round(v, 3) for k, v in timings.items()},
                "total_seconds": round(time.perf_counter() - t0, 3)},
    }  # fmt: skip
    case.write_json(out / case.MANIFEST, manifest)
    return RecoverResult(out, manifest, mr, status, manifest["problems"])


def _join(written: dict) -> None:
    """Wait for the files still being written (`hashing.Meanwhile`), so that a failing run, which may leave by
    os._exit, leaves no file half-written behind it."""
    for d in written.values():
        if hasattr(d, "join"):
            d.join()


def _hex(digest) -> str | None:
    """A digest as hex: given, or from the thread computing it (`hashing.Meanwhile`)."""
    return digest.hexdigest() if hasattr(digest, "hexdigest") else digest


def _write_code(out: Path, ip, heap, found, index, mr, space) -> dict:
    """PR, UR, the rebuilt model code and requirements.txt (`code_stage.py`)."""
    from zen.recover.code_stage import write_code

    return write_code(out, ip, heap, found, index, mr, space)


def _submodule_root(index, reader, choice, refs):
    """Let --model name any module by address (e.g. a backbone inside a bigger model)."""
    try:
        addr = int(choice, 16)
    except (TypeError, ValueError):
        return None
    if addr not in index.nodes:
        return None
    return root_record(index, reader, addr, refs.get(addr, []))
