"""Tables that fit the terminal: a table wider than the console is printed as one block per row instead.

Rich shrinks a wide table by cutting every cell ("ti…", "0.…"): on an 80-column terminal or a pipe, `zen attribute`'s
14 columns showed no value at all (issue 51). A row printed as `column: value` lines loses nothing; `--json` stays
the form for programs.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_rows(out: Console, columns: list[str], rows: list[list[str]]) -> None:
    """`rows` (already escaped for rich markup) as a table when it fits `out`'s width, else as blocks."""
    t = Table(*columns)
    for r in rows:
        t.add_row(*r)
    natural = out.measure(t, options=out.options.update(max_width=1 << 16)).maximum  # unshrunk: measure is capped
    if natural <= out.width:
        out.print(t)
        return
    width = max(len(c) for c in columns[1:]) if len(columns) > 1 else 0
    for r in rows:
        out.print(f"[bold]{r[0]}[/bold]", soft_wrap=True)
        for c, v in zip(columns[1:], r[1:]):
            out.print(f"  {c.ljust(width)}  {v}", soft_wrap=True)
