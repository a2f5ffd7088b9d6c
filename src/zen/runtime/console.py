"""Terminal output that strings from an image cannot break.

The CLI styles its output with rich markup (`[bold]...[/bold]`), and much of what it prints comes
from the image: class, module and file names, error messages quoting them. Such strings are
escaped where they are printed; as a second line of defence, a line whose markup still does not
parse (a name like `Net[/bold]` missed somewhere) is printed as plain text instead of crashing
the command. Nothing is dropped either way.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.errors import MarkupError


class SafeConsole(Console):
    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        try:
            super().print(*objects, **kwargs)
        except MarkupError:
            saved, self._markup = self._markup, False  # also for strings inside tables and panels
            try:
                super().print(*objects, **{**kwargs, "markup": False})
            finally:
                self._markup = saved

    def print_json(self, json: str | None = None, **kwargs: Any) -> None:  # type: ignore[override]
        """Into a file or pipe (not a terminal: no colours), the same text rich writes, without rich: its
        highlighting pass over a command's `--json` took 12 ms of `zen attribute` for 10 KB. A terminal, a
        capture or any option but the JSON text goes through rich."""
        if json is None or kwargs or self.is_terminal or self.record or self._buffer_index:
            return super().print_json(json, **kwargs)
        import json as json_module

        text = json_module.dumps(json_module.loads(json), indent=2, ensure_ascii=False) + "\n"
        self.file.write(text)
        self.file.flush()


def consoles() -> tuple[SafeConsole, SafeConsole]:
    """(stdout, stderr) consoles as every zen command uses them."""
    return SafeConsole(highlight=False), SafeConsole(stderr=True, highlight=False)
