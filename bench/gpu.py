"""End-to-end check of models in GPU memory on a machine with an NVIDIA GPU (issue 31), in one prepared run.

    python bench/gpu.py OUTDIR [--device cuda|cpu] [--only STEP ...]

Steps (each result is appended to OUTDIR/results.json as soon as it is known, so one failing step loses nothing):
  env            machine, driver, Python, torch, cuda-gdb
  cnn_driver     a CNN process started with the driver's user-triggered GPU dump enabled (skip_abort):
                 `zen acquire` (host image + driver dump), `zen recover --gpu`, every tensor against the process's sha256
  cnn_reuse      `zen reuse` of that case, `zen verify --device cuda:0` against the process's own response, and on CPU
  cnn_cudagdb    the same process read by the cuda-gdb route (`zen acquire --gpu cuda-gdb`): recover, compare, MB/s
  cpu_baseline   the same CNN on the CPU: recovery time of a CPU image vs host + GPU image
  gpt2_cudagdb   a transformers GPT-2 (124M) process started with no preparation: `zen acquire` (auto -> cuda-gdb),
                 recover, all tensors, MB/s of the dump, reuse on the GPU
  default_pipe   a process with only CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 (the driver's default pipe name)
  cores          issue 50: a GPT-2 CPU image recovered on 1, 2, 4, ... of the machine's cores (`bench/cores.py`)
With --device cpu (no GPU here) the GPU steps are skipped, saying so; the rest runs, which tests the script.
Results are written up in bench/results/gpu.md by hand from results.json, saying which machine gave them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "bench" / "gpu_target.py"
FLAGS = "skip_nonrelocated_elf_images,skip_shared_memory,skip_local_memory,skip_constbank_memory,skip_abort"


class Run:
    def __init__(self, out: Path, device: str) -> None:
        self.out, self.device = out, device
        self.work = Path(os.environ.get("ZEN_GPU_BENCH_WORK") or "/tmp/zen-gpu-bench")
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.results: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": device, "steps": {}}
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.env["COLUMNS"] = "200"

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str) + "\n")

    def step(self, name: str, fn) -> None:
        t0 = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - a failing step is recorded, the next one runs
            res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        res["seconds"] = round(time.monotonic() - t0, 2)
        self.results["steps"][name] = res
        self.save()
        print(json.dumps(res, default=str)[:1500], flush=True)
        self.stop_all()

    def zen(self, *args, timeout: float = 300, check: bool = False) -> dict:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=self.env, cwd=self.work)  # fmt: skip
        r = {"cmd": "zen " + " ".join(map(str, args)), "rc": proc.returncode, "wall": round(time.monotonic() - t0, 2),
             "stdout": proc.stdout[-2500:], "stderr": proc.stderr[-2500:]}  # fmt: skip
        if "--json" in map(str, args):  # parsed whole: a long report (GPT-2's 149 tensors) is cut in "stdout"
            try:
                r["json"] = json.loads(proc.stdout)
            except ValueError:
                pass
        if check and proc.returncode != 0:
            raise RuntimeError(f"{r['cmd']} exit {proc.returncode}: {proc.stderr[-800:]}")
        return r

    def start(self, model: str, device: str, env: dict | None = None, name: str | None = None) -> tuple[subprocess.Popen, Path]:
        d = self.work / (name or f"{model}-{device.replace(':', '')}")
        d.mkdir(parents=True, exist_ok=True)
        e = {k: v for k, v in self.env.items() if not k.startswith(("CUDA_COREDUMP", "CUDA_ENABLE_USER_TRIGGERED"))}
        e.update(env or {})
        proc = subprocess.Popen([sys.executable, str(TARGET), str(d), "--model", model, "--device", device],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                                cwd=d, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        line = proc.stdout.readline().strip()
        if line != "READY":
            raise RuntimeError(f"target {model} on {device} did not start: {proc.stderr.read()[-1500:]}")
        return proc, d

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait(10)
        self.procs.clear()


def compare(case: Path, truth_dir: Path) -> dict:
    """Every state_dict tensor of the process against the case: same sha256, status ok."""
    truth = json.loads((truth_dir / "truth.json").read_text())["tensors"]
    recs = {r["key"]: r for r in json.loads((case / "mr.json").read_text())["tensors"]}
    equal = [k for k, t in truth.items() if k in recs and recs[k].get("sha256") == t["sha256"] and recs[k]["status"] == "ok"]
    bad = {k: (recs.get(k, {}).get("status"), recs.get(k, {}).get("note", "")[:200]) for k in truth if k not in equal}
    man = json.loads((case / "manifest.json").read_text())
    return {"tensors": len(truth), "bit_exact": len(equal), "not_equal": dict(list(bad.items())[:10]),
            "devices": sorted({r.get("device") for r in recs.values()}), "status": man["status"],
            "recover_seconds": man["run"]["total_seconds"], "stage_seconds": man["run"]["seconds"],
            "gpu_evidence": [{k: g.get(k) for k in ("size", "sha256", "global_memory", "compression")}
                             for g in man["evidence"].get("gpu", [])]}  # fmt: skip


def acquire_recover(r: Run, pid: int, truth_dir: Path, tag: str, *extra) -> dict:
    img = r.work / f"{tag}.core"
    acq = r.zen("acquire", "--pid", pid, "-o", img, "--lean", *extra, timeout=400)
    res = {"acquire": acq}
    side = Path(f"{img}.acquisition.json")
    if side.exists():
        res["acquisition_note"] = json.loads(side.read_text())["gpu"]
    gpu = Path(f"{img}.gpu0.nvcudmp")
    if not gpu.exists():
        res["error"] = "no GPU image written"
        return res
    res["gpu_image_bytes"] = gpu.stat().st_size
    res["host_image_bytes"] = img.stat().st_size
    info = r.zen("info", gpu, "--json", timeout=120)
    try:
        res["gpu_info"] = {k: v for k, v in info["json"].items() if k != "global_memory"}
    except KeyError:
        res["gpu_info"] = info
    case = r.work / f"{tag}-case"
    res["recover"] = r.zen("recover", img, "--gpu", gpu, "-o", case, timeout=600)
    if (case / "mr.json").exists():
        res["compare"] = compare(case, truth_dir)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    r = Run(a.out, a.device)
    gpu = a.device.startswith("cuda")
    prepared = {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1", "CUDA_COREDUMP_GENERATION_FLAGS": FLAGS}
    state: dict = {}

    def env():
        def sh(cmd):
            try:
                return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()[-1500:]
            except subprocess.TimeoutExpired:
                return "timeout"

        import torch

        return {"python": sys.version.split()[0], "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                "nvidia_smi": sh("nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv"),
                "cuda_gdb": sh("command -v cuda-gdb && cuda-gdb --version | head -2"), "cpus": os.cpu_count(),
                "uname": sh("uname -r")}  # fmt: skip

    def cnn_driver():
        if not gpu:
            return {"skipped": "no GPU (--device cpu)"}
        e = dict(prepared, CUDA_COREDUMP_PIPE=str(r.work / "cnn.pipe"), CUDA_COREDUMP_FILE=str(r.work / "cnn-driver-%p.nvcudmp"))
        proc, d = r.start("cnn", "cuda", e, name="cnn-prepared")
        state["cnn_dir"] = d
        res = acquire_recover(r, proc.pid, d, "cnn-driver")
        res["process_alive_after"] = proc.poll() is None
        return res

    def cnn_reuse():
        if not gpu:
            return {"skipped": "no GPU"}
        d, case = state.get("cnn_dir"), r.work / "cnn-driver-case"
        if d is None or not (case / "mr.json").exists():
            return {"skipped": "cnn_driver did not produce a case"}
        pkg = r.work / "cnn_rebuilt"
        out = {"reuse": r.zen("reuse", case, "-o", pkg, timeout=300)}
        for dev in ("cuda:0", "cpu"):
            v = r.zen("verify", pkg, "--device", dev, "--inputs", d / "request.safetensors", "--expect",
                      d / "response.safetensors", "--json", timeout=300)  # fmt: skip
            try:
                out[f"verify_{dev}"] = {"rc": v["rc"], "results": v["json"]["results"]}
            except KeyError:
                out[f"verify_{dev}"] = v
        return out

    def cnn_cudagdb():
        if not gpu:
            return {"skipped": "no GPU"}
        proc, d = r.start("cnn", "cuda", name="cnn-unprepared")
        res = acquire_recover(r, proc.pid, d, "cnn-gdb", "--gpu", "cuda-gdb", "--gpu-timeout", "200")
        res["process_alive_after"] = proc.poll() is None
        return res

    def cpu_baseline():
        proc, d = r.start("cnn", "cpu", name="cnn-cpu")
        img = r.work / "cnn-cpu.core"
        acq = r.zen("acquire", "--pid", proc.pid, "-o", img, "--lean", timeout=300)
        times = []
        for k in range(3):
            rec = r.zen("recover", img, "-o", r.work / f"cnn-cpu-case{k}", timeout=300)
            times.append(rec["wall"])
        res = {"acquire": acq, "recover_walls": times, "compare": compare(r.work / "cnn-cpu-case0", d)}
        if gpu and (r.work / "cnn-driver.core").exists():
            gt = []
            for k in range(3):
                rec = r.zen("recover", r.work / "cnn-driver.core", "--gpu", r.work / "cnn-driver.core.gpu0.nvcudmp", "-o",
                            r.work / f"cnn-gpu-case{k}", timeout=300)  # fmt: skip
                gt.append(rec["wall"])
            res["gpu_recover_walls"] = gt
            res["ratio_gpu_over_cpu_median"] = round(sorted(gt)[1] / sorted(times)[1], 3)
        return res

    def gpt2_cudagdb():
        if not gpu:
            return {"skipped": "no GPU"}
        proc, d = r.start("gpt2", "cuda", name="gpt2-unprepared")
        res = acquire_recover(r, proc.pid, d, "gpt2", "--gpu-timeout", "240")
        res["process_alive_after"] = proc.poll() is None
        case = r.work / "gpt2-case"
        if (case / "mr.json").exists():
            pkg = r.work / "gpt2_rebuilt"
            res["reuse"] = r.zen("reuse", case, "-o", pkg, timeout=300)
            v = r.zen("verify", pkg, "--device", "cuda:0", "--inputs", d / "request.safetensors", "--expect",
                      d / "response.safetensors", "--json", timeout=300)  # fmt: skip
            try:
                res["verify_cuda"] = {"rc": v["rc"], "results": v["json"]["results"]}
            except KeyError:
                res["verify_cuda"] = v
        return res

    def default_pipe():
        if not gpu:
            return {"skipped": "no GPU"}
        proc, d = r.start("cnn", "cuda", dict(prepared), name="cnn-default-pipe")
        res = acquire_recover(r, proc.pid, d, "cnn-default")
        res["cwd_files"] = sorted(os.listdir(d))[:20]
        return res

    def cores():
        # issue 50: the same GPT-2 CPU image recovered on 1, 2, 4, ... of this machine's cores (bench/cores.py)
        raw = a.out / "cores.json"
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "cores.py"), "--runs", "2", "--no-write", "--json",
                               str(raw)], capture_output=True, text=True, timeout=900, env=r.env)  # fmt: skip
        res = {"rc": proc.returncode, "page": proc.stdout[-4000:], "stderr": proc.stderr[-2000:]}
        if raw.exists():
            res["rows"] = json.loads(raw.read_text())["rows"]
        return res

    steps = [("env", env), ("cnn_driver", cnn_driver), ("cnn_reuse", cnn_reuse), ("gpt2_cudagdb", gpt2_cudagdb),
             ("cnn_cudagdb", cnn_cudagdb), ("cpu_baseline", cpu_baseline), ("default_pipe", default_pipe),
             ("cores", cores)]  # fmt: skip
    for name, fn in steps:
        if not a.only or name in a.only:
            r.step(name, fn)
    r.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    r.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
