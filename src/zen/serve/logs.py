"""What the server's access log may say: the request line without its query string.

A client that sends its token as `?token=...` (or any secret in a query) is refused, but uvicorn's access log
printed the whole request line, so the secret landed in clear text in a file operators keep and share (issue
49.5). Paths carry entry names, which are not secrets; queries never reach the log.
"""

from __future__ import annotations

import logging


class NoQuery(logging.Filter):
    """Drops the query string from uvicorn's access records (args: client, method, path, http version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?[query not logged]", *args[3:])
        return True
