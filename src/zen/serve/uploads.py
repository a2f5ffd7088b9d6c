"""Bounded uploads: no request can make the server hold more than it allows.

Three bounds, each a 413 with one line saying which:

* `BodyLimit` (ASGI middleware) caps every request body: a declared Content-Length over the cap
  is refused before anything is read; a body without one is counted as it arrives. The excess is
  read and dropped (up to `DRAIN_BYTES`, and for a declared one at most `DRAIN_DECLARED` bytes or
  `DRAIN_SECONDS`) before answering, so an ordinary client that is still sending gets the 413 instead
  of a reset connection; a larger or stalling one has its connection closed (a client that declared
  300 MB and sent nothing was never answered: issue 49.5).
* `read_parts` parses multipart with few parts and small form fields, and only after the request's
  token was checked (the endpoints read their bodies themselves, after authentication).
* A part sent gzip-compressed (name ending .gz, as zen's client sends to remote servers) is
  inflated incrementally and refused as soon as it would exceed the per-file cap, so a
  decompression bomb costs the server the cap, not the bomb.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from typing import Any

from fastapi import HTTPException, Request
from starlette.requests import ClientDisconnect

from zen.library.bundle import FILE_OF_PART

DRAIN_BYTES = 256 << 20
DRAIN_DECLARED = 16 << 20  # bytes read and dropped before refusing a declared oversize body
DRAIN_SECONDS = 2.0  # waiting on the network, not work: a client that stalls gets its 413 anyway


class Disconnected(Exception):
    """The client went away during its upload: one line in the log (app._errors), never a traceback."""


def too_large(what: str, limit: int) -> HTTPException:
    return HTTPException(413, f"{what} is larger than this server accepts ({limit:,} bytes)")


class BodyLimit:
    """ASGI middleware: a request body larger than `max_bytes` gets a 413."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(_drain(receive, DRAIN_DECLARED), DRAIN_SECONDS)
            await _refuse(send, f"the request body is larger than this server accepts ({self.max_bytes:,} bytes)")
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if message.get("more_body"):
                        await _drain(receive, DRAIN_BYTES)
                    raise too_large("the request body", self.max_bytes)
            return message

        await self.app(scope, counted, send)


async def _drain(receive: Any, budget: int) -> None:
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body"):
            return


async def _refuse(send: Any, detail: str) -> None:
    import json

    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def read_parts(request: Request, *, file_bytes: int,
                     fields: tuple[str, ...] = ()) -> tuple[dict[str, bytes], dict[str, str]]:  # fmt: skip
    """({case file name: bytes}, {form field: text}) of a multipart upload of case files."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise HTTPException(415, "send the fingerprint as multipart/form-data, one part per case file")
    try:
        form = await request.form(max_files=len(FILE_OF_PART), max_fields=max(1, len(fields)), max_part_size=64 << 10)
    except ClientDisconnect:
        raise Disconnected() from None
    files: dict[str, bytes] = {}
    values: dict[str, str] = {}
    try:
        for key, value in form.multi_items():
            if isinstance(value, str):
                if key not in fields:
                    raise HTTPException(422, f"unexpected form field {key!r}")
                values[key] = value
                continue
            name = FILE_OF_PART.get(key)
            if name is None:
                raise HTTPException(422, f"unexpected part {key!r}; the parts are {', '.join(FILE_OF_PART)}")
            if name in files:
                raise HTTPException(422, f"part {key!r} sent twice")
            data = await value.read(file_bytes + 1)
            if (value.filename or "").endswith(".gz"):
                data = inflate(data, key, file_bytes)
            if len(data) > file_bytes:
                raise too_large(f"part {key!r}", file_bytes)
            files[name] = data
    finally:
        await form.close()
    return files, values


def inflate(data: bytes, what: str, limit: int) -> bytes:
    """A gzip member, inflated to at most `limit` bytes (413 beyond, 422 when it is not gzip)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise HTTPException(422, f"part {what!r} is not valid gzip: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise too_large(f"part {what!r} once decompressed", limit)
    if not d.eof or d.unused_data:
        raise HTTPException(422, f"part {what!r} is not one complete gzip member")
    return out
