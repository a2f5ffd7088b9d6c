"""`zen serve`: the Base Model Library as an HTTP API (FastAPI), for a team.

Every route is the library method of the same name, run against the server's library (a SQLite
file or a PostgreSQL database; zen.library.backends) on one connection per worker thread
(zen.serve.stores). Clients are zen itself (`--library https://...`, zen.library.remote) or
anything that speaks the OpenAPI schema served at /docs and /openapi.json.

Who may do what: a bearer token (zen.library.tokens) with scope read (list, search, show, export,
attribute), add (also add and import) or curate (also remove, replace, read the audit table).
No token, no access, unless the operator started the server with --public-read (reads only). A
write records the token's name as who did it, in the audit table, in the write's transaction.

Untrusted uploads: bodies are bounded before they are read (zen.serve.uploads), fingerprints are
parsed by the case-file readers with size and graph bounds (zen.library.bundle.Limits); anything
refused is a 4xx whose `detail` is one line saying why (and `hint` what to do), and the server
goes on serving. An error that is a bug in zen is a 500 with one line; the traceback goes to the
server's log, not to the client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from zen import __version__
from zen.attribute.algorithm import attribute as do_attribute  # imported at start-up, not by the first query
from zen.library import tokens
from zen.library.bundle import FILE_OF_PART, Bundle, BundleError, Limits
from zen.library.names import check_name
from zen.library.store import Conflict, LibraryError, NotFound
from zen.library.tokens import Principal
from zen.represent.schema import CaseFileError
from zen.runtime.errors import ZenError
from zen.serve.stores import StorePool
from zen.serve.uploads import BodyLimit, Disconnected, read_parts

DESCRIPTION = (
    "A zen Base Model Library shared over HTTP: list, search and show base-model fingerprints, attribute a recovered "
    "model's fingerprint (the same ranking and explanation as `zen attribute`), add, remove, export and import entries. "
    "Authenticate with `Authorization: Bearer TOKEN` (tokens: `zen serve token add --scope read|add|curate`)."
)
# A fingerprint's contents can trip over a check attribution does not repeat; for an upload that is
# the upload's fault (422), not the server's.
MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, OverflowError)


@dataclass
class ServeOptions:
    public_read: bool = False
    public_export: bool = False  # with public_read: GET /export (every fingerprint and its code) without a token
    public_attribute: bool = False  # with public_read: POST /attribute (CPU time) without a token
    max_body: int = 256 << 20  # bytes of one request
    limits: Limits = field(default_factory=Limits)
    threads: int = 8  # requests worked on at once (each holds one library connection)
    body_timeout: float = 30.0  # seconds a request body may send nothing (uploads.BodyLimit)


def one_line(text: str) -> str:
    return " ".join(str(text).split())[:1000]


def _checked(fn: Callable[[], Any], what: str) -> Any:
    try:
        return fn()
    except MALFORMED as exc:
        raise BundleError(f"{what} cannot be used: {type(exc).__name__}: {one_line(str(exc))[:300]}") from None


def _multipart(parts: tuple[str, ...], required: tuple[str, ...], fields: dict[str, str]) -> dict:
    props: dict[str, Any] = {p: {"type": "string", "format": "binary", "description": FILE_OF_PART[p]} for p in parts}
    props.update({k: {"type": "string", "description": v} for k, v in fields.items()})
    schema = {"type": "object", "properties": props, "required": list(required)}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def create_app(spec: str, options: ServeOptions | None = None) -> FastAPI:
    """The API over the library `spec` (a path or a postgresql:// URL; migrated when opened here)."""
    opts = options or ServeOptions()
    pool = StorePool(spec)
    bearer = HTTPBearer(auto_error=False, description="a token made by `zen serve token add`")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = opts.threads
        with pool.lease():  # the first connection, opened before the first request
            pass
        yield
        pool.close_all()

    app = FastAPI(title="zen library", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.add_middleware(GZipMiddleware, minimum_size=4096, compresslevel=1)
    app.add_middleware(BodyLimit, max_bytes=opts.max_body, uploads=opts.threads, idle_s=opts.body_timeout)  # runs first

    def requires(scope: str, public: bool | None = None) -> Callable[..., Principal]:
        open_ = opts.public_read if public is None else opts.public_read and public

        def principal(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
            if creds is None:
                if open_ and scope == "read":
                    return Principal("anonymous", frozenset({"read"}))
                raise HTTPException(401, "this library needs a token", headers={"WWW-Authenticate": "Bearer"})
            with pool.lease() as lib:
                who = tokens.verify(lib, creds.credentials)
            if who is None:
                raise HTTPException(401, "the token is not valid here", headers={"WWW-Authenticate": "Bearer"})
            if not who.may(scope):
                raise HTTPException(403, f"token {who.name!r} may not {scope} (its scopes: {', '.join(sorted(who.scopes))})")
            return who

        return principal

    def curator(p: Principal, replace: bool) -> None:
        if replace and not p.may("curate"):
            raise HTTPException(403, f"token {p.name!r} may not replace entries (that needs the curate scope)")

    read, add, curate = Depends(requires("read")), Depends(requires("add")), Depends(requires("curate"))
    export_read = Depends(requires("read", opts.public_export))
    attribute_read = Depends(requires("read", opts.public_attribute))

    def seen_by(p: Principal, row: dict) -> dict:
        """An anonymous reader does not see who added an entry (operating-system user and host names)."""
        return {**row, "added_by": "(hidden)"} if p.name == "anonymous" and "added_by" in row else row

    @app.get("/health", tags=["service"], summary="Liveness (no token needed)")
    async def health() -> dict:
        return {"status": "ok", "zen": __version__}

    @app.get("/library", tags=["library"], summary="The library: backend, schema, number of entries")
    def info(p: Principal = read) -> dict:
        with pool.lease() as lib:
            return {"backend": lib.kind, "schema": lib.schema_version(), "entries": len(lib), "zen": __version__,
                    "public_read": opts.public_read, "you": p.name, "scopes": sorted(p.scopes)}  # fmt: skip

    @app.get("/models", tags=["library"], summary="List or search entries (every filter given must match)")
    def models(name: str | None = None, framework: str | None = None, architecture: str | None = None,
               added_by: str | None = None, since: str | None = None, until: str | None = None,
               p: Principal = read) -> list[dict]:  # fmt: skip
        if added_by is not None and p.name == "anonymous":
            raise HTTPException(403, "searching by who added an entry needs a token")
        with pool.lease() as lib:
            return [seen_by(p, r) for r in lib.search(name=name, framework=framework, architecture=architecture,
                                                      added_by=added_by, since=since, until=until)]  # fmt: skip

    @app.get("/models/{name:path}", tags=["library"], summary="One entry: metadata, layer types, model code modules")
    def show(name: str, p: Principal = read) -> dict:
        with pool.lease() as lib:
            return seen_by(p, lib.show(name))

    @app.get("/fingerprints/{name:path}", tags=["library"], summary="One entry's whole fingerprint (as in an export)")
    def fingerprint(name: str, p: Principal = read) -> dict:
        with pool.lease() as lib:
            return seen_by(p, lib.export_data([name])["models"][0])

    add_form = {"name": "entry name", "notes": "free text", "replace": "true: replace an entry (curate)"}

    @app.post("/models", tags=["library"], status_code=201, summary="Add an entry from a case's fingerprint bundle",
              openapi_extra=_multipart(tuple(FILE_OF_PART), ("manifest", "mr", "pr", "ur", "name"), add_form))  # fmt: skip
    async def add_model(request: Request, p: Principal = add) -> dict:
        files, values = await read_parts(request, file_bytes=opts.limits.file_bytes, fields=("name", "notes", "replace"))
        replace = _flag(values.get("replace", "false"), "replace")
        curator(p, replace)
        if "name" not in values:
            raise HTTPException(422, "the form has no `name`")
        try:
            check_name(values["name"])  # before the fingerprint is built: one rule for names (library/names.py)
        except LibraryError as exc:
            raise HTTPException(400, f"{exc.message}; {exc.hint}") from None

        def work() -> dict:
            fp = _checked(lambda: Bundle(files).fingerprint(opts.limits), "the fingerprint")
            with pool.lease() as lib:
                mid = _checked(lambda: lib.add_fingerprint(values["name"], fp, replace=replace, notes=values.get("notes", ""),
                                                           who=p.who), "the fingerprint")  # fmt: skip
            return {"name": values["name"], "id": mid, "digests": fp.digests}

        return await run_in_threadpool(work)

    @app.delete("/models/{name:path}", tags=["library"], summary="Remove an entry (curate)")
    def remove(name: str, p: Principal = curate) -> dict:
        with pool.lease() as lib:
            lib.remove(name, who=p.who)
        return {"removed": name}

    @app.post("/attribute", tags=["attribution"], summary="Attribute a recovered model's fingerprint (zen attribute --json)",
              openapi_extra=_multipart(("mr", "pr"), ("mr", "pr"), {}))  # fmt: skip
    async def attribute(request: Request, optimal: bool = True, p: Principal = attribute_read) -> dict:
        files, _ = await read_parts(request, file_bytes=opts.limits.file_bytes)

        def work() -> dict:
            mr, pr = _checked(lambda: Bundle(files).query(opts.limits), "the query")
            with pool.lease() as lib:
                if len(lib) == 0:
                    raise LibraryError("the library is empty", "add base models first")
                return _checked(lambda: do_attribute(mr, pr, lib, optimal=optimal).to_json(), "the query")

        return await run_in_threadpool(work)

    @app.get("/export", tags=["exchange"], summary="Export entries (all, or those named) as a zen library export")
    def export(name: list[str] | None = Query(None), p: Principal = export_read) -> dict:
        with pool.lease() as lib:
            data = lib.export_data(name)
        return {**data, "models": [seen_by(p, m) for m in data.get("models", [])]}

    @app.post("/import", tags=["exchange"], summary="Import a zen library export (add; replace needs curate)")
    async def import_(request: Request, replace: bool = False, p: Principal = add) -> dict:
        curator(p, replace)
        try:
            body = await request.body()  # bounded by BodyLimit
        except ClientDisconnect:
            raise Disconnected() from None

        def work() -> dict:
            from zen.library.exchange import import_data
            from zen.represent.schema import MAX_BLOB_STRING, parse_json_bytes

            data = parse_json_bytes(body, "the import", MAX_BLOB_STRING)
            with pool.lease() as lib:
                return {"imported": import_data(lib, data, "the import", replace=replace, who=p.who)}

        return await run_in_threadpool(work)

    @app.get("/audit", tags=["library"], summary="The latest writes: who, what, when, digests (curate)")
    def audit(name: str | None = None, limit: int = Query(100, ge=1, le=10_000), p: Principal = curate) -> list[dict]:
        with pool.lease() as lib:
            return lib.audit_log(name=name, limit=limit)

    _errors(app)
    return app


def _flag(value: str, what: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0"):
        raise HTTPException(422, f"`{what}` must be true or false")
    return value.lower() in ("true", "1")


def _errors(app: FastAPI) -> None:
    """Every error is JSON {"detail": one line, "hint": ...} with a status saying whose fault it is."""

    @app.exception_handler(ZenError)
    async def zen_error(request: Request, exc: ZenError) -> JSONResponse:
        status = (404 if isinstance(exc, NotFound) else 409 if isinstance(exc, Conflict) else
                  422 if isinstance(exc, CaseFileError) else 400)  # fmt: skip
        return JSONResponse({"detail": one_line(exc.message), "hint": exc.hint}, status)

    @app.exception_handler(Disconnected)
    async def disconnected(request: Request, exc: Disconnected) -> JSONResponse:
        import logging

        client = request.client.host if request.client else "?"
        logging.getLogger("uvicorn.error").info(f"{client}: disconnected during {request.method} {request.url.path}")
        return JSONResponse({"detail": "the client disconnected during its upload"}, 400)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        return JSONResponse({"detail": one_line(f"{where}: {first.get('msg', 'invalid request')}")}, 422)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        if type(exc).__module__.split(".")[0] in ("psycopg", "sqlite3"):
            return JSONResponse({"detail": one_line(f"the library database failed: {exc}"),
                                 "hint": "try again; if it persists, tell the server's operator"}, 503)  # fmt: skip
        return JSONResponse({"detail": f"internal error in zen serve ({type(exc).__name__}); the server log has the details"},
                            500)  # fmt: skip
