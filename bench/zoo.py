"""Recovery and reuse across the real model zoos (issue 15): torchvision, timm, transformers.

    python bench/zoo.py [--only GLOB ...] [--limit N] [--fresh] [--work DIR] [--out bench/results/zoo.md]

Every model is deployed in its own process (`python bench/zoo.py deploy NAME OUTDIR`: fixed seed,
random init, eval mode, one forward on a fixed input; the process writes its ground truth: model
id, a sha256 per state_dict tensor, the input and output), imaged (`zen acquire --lean`), recovered,
compared tensor by tensor with that truth, added to a library, rebuilt twice (`zen reuse --base`
itself, and self-contained) and each rebuild run in a fresh process (`python bench/zoo.py check`)
on the recorded input: outputs must be bit-identical (`torch.equal`). At the end every model is
attributed against the library of all models run (it must attribute to itself, UR >= 0.99; the
runner-up margin is reported). Results are kept per model in WORK/state.json (the sweep resumes
where it stopped; `--fresh` starts over) and written to bench/results/zoo.md.

torchvision and timm come from a side directory (`zoo_site()`), not from the project's venv: PyPI's
torchvision 0.28.0 (the release for torch 2.13) is a CUDA build whose C++ ops need libtorch_cuda;
with the CPU torch its import fails, and an installed-but-broken torchvision also breaks
transformers' imports. The side directory is installed with `pip --no-deps --target` (pip never
resolves torch) and its Python code is used with the C++ ops declared and given plain-torch CPU kernels for the
two the detection models call (`zoo_ops.py`: nms, roi_align).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def zoo_site() -> Path:
    """Where torchvision/timm are installed for zoo processes (outside the repository)."""
    env = os.environ.get("ZEN_ZOO_SITE")
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zen" / "zoo-site"
    return Path(env) if env else base


def ensure_site() -> Path | None:
    """Install torchvision and timm into zoo_site() once (no dependencies: torch stays the CPU build)."""
    site = zoo_site()
    if (site / "torchvision").is_dir() and (site / "timm").is_dir():
        return site
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                          f"torchvision=={TV_VERSION}", f"timm=={TIMM_VERSION}"], capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    return site if res.returncode == 0 and (site / "timm").is_dir() else None


def prepare(site: str | None) -> None:
    """Make torchvision/timm importable in this process (see the module docstring)."""
    if not site:
        return
    sys.path.insert(0, site)
    import torch

    try:
        torch.ops.load_library(str(Path(site) / "torchvision" / "_C.so"))
    except (OSError, RuntimeError):  # CUDA build: declare the ops torchvision registers fakes for,
        from zoo_ops import register  # with plain-torch CPU kernels for the detection models

        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        register(lib)
        _KEEP.append(lib)
        import torchvision.extension
        from zoo_ops import has_ops

        torchvision.extension._has_ops = has_ops


_KEEP: list = []

from zoo_models import FORKS, OWN_CODE, build, catalogue, library_of  # noqa: E402
from zoo_report import LIBS, TIMM_VERSION, TV_VERSION, _verdict, write_md  # noqa: E402, F401


def tensor_sha(t) -> str:
    """sha256 of a tensor's bytes in C order, for any dtype."""
    import torch

    flat = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"").hexdigest()


STRUCTURAL = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


def canon(v: Any, seen: frozenset = frozenset(), depth: int = 0) -> str:
    """A description of a value that two processes can compare: partials by function, arguments and
    keywords, classes and functions by qualified name (module names differ between a base and a
    synthesised rebuild), enums by member, instances by their attributes, containers by items."""
    import enum
    import functools
    import types

    import torch

    if depth > 10:
        return "..."
    if type(v).__name__ == "Unrecovered":  # zen's placeholder: any use raises
        return "<unrecovered>"
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)) or v is ...:
        return repr(v)
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, torch.Tensor):
        return f"tensor{tuple(v.shape)}:{v.dtype}"
    if isinstance(v, torch.nn.Module):
        return f"<module {type(v).__qualname__}>"
    if id(v) in seen:
        return "<cycle>"
    seen = seen | {id(v)}
    c = functools.partial(canon, seen=seen, depth=depth + 1)
    if isinstance(v, functools.partial):
        return f"partial({c(v.func)}, {c(v.args)}, {c(v.keywords)}, {c(vars(v))})"
    if isinstance(v, type):
        return f"class {v.__qualname__}"
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
        return f"function {v.__qualname__}"
    if isinstance(v, types.MethodType):
        return f"method {c(v.__self__)}.{v.__func__.__name__}"
    if isinstance(v, slice):
        return f"slice({c(v.start)}, {c(v.stop)}, {c(v.step)})"
    if isinstance(v, dict):
        return f"{type(v).__qualname__}{{" + ", ".join(f"{c(k)}: {c(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return f"{type(v).__qualname__}[" + ", ".join(c(x) for x in v) + "]"
    if isinstance(v, (set, frozenset)):
        return f"{type(v).__qualname__}{{" + ", ".join(sorted(c(x) for x in v)) + "}"
    d = getattr(v, "__dict__", None)
    if isinstance(d, dict):
        return f"{type(v).__qualname__}(" + ", ".join(f"{k}={c(x)}" for k, x in sorted(d.items())) + ")"
    return f"<{type(v).__qualname__}>"


def value_signature(model) -> dict[str, str]:
    """sha256 of `canon` of every plain attribute of every module (hooks and structure aside)."""
    out = {}
    for path, m in model.named_modules(remove_duplicate=False):
        for k, v in vars(m).items():
            if k in STRUCTURAL or "hooks" in k:
                continue
            out[f"{path}.{k}" if path else k] = hashlib.sha256(canon(v).encode()).hexdigest()[:16]
    return out


def deploy(name: str, outdir: str, site: str | None) -> None:
    prepare(site)
    import torch

    from zen.reuse.runtime import first_tensor

    torch.manual_seed(0)
    torch.set_num_threads(1)
    out = Path(outdir)
    model, args, kwargs = build(name, out)
    n = sum(p.numel() for p in model.parameters())
    if n > int(os.environ.get("ZEN_ZOO_MAX_PARAMS", "0") or 0) > 0:
        print(f"SKIP {n}", flush=True)
        return
    model.eval()
    with torch.no_grad():
        y = first_tensor(model(*args, **kwargs))
    torch.save({"args": args, "kwargs": kwargs, "output": y}, out / "io.pt")
    state = {k: tensor_sha(v) for k, v in model.state_dict().items()}
    (out / "values.json").write_text(json.dumps(value_signature(model)))
    truth = {"pid": os.getpid(), "id": id(model), "class": f"{type(model).__module__}.{type(model).__qualname__}",
             "modules": sum(1 for _ in model.modules()), "parameters": sum(p.numel() for p in model.parameters()),
             "state": state}  # fmt: skip
    (out / "truth.json").write_text(json.dumps(truth))
    print("READY", flush=True)
    sys.stdin.read()  # keep the model alive until the caller has imaged this process


# -- the fresh process that runs a rebuild ----------------------------------------------------------
def check(pkg: str, io_path: str, out_path: str, site: str | None) -> None:
    prepare(site)
    if os.environ.get("ZEN_ZOO_BASE_CODE"):  # the base's own module, for `--base` rebuilds of OWN_CODE models
        sys.path.insert(0, os.environ["ZEN_ZOO_BASE_CODE"])
    import torch

    from zen.reuse.runtime import first_tensor, import_package

    torch.set_num_threads(1)
    before = set(sys.modules)
    model, report = import_package(pkg).load_with_report()
    deployed = Path(io_path).with_name("values.json")
    values = json.loads(deployed.read_text()) if deployed.is_file() else {}
    mine = value_signature(model)
    io = torch.load(io_path)
    with torch.no_grad():
        got = first_tensor(model(*io["args"], **io["kwargs"]))
    want = io["output"]
    res = {"equal": bool(torch.equal(got, want)), "class": f"{type(model).__module__}.{type(model).__qualname__}",
           "training": model.training, "report": report,
           "imported": sorted({m.split(".")[0] for m in set(sys.modules) - before} & set(LIBS)),
           "values_checked": len(values), "values_differ": sorted(k for k in values if mine.get(k) != values[k])}  # fmt: skip
    Path(out_path).write_text(json.dumps(res))


# -- one model, end to end (also used by tests/test_zoo.py) -----------------------------------------
def zen(*args: Any, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env)  # fmt: skip


def _python(args: list, site: str | None, timeout: float = 900, code: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ZEN_ZOO_BASE_CODE")}
    if code is not None:
        env["ZEN_ZOO_BASE_CODE"] = str(code)
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), *map(str, args), *([site] if site else [])],
                          capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip


def _fail(res: subprocess.CompletedProcess) -> str:
    lines = [x for x in (res.stderr or res.stdout or "").strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else f"exit {res.returncode}"


def image_model(name: str, work: Path, site: str | None, timeout: float = 900) -> tuple[Path | None, dict, str | None]:
    """Deploy `name` in its own process and image it: (image, truth, error)."""
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [sys.executable, str(Path(__file__).resolve()), "deploy", name, str(out), *([site] if site else [])]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        if line.startswith("SKIP "):
            n = int(line.split()[1])
            return None, {"parameters": n}, f"skipped: {n / 1e6:.0f} M parameters, over --max-params"
        if line.strip() != "READY":
            proc.kill()
            err = proc.stderr.read()
            return None, {}, "deploy: " + ([x for x in err.splitlines() if x.strip()] or ["no output"])[-1][:300]
        truth = json.loads((out / "truth.json").read_text())
        image = work / f"{name}.core"
        res = zen("acquire", "--pid", proc.pid, "-o", image, "--lean", timeout=timeout)
        if res.returncode != 0:
            return None, truth, "acquire: " + _fail(res)
        return image, truth, None
    finally:
        from zen.runtime.childproc import stop_process  # (main() put src/ on sys.path)

        stop_process(proc)


def compare_weights(case_dir: Path, truth: dict) -> tuple[int, int]:
    """(tensors bit-exact, tensors in the deployed state_dict)."""
    from safetensors.torch import load_file

    p = case_dir / "weights.safetensors"
    got = load_file(str(p)) if p.is_file() else {}
    return sum(1 for k, h in truth["state"].items() if k in got and tensor_sha(got[k]) == h), len(truth["state"])


def rebuild_and_check(case_dir: Path, work: Path, label: str, base: str | None, library: Path, site: str | None) -> dict:
    """`zen reuse` (with `--base` or self-contained) and a fresh-process run of the package."""
    pkg = work / f"pkg_{label}".replace("-", "_")  # a package name is an identifier
    t0 = time.perf_counter()
    args = ["reuse", case_dir, "-o", pkg] + (["--base", base, "--library", library] if base else [])
    res = zen(*args)
    out: dict[str, Any] = {"equal": False}
    if res.returncode != 0:
        out["error"] = "reuse: " + _fail(res)
        return out
    manifest = json.loads((pkg / "reuse.json").read_text())
    out["problems"] = out["manifest_problems"] = manifest.get("problems", [])
    # both rebuilds may import the installed library for code that is not the model's (helpers,
    # enums): as transformers is installed here, torchvision/timm are put on the path for both
    outdir = case_dir.parent / case_dir.name.removeprefix("case_")
    own = outdir if base and outdir.name in OWN_CODE else None
    chk = _python(["check", pkg, outdir / "io.pt", work / f"{label}.json"], site, code=own)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    if chk.returncode != 0:
        out["error"] = "load/run: " + _fail(chk)
        return out
    r = json.loads((work / f"{label}.json").read_text())
    graph, patch = r["report"]["graph"], r["report"]["patch"]
    out.update(equal=r["equal"], cls=r["class"], imported=r["imported"], unrecovered=graph["unrecovered"],
               warnings=patch["warnings"][:20], problems=r["report"].get("problems", out["problems"]),
               values_checked=r.get("values_checked"), values_differ=r.get("values_differ"),
               mro_mismatch=patch.get("mro_mismatch", []), rebased=patch.get("rebased", []))  # fmt: skip
    return out


def run_model(name: str, work: Path, library: Path, site: str | None, base: str | None = None) -> dict:
    """Deploy, image, recover, compare weights, add to `library` under `name`, rebuild on `base`
    (default: the model itself) and self-contained. The image is deleted before returning."""
    import shutil

    row: dict[str, Any] = {"name": name, "library": library_of(name)}
    t0 = time.perf_counter()
    image, truth, err = image_model(name, work, site)
    row["deploy_s"] = round(time.perf_counter() - t0, 2)
    row.update(parameters=truth.get("parameters"), modules_truth=truth.get("modules"), cls_truth=truth.get("class"))
    if image is None:
        row["error"] = err
        return row
    case_dir = work / f"case_{name}"
    try:
        t0 = time.perf_counter()
        res = zen("recover", image, "-o", case_dir, "--model", hex(truth["id"]))
        row["recover_s"] = round(time.perf_counter() - t0, 2)
        row["image_mb"] = round(image.stat().st_size / 2**20)
    finally:
        image.unlink(missing_ok=True)
    if res.returncode not in (0, 5):
        row["error"] = "recover: " + _fail(res)
        return row
    mr = json.loads((case_dir / "mr.json").read_text())
    pr = json.loads((case_dir / "pr.json").read_text())
    row["modules"] = len(mr.get("modules", []))
    row["code_objects"] = len(pr.get("codes", []))
    row["exact"], row["tensors"] = compare_weights(case_dir, truth)
    add = zen("library", "add", case_dir, "--name", name, "--library", library, "--replace")
    if add.returncode != 0:
        row["error"] = "library add: " + _fail(add)
        return row
    row["base"] = base or name
    row["reuse_base"] = rebuild_and_check(case_dir, work, f"{name}_base", base or name, library, site)
    row["reuse_sc"] = rebuild_and_check(case_dir, work, f"{name}_sc", None, library, site)
    for label in ("base", "sc"):
        shutil.rmtree(work / f"pkg_{name}_{label}".replace("-", "_"), ignore_errors=True)
    return row


def attribute(case_dir: Path, library: Path) -> dict:
    res = zen("attribute", case_dir, "--library", library, "--json")
    if res.returncode != 0:
        return {"error": _fail(res)}
    d = json.loads(res.stdout)
    c = d.get("candidates") or []
    second = c[1] if len(c) > 1 else {}
    out = {"attributed": d.get("attributed"), "ur": c[0]["ur"] if c else None, "top": c[0]["name"] if c else None,
           "runner_up": second.get("name"), "margin": round(c[0]["ur"] - second["ur"], 4) if second else None}  # fmt: skip
    name = case_dir.name.removeprefix("case_")
    if out["attributed"] and out["attributed"] != name:
        out["twin"] = twin(case_dir, case_dir.parent / f"case_{out['attributed']}")
    return out


def twin(a: Path, b: Path) -> str | None:
    """Why two cases are the same deployed model (same root class, same weights file, the same
    hyper-parameters), or None. Two catalogue names can build one model: timm's vit_tiny_patch16_224
    and deit_tiny_patch16_224 are the same class and configuration, seeded alike."""
    try:
        ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
        ra, rb = (json.loads((p / "mr.json").read_text()) for p in (a, b))
    except (OSError, ValueError):
        return None
    sha = ma["files"].get("weights.safetensors")
    if not sha or sha != mb["files"].get("weights.safetensors") or ma["model"]["class"] != mb["model"]["class"]:
        return None

    def hyper(mr: dict) -> list:
        return [(m["path"], m.get("cls_module"), m.get("cls_qualname"), m.get("hyperparameters")) for m in mr["modules"]]

    if hyper(ra) != hyper(rb):
        return None
    return f"same class {ma['model']['class']}, same hyper-parameters, same weights (sha256 {sha[:12]}...)"


# -- the sweep ------------------------------------------------------------------------------------
def _attributions(path: Path, update: dict | None = None) -> dict:
    """The attribution file, read (and updated) under an exclusive lock."""
    import fcntl

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.is_file() else {}
        if update:
            data.update(update)
            path.write_text(json.dumps(data, indent=1))
        return data


def main() -> None:
    import platform
    import shutil

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    ap.add_argument("--work", type=Path, default=cache / "zen" / "zoo-bench")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "zoo.md")
    ap.add_argument("--only", nargs="*", default=[], help="glob patterns of model names (tv_*, timm_vit*, hf_bert)")
    ap.add_argument("--limit", type=int, default=0, help="run at most N models not run yet")
    ap.add_argument("--max-params", type=float, default=150e6, help="skip models with more parameters (image size, 2 cores)")
    ap.add_argument("--fresh", action="store_true", help="forget earlier results")
    ap.add_argument("--retry", action="store_true", help="run again the models that failed")
    ap.add_argument("--redo", action="store_true", help="run the selected models again even when they passed")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--no-attribute", action="store_true", help="skip the final attribution pass")
    ap.add_argument("--attribute-only", action="store_true", help="only the attribution pass and the report")
    ap.add_argument("--reattribute", action="store_true", help="attribute again models attributed earlier")
    args = ap.parse_args()
    site = ensure_site()
    names = catalogue(str(site) if site else None)
    if args.only:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in args.only)]
    if args.list:
        print("\n".join(names))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    state_path, library = args.work / "state.json", args.work / "library.sqlite"
    if args.fresh:
        state_path.unlink(missing_ok=True)
        library.unlink(missing_ok=True)
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    os.environ["ZEN_ZOO_MAX_PARAMS"] = str(int(args.max_params))
    t_all, done = time.perf_counter(), 0
    for name in [] if args.attribute_only else names:
        old = state.get(name)
        ok = old and "reuse_base" in old and old["reuse_base"].get("equal") and old["reuse_sc"].get("equal")
        if old and not args.redo and (ok or not args.retry):
            continue
        if args.limit and done >= args.limit:
            break
        t0 = time.perf_counter()
        shutil.rmtree(args.work / f"case_{name}", ignore_errors=True)
        try:
            row = run_model(name, args.work, library, str(site) if site else None, FORKS.get(name))
        except subprocess.TimeoutExpired as exc:
            row = {"name": name, "library": library_of(name), "error": f"timed out: {exc.cmd[:3]}"}
        row["total_s"] = round(time.perf_counter() - t0, 1)
        state[name] = row
        done += 1
        state_path.write_text(json.dumps(state, indent=1))
        print(f"{name}: base={_verdict(row.get('reuse_base'))} sc={_verdict(row.get('reuse_sc'))} "
              f"{row.get('error', '')} ({row['total_s']} s)", flush=True)  # fmt: skip
    # attribution against the library of every model run so far; kept in its own file, updated under
    # a lock, so that passes run beside a sweep (which rewrites state.json) or each other lose nothing
    att_path = args.work / "attribution.json"
    size = sum(1 for r in state.values() if "reuse_base" in r)  # every model that ran was added to the library
    for name in names:
        row = state.get(name) or {}
        if args.no_attribute or "reuse_base" not in row or not (args.work / f"case_{name}").is_dir():
            continue
        if name in _attributions(att_path) and not args.reattribute:
            continue  # attributed already (against the library of its time: `library_size` says how large)
        t0 = time.perf_counter()
        res = attribute(args.work / f"case_{name}", library)
        res.update(library_size=size, seconds=round(time.perf_counter() - t0, 1))
        _attributions(att_path, {name: res})
        print(f"attribute {name}: {res}", flush=True)
    attributions = _attributions(att_path)
    for name, row in state.items():
        if name in attributions:
            row["attribution"] = attributions[name]
    import torch
    import transformers

    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "seconds": time.perf_counter() - t_all}  # fmt: skip
    listed = catalogue(str(site) if site else None)
    write_md({n: state[n] for n in listed if n in state}, args.out, meta, [n for n in listed if n not in state])
    print(f"wrote {args.out}")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in ("deploy", "check"):
    sys.path.insert(0, str(ROOT / "src"))
    if sys.argv[1] == "deploy":
        deploy(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    sys.exit(0)


if __name__ == "__main__":
    main()
