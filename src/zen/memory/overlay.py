"""An address space with some bytes overwritten: what the fuzzing harnesses make of a real image.

A subclass of `AddressSpace` that rewrites bytes in `read` corrupts only the readers that call `read`: the bulk
readers (`scan.gather_u64`, `bulk`) and the compiled object reader (`native/objects.c`) read the image's buffers
through `AddressSpace.chunk_table` and would see the original bytes. Here the pages holding the new bytes become
chunks of their own (copies, with the bytes written in), and every other byte stays in its original chunk, split
around them: every kind of reader then sees the same, corrupted, image.
"""

from __future__ import annotations

from zen.memory.space import AddressSpace, BytesChunk, Chunk, MmapChunk

PAGE = 4096
MAX_PAGES = 1 << 16  # pages copied at most (256 MB): a patch set is a few words, not an image


def overlay(space: AddressSpace, patches: dict[int, bytes]) -> AddressSpace:
    """`space` with `patches` (address -> bytes, applied in order, later ones over earlier ones) written in; bytes
    at addresses no chunk holds are dropped. Chunks holding a patched page must have a buffer (`backing`)."""
    pages = sorted({p for at, blob in patches.items() for p in range(at - at % PAGE, at + len(blob), PAGE)})
    if len(pages) > MAX_PAGES:
        raise ValueError(f"{len(pages)} pages to copy for the patches: at most {MAX_PAGES}")
    chunks: list[Chunk] = []
    i = 0
    for c in space.chunks:
        while i < len(pages) and pages[i] + PAGE <= c.start:
            i += 1
        mine = []
        j = i
        while j < len(pages) and pages[j] < c.end:
            mine.append(pages[j])
            j += 1
        if not mine:
            chunks.append(c)
            continue
        pos = c.start
        for p in mine:
            lo, hi = max(p, c.start), min(p + PAGE, c.end)
            if lo > pos:
                chunks.append(_part(c, pos, lo))
            data = bytearray(c.read(lo - c.start, hi - lo))
            for at, blob in patches.items():
                a, b = max(at, lo), min(at + len(blob), hi)
                if a < b:
                    data[a - lo : b - lo] = blob[a - at : b - at]
            chunks.append(BytesChunk(lo, bytes(data), c.source))
            pos = hi
        if pos < c.end:
            chunks.append(_part(c, pos, c.end))
    return AddressSpace(space.regions, chunks, description=f"{space.description} (overwritten)")


def _part(c: Chunk, start: int, end: int) -> Chunk:
    """Bytes [start, end) of chunk `c`, from the same buffer."""
    get = getattr(c, "backing", None)
    if get is None:
        raise ValueError(f"a chunk at {c.start:#x} has no buffer to split around overwritten bytes")
    buf, off = get()
    if isinstance(buf, bytes):
        return BytesChunk(start, buf[off + start - c.start : off + end - c.start], c.source)
    return MmapChunk(start, end, buf, off + start - c.start, c.source)
