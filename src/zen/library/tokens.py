"""Access tokens of a `zen serve`: who may read, add to or curate the library.

A token is 256 random bits (`zen_` + URL-safe base64), shown once when `zen serve token add` makes
it, and stored only as its sha256 in the library's `tokens` table, beside the entries it guards:
a PostgreSQL library's tokens serve every `zen serve` in front of it. A fast hash is the right one
here, unlike for passwords: nobody can enumerate 2^256 candidates, and the server finds a token by
its hash with one indexed lookup, so no comparison loop leaks timing.

Scopes nest: `read` lists, shows, exports and attributes; `add` also adds new entries and imports;
`curate` also removes and replaces entries and reads the audit table. Making and removing tokens
needs direct access to the library database (the operator's), not a token.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from zen.library.store import Conflict, Library, LibraryError, NotFound, default_who

SCOPES = ("read", "add", "curate")
PREFIX = "zen_"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a token's name and scopes (or the anonymous reader of --public-read)."""

    name: str
    scopes: frozenset[str]

    def may(self, scope: str) -> bool:
        """Scopes nest: curate > add > read."""
        return any(SCOPES.index(s) >= SCOPES.index(scope) for s in self.scopes if s in SCOPES)

    @property
    def who(self) -> str:
        return f"token:{self.name}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_scopes(scopes: Iterable[str]) -> list[str]:
    out = sorted(set(scopes), key=SCOPES.index) if set(scopes) <= set(SCOPES) else None
    if not out:
        bad = sorted(set(scopes) - set(SCOPES))
        raise LibraryError(f"unknown scope {bad[0]!r}" if bad else "a token needs at least one scope",
                           f"scopes: {', '.join(SCOPES)} (each includes the ones before it)")  # fmt: skip
    return out


def create(lib: Library, name: str, scopes: Iterable[str], *, who: str | None = None) -> str:
    """Make a token named `name` (the audit's `who` for what it does); returns the token itself,
    which is not stored anywhere."""
    if not name or name.strip() != name or len(name) > 128 or not name.isprintable():
        raise LibraryError(f"invalid token name {name!r}", "name a token after its holder, e.g. --name alice")
    scopes = check_scopes(scopes)
    token = PREFIX + secrets.token_urlsafe(32)
    with lib.transaction():
        if lib.query("SELECT 1 FROM tokens WHERE name=?", (name,)).fetchone():
            raise Conflict(f"a token named {name!r} exists",
                           "remove it first (`zen serve token remove NAME`) or choose another name")  # fmt: skip
        lib.query("INSERT INTO tokens(name, hash, scopes, created) VALUES (?,?,?,?)",
                  (name, token_hash(token), ",".join(scopes), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))  # fmt: skip
        lib.record_audit(who or default_who(), "token-add", name, {}, ",".join(scopes))
    return token


def verify(lib: Library, token: str) -> Principal | None:
    """The principal a presented token stands for, or None when the library knows no such token."""
    if not token.startswith(PREFIX) or len(token) > 256:
        return None
    row = lib.query("SELECT name, scopes FROM tokens WHERE hash=?", (token_hash(token),)).fetchone()
    return Principal(row[0], frozenset(row[1].split(","))) if row else None


def listing(lib: Library) -> list[dict]:
    rows = sorted(lib.query("SELECT name, scopes, created FROM tokens").fetchall())
    return [{"name": n, "scopes": s.split(","), "created": c} for n, s, c in rows]


def remove(lib: Library, name: str, *, who: str | None = None) -> None:
    with lib.transaction():
        gone = lib.query("DELETE FROM tokens WHERE name=? RETURNING id", (name,)).fetchone()
        if gone:
            lib.record_audit(who or default_who(), "token-remove", name)
    if not gone:
        raise NotFound(f"no token named {name!r}", "`zen serve token list` shows them")
