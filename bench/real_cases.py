"""Real recovered cases for the attribution benchmarks, from the test suite's target processes.

    python bench/real_cases.py OUTDIR

Starts each target the tests use (the three test families, with every variant; transformers/peft models; the
small zoo), images it with `zen acquire --lean`, recovers every model in it into OUTDIR/case_NAME and deletes the
image: 20 real fingerprints (CNNs, a MobileNet-like family, GPT-like models with LoRA and RoPE variants,
transformers GPT-2, Llama, Mistral, Qwen2, GPT-2 + LoRA) in about five minutes on two cores. bench/zoo.py makes the
larger sweep (torchvision, timm, transformers) when hours are available. Cases already in OUTDIR are kept.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "tests" / "targets"
sys.path.insert(0, str(ROOT / "bench"))

from families import FAMILIES  # noqa: E402

# (target script, its argument, truth key holding the models, key of a model's id, case name prefix)
SOURCES = [("family_target.py", fam, "variants", "model_id", "") for fam in FAMILIES] + [
    ("models_target.py", "hf", "models", "id", "hf_"),
    ("models_target.py", "zoo", "models", "id", "zoo_"),
]


def zen(*args) -> None:
    r = subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True)
    if r.returncode not in (0, 5):
        raise SystemExit(f"zen {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-2000:]}")


def serve(script: str, arg: str, outdir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(TARGETS / script), str(outdir), arg], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=outdir)  # fmt: skip
    for line in proc.stdout:
        if line.strip() == "READY":
            return proc
    raise SystemExit(f"{script} {arg} did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path, help="where the case_NAME directories go (kept ones are reused)")
    out = ap.parse_args().outdir
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for script, arg, key, id_key, prefix in SOURCES:
        with tempfile.TemporaryDirectory(prefix="zen-real-cases-") as tmp:
            work = Path(tmp)
            proc = serve(script, arg, work)
            image = work / "target.core"
            try:
                zen("acquire", "--pid", proc.pid, "-o", image, "--lean")
            finally:
                proc.stdin.close()
                proc.wait()
            truth = json.loads((work / "truth.json").read_text())
            for name, entry in truth[key].items():
                dst = out / f"case_{prefix}{name}"
                if not (dst / "manifest.json").exists():
                    zen("recover", image, "-o", dst, "--model", hex(entry[id_key]))
                print(f"{dst.name} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
