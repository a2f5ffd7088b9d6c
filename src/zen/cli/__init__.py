"""The `zen` command: only assembles the command modules of this package into one Typer app, and runs it.

Thin: each module parses its arguments, calls the pipeline and renders results. Every error caused by input arrives
here as a `ZenError` and leaves as one clear line on stderr (plus a hint) and a non-zero exit code; a Python
traceback only appears for bugs in zen, and only with ZEN_DEBUG=1. Nothing in the pipeline imports this package.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from zen.cli import acquire, analyze, case, decompile, inspect, library, profile, recover, reuse, serve, symbols, system
from zen.runtime.console import consoles
from zen.runtime.errors import ZenError
from zen.runtime.leave import run_and_leave

out, err = consoles()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="zen: recover deep-learning models, and the code that implements them, from memory images of Python processes "
    "(process cores, live PIDs, or whole-machine RAM images: LiME, AVML, raw, ELF dumps).",
)
# `zen --help` lists the commands in this order
for name, fn in [
    ("attribute", library.attribute), ("diff", reuse.diff), ("reuse", reuse.reuse), ("verify", reuse.verify),
    ("report", reuse.report), ("ps", system.ps), ("symbols", symbols.symbols), ("decompile", decompile.decompile),
    ("acquire", acquire.acquire), ("analyze", analyze.analyze), ("drift", analyze.drift),
    ("verify-case", case.verify_case), ("sign", case.sign), ("keygen", case.keygen),
    ("verify-evidence", case.verify_evidence), ("version", inspect.version), ("info", inspect.info),
    ("objects", inspect.objects), ("recover", recover.recover), ("show", inspect.show), ("demo", recover.demo),
]:  # fmt: skip
    app.command(name)(fn)
app.add_typer(profile.profile_app, name="profile")
app.add_typer(library.library_app, name="library")
app.add_typer(serve.serve_app, name="serve")


# what an interrupted command leaves (the commands that write evidence or a case clean up after themselves)
LEFT = {
    "acquire": "the image it was writing was removed (images are written as FILE.partial and renamed when whole)",
    "recover": "the case files it was writing were removed",
    "": "what it was writing may be incomplete",
}


def main() -> None:
    """Console entry point: run the app, then leave without freeing its objects one by one (`zen.runtime.leave`)."""
    run_and_leave(_main)


def _main() -> None:
    """Typer handles usage errors itself (exit 2); everything else that escapes a command arrives
    here: zen's own errors become one line plus a hint, anything else is a bug in zen."""
    for stream in (sys.stdout, sys.stderr):  # strings from an image may hold undecodable bytes (surrogates)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        app()
    except SystemExit as exc:
        if exc.code == 130:  # typer turns Ctrl-C into a silent exit 130: say so, and what was left
            command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
            err.print(f"interrupted: zen {escape(command)} stopped before it finished; {LEFT.get(command, LEFT[''])}")
        raise
    except ZenError as exc:
        err.print(f"[red]error:[/red] {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint: {escape(exc.hint)}[/dim]", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug in zen, not a user mistake
        if os.environ.get("ZEN_DEBUG") == "1":
            raise
        err.print(f"[red]internal error (a bug in zen):[/red] {type(exc).__name__}: {escape(str(exc))}")
        err.print("[dim]rerun with ZEN_DEBUG=1 for a traceback, and please report it[/dim]")
        sys.exit(70)


if __name__ == "__main__":
    main()
