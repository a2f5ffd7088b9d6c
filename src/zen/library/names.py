"""The one rule for library entry names, enforced wherever an entry is made (every backend, the server, import).

A name travels in URLs (`/models/{name}`), in audit logs and in reports, and a curator must be able to show and
remove every entry anyone could add (issue 49.5: names `.`, `..` and names with a newline could be added through
`zen serve` and then neither shown nor removed through it; httpx drops dot segments even percent-encoded, the
route does not match a newline). So a name is printable text (no control characters: newline, tab, escape...),
without surrounding spaces, valid Unicode (PostgreSQL text holds no NUL or lone surrogates), at most MAX_NAME
characters, and not a URL dot segment. Every such name round-trips through the client's quoting (`quote(name,
safe='')`: `/`, `%`, `?`, `#` and spaces included).
"""

from __future__ import annotations

from typing import Any

from zen.library.errors import LibraryError

MAX_NAME = 512
DOT_SEGMENTS = frozenset({".", ".."})


def check_name(name: Any) -> str:
    """`name` if it follows the rule, else a LibraryError saying which part it breaks (exit 2)."""
    hint = f"use printable text (at most {MAX_NAME} characters) without surrounding spaces, other than '.' and '..'"
    if type(name) is not str or not name:
        raise LibraryError(f"invalid model name {name!r}: empty or not text", hint)
    if len(name) > MAX_NAME:
        raise LibraryError(f"invalid model name {name[:40]!r}...: {len(name)} characters (at most {MAX_NAME})", hint)
    if name.strip() != name:
        raise LibraryError(f"invalid model name {name!r}: it begins or ends with a space", hint)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise LibraryError(f"invalid model name {name!r}: not valid Unicode text", hint) from None
    if not name.isprintable():
        raise LibraryError(f"invalid model name {name!r}: it holds a control character (newline, tab, ...)", hint)
    if name in DOT_SEGMENTS:
        raise LibraryError(f"invalid model name {name!r}: a URL dot segment, which no client can address", hint)
    return name
