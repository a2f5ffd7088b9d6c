"""`zen library build RECIPE`: deploy base models, image them, and add their fingerprints.

A recipe (TOML) lists base models as small Python snippets that build a model ("deployed base
systems"):

    [[model]]
    name = "gpt2"
    notes = "transformers GPT-2, small config"
    sys_path = ["."]          # optional, relative to the recipe file
    code = '''
    import torch, transformers
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2)).eval()
    inputs = torch.randint(0, 100, (1, 8))
    '''

For each entry zen starts a fresh Python process that runs the snippet, calls `model(inputs)` once
(if `inputs` is set) so the model is deployed as it would be when serving, and waits. zen images
that process, recovers the model referenced as `__main__.model`, and adds it to the library under
the entry's name. The snippets are the investigator's own trusted code; nothing recovered from an
image is ever executed here.
"""

from __future__ import annotations

import subprocess
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

from zen.library.store import Library
from zen.runtime import childproc
from zen.runtime.errors import ZenError

RUNNER = """
import sys
sys.path[:0] = {paths!r}
__recipe__ = open({code!r}).read()
exec(compile(__recipe__, {name!r}, "exec"), globals())
if "inputs" in globals():
    import torch
    with torch.no_grad():
        model(inputs)
print("READY", flush=True)
sys.stdin.read()
"""
START_TIMEOUT = 600


def load_recipe(path: Path) -> list[dict]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ZenError(f"recipe not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ZenError(f"recipe {path} is not valid TOML: {exc}") from None
    models = data.get("model")
    if not isinstance(models, list) or not models:
        raise ZenError(f"recipe {path} has no [[model]] entries")
    for m in models:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not isinstance(m.get("code"), str):
            raise ZenError(f"recipe {path}: every [[model]] needs a name and code")
    return models


def build(recipe: Path, library: Library, *, only: list[str] | None = None, replace: bool = False,
          log: Callable[[str], None] = print) -> list[str]:  # fmt: skip
    """Build every (or the named) recipe entry into `library`; returns the names added."""
    from zen.acquire.process import acquire
    from zen.recover.run import recover

    recipe = Path(recipe).resolve()
    models = [m for m in load_recipe(recipe) if not only or m["name"] in only]
    if only and len(models) != len(set(only)):
        missing = set(only) - {m["name"] for m in models}
        raise ZenError(f"recipe {recipe} has no model named {', '.join(sorted(missing))}")
    added = []
    for m in models:
        name = m["name"]
        with tempfile.TemporaryDirectory(prefix="zen-build-") as tmp:
            work = Path(tmp)
            code = work / "recipe_snippet.py"
            code.write_text(m["code"])
            paths = [str((recipe.parent / p).resolve()) for p in m.get("sys_path", [])]
            runner = work / "deploy.py"
            runner.write_text(RUNNER.format(paths=paths, code=str(code), name=f"<recipe {name}>"))
            log(f"{name}: deploying")
            # isolated (zen.runtime.childproc): the recipe's own sys_path and the caller's PYTHONPATH are importable,
            # the directory zen was started in is not
            proc = subprocess.Popen(childproc.script_argv(runner), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=work)  # fmt: skip
            try:
                line = proc.stdout.readline().strip()
                if line != "READY":
                    err = proc.stderr.read()[-800:] if proc.poll() is not None else ""
                    raise ZenError(f"recipe model {name!r} did not start: {err.strip() or 'no READY line'}")
                image = work / f"{name}.core"
                acquire(proc.pid, image, lean=True)
            finally:
                childproc.stop_process(proc)
            log(f"{name}: recovering")
            res = recover(image, None, work / "case", model="__main__.model")
            library.add_case(res.case_dir, name, replace=replace, notes=m.get("notes", ""))
            log(f"{name}: added ({len(res.mr.modules)} modules, {res.mr.summary['parameter_elements']:,} parameters)")
            added.append(name)
    return added
