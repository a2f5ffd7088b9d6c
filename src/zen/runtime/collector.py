"""CPython's cyclic garbage collector paused while zen reads an image.

A recovery allocates millions of small, acyclic, long-lived objects: census address lists, ~10,000
type records, the closure's instructions and namespaces, code and class records, encoded values.
The collector would traverse the growing heap again and again to free almost nothing: measured on
a GPT-2 recovery, 0.1-0.2 s of the census and model stage (0.56-0.61 s with it off against
0.66-0.84 s on) and ~10% of the code stage's CPU. What a paused stretch leaves for it is collected
as usual once it is back on (one pass over the objects made meanwhile). Reference counting frees
everything acyclic as before, so memory grows only by the cycles made meanwhile (readers catch
their errors per object and keep no exception objects).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside; the collector's state (on, or off where the caller turned it off) restored after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
