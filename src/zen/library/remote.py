"""The library behind a `zen serve`, reached over HTTP(S) with httpx.

`--library https://HOST[:PORT]` gives the commands an object with the library's methods, each one
request to the server's API (zen.serve.app). What travels is fingerprints, never images or
weights: `add_case` uploads a case's bundle (mr.json, pr.json, ur.json, code.marshal and the
manifest vouching for them: zen.library.bundle), `attribute_case` uploads the query's mr.json and
pr.json and gets back the server's `zen attribute --json` result, computed against the whole
library there with the same code as locally. Files uploaded to a server that is not on this
machine are gzip-compressed (a transformers pr.json: 23 MB, 5.7 MB compressed).

Credentials: the bearer token in `$ZEN_LIBRARY_TOKEN` (from `zen serve token add`); a server whose
certificate is signed by a private CA is trusted with `$ZEN_LIBRARY_CA` (a PEM file). Every
failure is one LibraryError line: the server's own reason for a 4xx, what to do for 401/403.
"""

from __future__ import annotations

import gzip
import json
import os
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from zen.library.store import Conflict, Entry, LibraryError, NotFound, _pack

MAX_RESPONSE = 1 << 30  # bytes of one answer (a whole-library export is the largest)
LOOPBACK = ("localhost", "127.0.0.1", "::1")
TOKEN_ENV, CA_ENV = "ZEN_LIBRARY_TOKEN", "ZEN_LIBRARY_CA"


class RemoteLibrary:
    """A `zen serve` library; use as a context manager or call `close()`."""

    kind = "http"
    remote = True

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 600.0) -> None:
        try:
            import httpx
        except ImportError:
            raise LibraryError("an http(s):// library needs httpx", "pip install 'zen-forensics[service]'") from None
        self._httpx = httpx
        self.url = url.rstrip("/")
        self.path = self.url
        parts = urlsplit(self.url)
        if not parts.hostname or parts.query or parts.fragment:
            raise LibraryError(f"{url} is not a zen serve URL", "give it as http(s)://HOST[:PORT][/PREFIX]")
        self.compress = parts.hostname not in LOOPBACK
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token.strip()}"} if token else {}
        verify: Any = True
        if os.environ.get(CA_ENV):
            try:
                verify = ssl.create_default_context(cafile=os.environ[CA_ENV])
            except (OSError, ssl.SSLError) as exc:
                raise LibraryError(f"cannot use ${CA_ENV} ({os.environ[CA_ENV]}): {exc}") from None
        self.client = httpx.Client(base_url=self.url, headers=headers, verify=verify,
                                   timeout=httpx.Timeout(timeout, connect=15.0))  # fmt: skip
        self._fetched: dict[str, dict] = {}

    # -- transport -------------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        httpx = self._httpx
        try:
            with self.client.stream(method, path, **kwargs) as resp:
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE:
                        raise LibraryError(f"{self.url} sent more than {MAX_RESPONSE:,} bytes for {path}")
        except httpx.HTTPError as exc:
            raise LibraryError(f"cannot reach the library server {self.url}: {exc or type(exc).__name__}",
                               "check the URL and that `zen serve` runs there") from None  # fmt: skip
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        if resp.status_code < 400:
            if data is None and body:
                raise LibraryError(f"{self.url} answered {path} with something that is not JSON")
            return data
        self._fail(resp.status_code, data)

    def _fail(self, status: int, data: Any) -> None:
        detail = data.get("detail") if isinstance(data, dict) else None
        reason = detail if isinstance(detail, str) else f"HTTP {status}"
        hint = data.get("hint") if isinstance(data, dict) and isinstance(data.get("hint"), str) else None
        msg = f"{self.url}: {reason}"
        if status == 401:
            raise LibraryError(msg, hint or f"set ${TOKEN_ENV} to a token from the server's operator (`zen serve token add`)")
        if status == 403:
            raise LibraryError(msg, hint or "ask the operator for a token with the scope this needs")
        if status == 404:
            raise NotFound(msg, hint)
        if status == 409:
            raise Conflict(msg, hint)
        raise LibraryError(msg, hint)

    def _files(self, files: dict[str, bytes]) -> dict[str, tuple[str, bytes, str]]:
        """Multipart parts, one per case file; gzip-compressed when the server is not this machine."""
        from zen.library.bundle import PART_OF_FILE

        parts = {}
        for name, data in files.items():
            if self.compress:
                parts[PART_OF_FILE[name]] = (name + ".gz", gzip.compress(data, 1), "application/gzip")
            else:
                parts[PART_OF_FILE[name]] = (name, data, "application/octet-stream")
        return parts

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteLibrary:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return self._call("GET", "/library")

    def __len__(self) -> int:
        return int(self.info()["entries"])

    def schema_version(self) -> int:
        return int(self.info()["schema"])

    def list(self) -> list[dict]:
        return self._call("GET", "/models")

    def search(self, **filters: str | None) -> list[dict]:
        return self._call("GET", "/models", params={k: v for k, v in filters.items() if v is not None})

    def show(self, name: str) -> dict[str, Any]:
        return self._call("GET", _model_path("/models", name))

    def _fingerprint(self, name: str) -> dict:
        if name not in self._fetched:
            from zen.library.exchange import checked_models

            item = self._call("GET", _model_path("/fingerprints", name))
            checked_models({"format": 1, "kind": "zen-library-export", "models": [item]}, f"{self.url} ({name})")
            self._fetched = {name: item}  # the last one only: diff and reuse read one entry and its code
        return self._fetched[name]

    def get(self, name: str) -> Entry:
        it = self._fingerprint(name)
        return Entry(0, it["name"], it.get("created") or "", it.get("source_sha256"), it.get("python"), it.get("torch"),
                     it.get("root_class"), it.get("summary") or {}, it.get("notes") or "", _pack(it["mr"]), _pack(it["pr"]),
                     _pack(it["ur"]))  # fmt: skip

    def entries(self, names: Iterable[str] | None = None) -> list[Entry]:
        wanted = sorted(names) if names is not None else [r["name"] for r in self.list()]
        return [self.get(n) for n in wanted]

    def code(self, name: str) -> bytes | None:
        import base64

        blob = self._fingerprint(name).get("code_marshal")
        return base64.b64decode(blob) if blob else None

    def audit_log(self, *, name: str | None = None, limit: int = 100) -> list[dict]:
        return self._call("GET", "/audit", params={"limit": limit, **({"name": name} if name is not None else {})})

    def attribute_case(self, case_dir: Path, *, optimal: bool = True) -> dict[str, Any]:
        """The server's attribution of a case (as `Attribution.to_json()`); only mr.json and pr.json
        travel, checked against the case's manifest first."""
        from zen.library.bundle import Bundle

        files = Bundle.from_case(case_dir, query=True).files
        return self._call("POST", "/attribute", params={"optimal": str(optimal).lower()}, files=self._files(files))

    # -- writing ---------------------------------------------------------------------------------------
    def add_case(self, case_dir: Path, name: str, *, replace: bool = False, notes: str = "", who: str | None = None) -> int:
        """Upload a case's fingerprint bundle (the server records its token's name as who added it)."""
        from zen.library.bundle import Bundle
        from zen.library.names import check_name

        check_name(name)  # before the upload: the server enforces the same rule
        files = Bundle.from_case(case_dir).files
        res = self._call("POST", "/models", data={"name": name, "notes": notes, "replace": str(replace).lower()},
                         files=self._files(files))  # fmt: skip
        return int(res.get("id", 0))

    def add(self, *args: Any, **kwargs: Any) -> int:
        raise LibraryError("a zen serve library takes fingerprints from cases", "use `zen library add CASE --name NAME`")

    def remove(self, name: str, *, who: str | None = None) -> None:
        self._call("DELETE", _model_path("/models", name))

    def export_data(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        return self._call("GET", "/export", params=[("name", n) for n in names] if names is not None else None)

    def export(self, path: Path, names: Iterable[str] | None = None) -> int:
        from zen.library.exchange import checked_models
        from zen.represent import textio

        data = self.export_data(names)
        checked_models(data, self.url)
        textio.write_json(path, data)
        return len(data["models"])

    def import_(self, path: Path, *, replace: bool = False, who: str | None = None) -> list[str]:
        from zen.library.exchange import read_export

        read_export(path)  # a regular file of bounded JSON before it is sent
        res = self._call("POST", "/import", params={"replace": str(replace).lower()}, content=Path(path).read_bytes(),
                         headers={"Content-Type": "application/json"})  # fmt: skip
        return list(res["imported"])

    # -- what only a local library does ---------------------------------------------------------------
    def _local_only(self, *args: Any, **kwargs: Any) -> Any:
        raise LibraryError("attribution against a zen serve library runs on the server", "use `zen attribute CASE --library URL`")

    sharing = mr_invariants = views_blob = code_bodies = entry_bodies = _local_only


def _model_path(route: str, name: str) -> str:
    """The URL path of one entry. A name outside the library's rule (`.`, `..`, control characters) could not have
    been added, and in a URL it would address something else (httpx removes dot segments: `/models/.` lists)."""
    from zen.library.names import check_name

    return f"{route}/{quote(check_name(name), safe='')}"
