"""Whether an image's process loaded TensorFlow or Keras: asked by every `zen recover` before it picks a front end.

Its own module so that the question costs a dict lookup, not the import of the Keras front end (~13 ms on the
critical path of every PyTorch recovery).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zen.cpython.heap import Heap

TF_MODULES = ("tensorflow", "keras")


def has_tensorflow(heap: Heap) -> bool:
    mods = heap.sys_modules()
    return any(m in mods for m in TF_MODULES)
