"""Bounded uploads: no request can make the server hold more than it allows.

Three bounds, each a 413 with one line saying which:

* `BodyLimit` (ASGI middleware) caps every request body: a declared Content-Length over the cap
  is refused before anything is read; a body without one is counted as it arrives. The excess is
  read and dropped (up to `DRAIN_BYTES`, and for a declared one at most `DRAIN_DECLARED` bytes or
  `DRAIN_SECONDS`) before answering, so an ordinary client that is still sending gets the 413 instead
  of a reset connection; a larger or stalling one has its connection closed (a client that declared
  300 MB and sent nothing was never answered: issue 49.5).
* `read_parts` parses multipart as it arrives, with few parts and small form fields, each part refused the
  moment it passes its cap, and only after the request's token was checked (the endpoints read their bodies
  themselves, after authentication).
* `BodyLimit` also bounds time and concurrency: at most `uploads` bodies (`--threads`) are received at once (a
  request with a body waits up to `2 * idle_s` for a slot, then gets a 503), and a body must keep arriving: nothing
  for `idle_s` seconds (`--body-timeout`), or an average under `MIN_RATE` after that grace, is a 408 and the
  connection is closed. A slow or stalled client within the caps used to hold its connection, and the part it had
  sent, for as long as it liked (uvicorn has no timeout for reading a body): memory is now bounded by the body cap
  times `--threads`, and a slot by the time a client may take.
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

from zen.library.bundle import FILE_OF_PART, Limits

DRAIN_BYTES = 256 << 20
DRAIN_DECLARED = 16 << 20  # bytes read and dropped before refusing a declared oversize body
DRAIN_SECONDS = 2.0  # waiting on the network, not work: a client that stalls gets its 413 anyway
MIN_RATE = 64 << 10  # bytes/s a body must average once its first `idle_s` seconds are over


class Disconnected(Exception):
    """The client went away during its upload: one line in the log (app._errors), never a traceback."""


def too_large(what: str, limit: int) -> HTTPException:
    return HTTPException(413, f"{what} is larger than this server accepts ({limit:,} bytes)")


class BodyLimit:
    """ASGI middleware: a request body larger than `max_bytes` gets a 413, one that stalls a 408, and at most
    `uploads` bodies are received at once."""

    def __init__(self, app: Any, max_bytes: int, uploads: int = 8, idle_s: float = 30.0) -> None:
        self.app, self.max_bytes, self.idle_s = app, max_bytes, idle_s
        self.uploads, self.slots = uploads, asyncio.Semaphore(uploads)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(_drain(receive, DRAIN_DECLARED), DRAIN_SECONDS)
            await _refuse(send, 413, f"the request body is larger than this server accepts ({self.max_bytes:,} bytes)")
            return
        if not (declared not in (None, b"0") or b"transfer-encoding" in headers):
            await self.app(scope, receive, send)  # no body: nothing to bound
            return
        try:
            await asyncio.wait_for(self.slots.acquire(), 2 * self.idle_s)
        except TimeoutError:
            await _refuse(send, 503, f"{self.uploads} uploads are being received already; try again in a moment")
            return
        body = _Body(receive, self.max_bytes, self.idle_s)

        async def closing(message: dict) -> None:
            """An answer sent before the whole body came (a refusal) closes the connection: uvicorn would otherwise
            go on reading the rest of the body, unbounded, to keep the connection alive."""
            if message["type"] == "http.response.start" and not body.done:
                kept = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*kept, (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, body.receive, send=closing)
        finally:
            self.slots.release()


class _Body:
    """A request's `receive`, counting the body against the cap and timing it: each message must come within
    `idle_s`, and after that grace the average must stay at `MIN_RATE` (a trickle is a stall too)."""

    def __init__(self, receive: Any, max_bytes: int, idle_s: float) -> None:
        self._receive, self.max_bytes, self.idle_s = receive, max_bytes, idle_s
        self.start, self.seen, self.done = asyncio.get_running_loop().time(), 0, False

    async def receive(self) -> dict:
        if self.done:  # the body is in: later messages (a disconnect) may take their time
            return await self._receive()
        wait = min(self.idle_s, self.start + self.idle_s + self.seen / MIN_RATE - asyncio.get_running_loop().time())
        try:
            message = await asyncio.wait_for(self._receive(), max(wait, 0.001))
        except TimeoutError:
            raise HTTPException(408, f"the request body stalled after {self.seen:,} bytes (this server waits "
                                     f"{self.idle_s:g} s, then needs {MIN_RATE >> 10} KiB/s on average)") from None  # fmt: skip
        if message["type"] != "http.request":
            self.done = True
            return message
        self.seen += len(message.get("body", b""))
        self.done = not message.get("more_body")
        if self.seen > self.max_bytes:
            if message.get("more_body"):
                await _drain(self._receive, DRAIN_BYTES)
            raise too_large("the request body", self.max_bytes)
        return message


async def _drain(receive: Any, budget: int) -> None:
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body"):
            return


async def _refuse(send: Any, status: int, detail: str) -> None:
    import json

    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


FIELD_BYTES = 64 << 10  # a form field (name, notes, replace): text, never large


class _Parts:
    """python-multipart callbacks that keep each part's name, file name and bytes, and stop a part the moment it
    grows past its cap (issue 49.5: caps used to be checked only after the whole body had arrived)."""

    def __init__(self, file_bytes: int, fields: tuple[str, ...]) -> None:
        self.file_bytes, self.fields = file_bytes, fields
        self.parts: list[tuple[str, str | None, bytearray]] = []
        self.refused: HTTPException | None = None
        self._head: dict[bytes, bytes] = {}
        self._field = self._value = b""
        self._cap = 0

    def callbacks(self) -> dict:
        return {"on_part_begin": self._begin, "on_header_field": self._hfield, "on_header_value": self._hvalue,
                "on_header_end": self._hend, "on_headers_finished": self._headers, "on_part_data": self._data}  # fmt: skip

    def _begin(self) -> None:
        if len(self.parts) >= len(FILE_OF_PART) + len(self.fields):
            raise HTTPException(400, f"too many parts: at most {len(FILE_OF_PART) + len(self.fields)}")
        self._head = {}

    def _hfield(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _hvalue(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _hend(self) -> None:
        self._head[self._field.strip().lower()] = self._value.strip()
        self._field = self._value = b""

    def _headers(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, opts = parse_options_header(self._head.get(b"content-disposition", b""))
        key = opts.get(b"name", b"").decode("utf-8", "replace")
        filename = opts[b"filename"].decode("utf-8", "replace") if b"filename" in opts else None
        files = sum(1 for _, f, _ in self.parts if f is not None)
        if filename is not None and files >= len(FILE_OF_PART):
            raise HTTPException(400, f"too many files: at most {len(FILE_OF_PART)} parts, one per case file")
        if filename is None and key not in self.fields:
            raise HTTPException(422, f"unexpected form field {key!r}")
        if filename is not None and key not in FILE_OF_PART:
            raise HTTPException(422, f"unexpected part {key!r}; the parts are {', '.join(FILE_OF_PART)}")
        if any(k == key for k, _, _ in self.parts):
            raise HTTPException(422, f"part {key!r} sent twice")
        self._cap = self.file_bytes
        if filename is None:
            self._cap = FIELD_BYTES
        elif key == "manifest":  # a manifest is a few KB: its own, smaller cap (Limits), enforced as it arrives
            self._cap = min(self.file_bytes, Limits.manifest_bytes)
        self.parts.append((key, filename, bytearray()))

    def _data(self, data: bytes, start: int, end: int) -> None:
        key, _, buf = self.parts[-1]
        if len(buf) + end - start > self._cap:
            raise too_large(f"part {key!r}", self._cap)
        buf += data[start:end]


async def read_parts(request: Request, *, file_bytes: int,
                     fields: tuple[str, ...] = ()) -> tuple[dict[str, bytes | bytearray], dict[str, str]]:  # fmt: skip
    """({case file name: bytes}, {form field: text}) of a multipart upload of case files, parsed as it arrives: a part
    over its cap, an unexpected or repeated part is refused without reading what follows (the rest is drained for
    at most `DRAIN_SECONDS`, so a client still sending gets the answer)."""
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser, parse_options_header

    kind, opts = parse_options_header(request.headers.get("content-type", ""))
    if kind != b"multipart/form-data":
        raise HTTPException(415, "send the fingerprint as multipart/form-data, one part per case file")
    if not opts.get(b"boundary"):
        raise HTTPException(400, "the multipart body has no boundary in its Content-Type")
    parts = _Parts(file_bytes, fields)
    chunks = request.stream()
    try:
        parser = MultipartParser(opts[b"boundary"], parts.callbacks())
        async for chunk in chunks:
            parser.write(chunk)
        parser.finalize()
    except ClientDisconnect:
        raise Disconnected() from None
    except HTTPException as exc:
        if exc.status_code != 408 and (exc.status_code != 413 or "request body" not in str(exc.detail)):  # BodyLimit's
            await _drain_stream(chunks)
        raise
    except (FormParserError, ValueError) as exc:
        raise HTTPException(400, f"the multipart body is malformed: {str(exc)[:200]}") from None
    files: dict[str, bytes | bytearray] = {}
    values: dict[str, str] = {}
    for key, filename, data in parts.parts:
        if filename is None:
            values[key] = data.decode("utf-8", "replace")
            continue
        # kept as received (bytes-like; not copied: a part at its cap costs the server the cap once, not twice)
        files[FILE_OF_PART[key]] = inflate(data, key, file_bytes) if filename.endswith(".gz") else data
    return files, values


async def _drain_stream(chunks: Any) -> None:
    async def rest() -> None:
        async for _ in chunks:
            pass

    with contextlib.suppress(TimeoutError, asyncio.TimeoutError, ClientDisconnect, HTTPException, RuntimeError):
        await asyncio.wait_for(rest(), DRAIN_SECONDS)


def inflate(data: bytes | bytearray, what: str, limit: int) -> bytes:
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
