"""`zen serve` and `zen serve token ...`: run a library as a team's HTTP(S) service, and its tokens."""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()

SERVE_HELP = (
    "Serve a library to a team over HTTP(S): list/search/show/add/remove/attribute/export/import (OpenAPI at /docs). "
    "Clients point `--library` at https://HOST:PORT with a token in $ZEN_LIBRARY_TOKEN. Run `zen serve token add` first."
)
serve_app = typer.Typer(help=SERVE_HELP, invoke_without_command=True)
token_app = typer.Typer(no_args_is_help=True, help="Access tokens of `zen serve` (scopes read < add < curate), kept hashed "
                        "in the library's database.")  # fmt: skip
serve_app.add_typer(token_app, name="token")

SERVE_LIB = "Library to serve: a SQLite file or a postgresql:// URL (default: $ZEN_LIBRARY or ~/.local/share/zen/library.sqlite)."


def _library(spec: str | None, ctx: typer.Context | None = None) -> str | None:
    """The token commands' library: their own --library, else the one given to `zen serve`."""
    if spec is None and ctx is not None and ctx.parent is not None:
        spec = ctx.parent.params.get("library")
    from zen.library.backends import describe

    if describe(spec) == "http":
        raise ZenError("zen serve needs the library itself (a SQLite file or a postgresql:// URL), not another server",
                       "run it where the library's file or database is reachable")  # fmt: skip
    return spec


PUBLIC_READ = (
    "Let requests without a token list, search and show entries (never write; /export and /attribute need "
    "their own switch). Anonymous readers do not see who added an entry."
)


@serve_app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    library: str | None = typer.Option(None, "--library", help=SERVE_LIB),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8765, "--port", help="Port to listen on (0: any free port; the URL is printed)."),
    ssl_certfile: Path | None = typer.Option(None, "--ssl-certfile", help="TLS certificate (PEM); serves https."),
    ssl_keyfile: Path | None = typer.Option(None, "--ssl-keyfile", help="TLS private key (PEM) of the certificate."),
    public_read: bool = typer.Option(False, "--public-read", help=PUBLIC_READ),
    public_export: bool = typer.Option(False, "--public-export", help="With --public-read: also GET /export to anyone."),
    public_attribute: bool = typer.Option(False, "--public-attribute", help="With --public-read: POST /attribute too."),
    max_upload_mb: int = typer.Option(256, "--max-upload-mb", help="Largest request body accepted, in MiB."),
    threads: int = typer.Option(8, "--threads", help="Requests worked on, and bodies received, at once."),
    body_timeout: float = typer.Option(30.0, "--body-timeout", help="Seconds a request body may stall (then 408)."),
) -> None:
    """Serve the library over HTTP(S) until interrupted."""
    if ctx.invoked_subcommand is not None:
        return
    spec = _library(library)
    for f in (ssl_certfile, ssl_keyfile):
        if f is not None and not f.is_file():
            raise ZenError(f"{f} is not a file", "give the PEM files of the server's TLS certificate and key")
    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise ZenError("--ssl-certfile and --ssl-keyfile go together", "give both, or neither for plain http")
    if (public_export or public_attribute) and not public_read:
        raise ZenError("--public-export and --public-attribute widen --public-read", "give --public-read as well")
    if max_upload_mb < 1 or threads < 1:
        raise ZenError("--max-upload-mb and --threads must be at least 1")
    if not 0.5 <= body_timeout <= 3600:
        raise ZenError(f"--body-timeout {body_timeout:g} is out of range", "give seconds between 0.5 and 3600")
    import uvicorn

    from zen.attribute.invariants import packed
    from zen.library.backends import default_library_spec, open_library
    from zen.library.bundle import Limits
    from zen.serve.app import ServeOptions, create_app

    with open_library(spec, create=True, invariants=packed) as lib:  # made and migrated once, here, not by racing threads
        where, kind, n = lib.path, lib.kind, len(lib)
    sock = _listen(host, port)
    scheme = "https" if ssl_certfile else "http"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{sock.getsockname()[1]}"
    # a compressed part inflates to at most what an uncompressed upload may be
    opts = ServeOptions(public_read=public_read, public_export=public_export, public_attribute=public_attribute,
                        max_body=max_upload_mb << 20, threads=threads, body_timeout=body_timeout,
                        limits=Limits(file_bytes=min(Limits.file_bytes, max_upload_mb << 20)))  # fmt: skip
    app = create_app(str(where) if kind == "sqlite" else (spec or default_library_spec()), opts)
    out.print(f"zen serve: {escape(str(where))} ({kind}, {n} models) at {url} (OpenAPI at {url}/docs)", soft_wrap=True)
    if scheme == "http" and not _loopback(host):
        err.print("[yellow]note: plain http on a network address: tokens and fingerprints travel in clear text; "
                  "serve with --ssl-certfile/--ssl-keyfile or behind a TLS proxy[/yellow]")  # fmt: skip
    import copy

    logging = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    logging["handlers"]["access"]["stream"] = "ext://sys.stderr"  # stdout says where the server is; the log goes to stderr
    logging.setdefault("filters", {})["no_query"] = {"()": "zen.serve.logs.NoQuery"}  # a token must never reach a log
    logging["handlers"]["access"]["filters"] = ["no_query"]
    config = uvicorn.Config(app, ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
                            ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None, log_level="info", log_config=logging,
                            timeout_graceful_shutdown=10)  # fmt: skip
    uvicorn.Server(config).run(sockets=[sock])


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a taken port is one clear error (and port 0 is resolved)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ZenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", "choose another --port or --host") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@token_app.command("add")
def token_add(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", help="Who holds the token (recorded as who did what)."),
    scope: list[str] = typer.Option(..., "--scope", help="read, add or curate (repeatable; each includes the ones before)."),
    library: str | None = typer.Option(None, "--library", help=SERVE_LIB),
) -> None:
    """Make a token; it is printed once and stored only as its sha256."""
    from zen.library import tokens
    from zen.library.backends import open_library

    with open_library(_library(library, ctx), create=True) as lib:
        token = tokens.create(lib, name, scope)
    err.print(f"token {escape(name)} ({', '.join(tokens.check_scopes(scope))}); it is shown only now:")
    out.print(token, markup=False, highlight=False)


@token_app.command("list")
def token_list(
    ctx: typer.Context,
    library: str | None = typer.Option(None, "--library", help=SERVE_LIB),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List the tokens (names and scopes; the tokens themselves are not kept)."""
    from zen.library import tokens
    from zen.library.backends import open_library

    with open_library(_library(library, ctx), create=False) as lib:
        rows = tokens.listing(lib)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    t = Table("name", "scopes", "created")
    for r in rows:
        t.add_row(escape(r["name"]), ", ".join(r["scopes"]), r["created"])
    out.print(t)


@token_app.command("remove")
def token_remove(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The token's name."),
    library: str | None = typer.Option(None, "--library", help=SERVE_LIB),
) -> None:
    """Revoke a token: requests bearing it are refused from now on."""
    from zen.library import tokens
    from zen.library.backends import open_library

    with open_library(_library(library, ctx), create=False) as lib:
        tokens.remove(lib, name)
    out.print(f"removed token {escape(name)}")
