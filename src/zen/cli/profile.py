"""`zen profile python|torch|tf`: measure struct layouts in an interpreter and save them as layout profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import typer

from zen.evidence.outpaths import require_parent
from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()
profile_app = typer.Typer(
    no_args_is_help=True, help="Calibrate layout profiles (struct offsets) for a Python, torch or TensorFlow version."
)


@profile_app.command("python")
def profile_python(
    python: str = typer.Option(sys.executable, "--python", help="Interpreter to calibrate (default: the one running zen)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here instead of the user profile directory."),
) -> None:
    """Measure CPython struct layouts in an interpreter and save them as a layout profile."""
    require_parent(output, "the profile")
    from zen.cpython.layout.profile import parse_profile, profile_filename, user_profile_dir

    data, text = _run_calibrator(python, "zen.cpython.calibration.run")
    prof = parse_profile(data, python)
    # named after the exact release: an image of another patch release may need another layout (releases.py)
    target = output or (user_profile_dir() / profile_filename(prof.version, data["python"]["machine"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    out.print(
        f"calibrated CPython {prof.version}: {sum(len(s.fields()) for s in prof.structs.values())} fields in "
        f"{len(prof.structs)} structs, {data['self_checks']} self-checks passed -> {target}"
    )


@profile_app.command("torch")
def profile_torch(
    python: str = typer.Option(sys.executable, "--python", help="Interpreter with the torch to calibrate (default: zen's)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here instead of the user profile directory."),
) -> None:
    """Measure PyTorch layouts (TensorImpl, StorageImpl, dtypes; TorchScript modules; fbgemm packed weights) and save a
    torch layout profile."""
    require_parent(output, "the profile")
    from zen.cpython.layout.profile import user_profile_dir
    from zen.frontends.pytorch.profile import parse_torch_profile, torch_profile_filename

    data, text = _run_calibrator(python, "zen.frontends.pytorch.calibration")
    prof = parse_torch_profile(data, python)
    target = output or (user_profile_dir() / torch_profile_filename(prof.minor, data["torch"]["machine"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    out.print(
        f"calibrated torch {data['torch']['full_version']}: {sum(len(s.fields()) for s in prof.structs.values())} "
        f"fields, {len(prof.dtypes)} dtypes, {data['self_checks']} self-checks passed -> {target}"
    )


@profile_app.command("tf")
def profile_tf(
    python: str = typer.Option(..., "--python", help="Interpreter with the TensorFlow to calibrate (zen's own has none)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here instead of the user profile directory."),
) -> None:
    """Measure TensorFlow tensor/variable layouts (EagerTensor, ResourceVariable, shapes, dtypes) for Keras models."""
    require_parent(output, "the profile")
    from zen.cpython.layout.profile import user_profile_dir
    from zen.frontends.keras.profile import parse_tf_profile, tf_profile_filename

    data, text = _run_calibrator(python, "zen.frontends.keras.calibration")
    prof = parse_tf_profile(data, python)
    target = output or (user_profile_dir() / tf_profile_filename(prof.minor, data["tensorflow"]["machine"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    out.print(
        f"calibrated TensorFlow {prof.version}: {sum(len(s.fields()) for s in prof.structs.values())} fields, "
        f"{len(prof.dtypes)} dtypes, {data['self_checks']} self-checks passed -> {target}"
    )


def _run_calibrator(python: str, module: str) -> tuple[dict, str]:
    """Run a stdlib-only calibrator module under another interpreter, from zen's own source tree.

    The target interpreter imports it in isolated mode without needing zen's dependencies.
    """
    from zen.runtime import childproc

    boot = f"import sys; from {module} import main; sys.exit(main())"
    try:
        proc = childproc.run(childproc.code_argv(boot, python=python, with_pythonpath=False), capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    except FileNotFoundError:
        raise ZenError(f"interpreter not found: {python}") from None
    except subprocess.TimeoutExpired:
        raise ZenError(f"calibration under {python} did not finish in 300 s") from None
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
        raise ZenError(f"calibration under {python} failed: {last}")
    return json.loads(proc.stdout), proc.stdout
