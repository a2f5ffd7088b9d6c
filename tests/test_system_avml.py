"""Compressed AVML images (AVML version 2, microsoft/avml's `--compress` output).

The files are built here as avml builds them (src/image.rs, src/io/snappy.rs): for each range of at
most 16 MiB that is not all zero, a 32-byte header (magic "AVML", version 2, first and last physical
address, 8 zero bytes), the range as one snappy framed stream made by the `snap` crate's
FrameEncoder (cramjam wraps the same crate; a test checks that the hand-built chunks below equal
its output byte for byte), and the stream's length as a little-endian u64.

What is checked: the segment table and zen's reads of physical bytes (against Volatility's own
AVML layer), and that every cut, corrupt or hostile file is refused with a sentence naming the
range, in bounded time. Volatility 3's AVML reader (2.28) spins forever on a stream that ends
before its range is complete, so zen must never hand it one: the tests run under an alarm, so a
hang fails instead of blocking the run. On the real guest: AVML images made from its raw and LiME
images give what their source gives (the same case files, or the same refusal where the LiME of the
running guest is not one consistent instant), the same process list and the same pages, and a
cut-short copy is refused clearly.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import signal
import struct
import time
from pathlib import Path

import pytest
from conftest import zen

from zen.memory.system.formats import AVML_MAGIC, LIME_MAGIC, MAX_SEGMENTS, open_physical, sniff
from zen.runtime.errors import ImageError

cramjam = pytest.importorskip("cramjam")

PAGE = 4096
AVML_BLOCK = 1 << 24  # avml's MAX_BLOCK_SIZE: ranges are cut into blocks of 16 MiB
SNAPPY_CHUNK = 1 << 16  # the snap crate frames 64 KiB at a time


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the test run) when the body takes longer than `seconds`."""

    def expired(*_):
        raise TimeoutError(f"did not finish within {seconds} s: an unbounded loop?")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- the format, built by hand ------------------------------------------------------------------
def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """The framing format's checksum: CRC-32C of the uncompressed bytes, rotated and offset."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def chunk(kind: int, payload: bytes) -> bytes:
    return bytes([kind]) + len(payload).to_bytes(3, "little") + payload


STREAM_ID = chunk(0xFF, b"sNaPpY")


def data_chunk(data: bytes, compressed: bool | None = None) -> bytes:
    """One chunk as the snap crate writes it: a snappy block when that saves at least 1/8."""
    crc = masked_crc32c(data).to_bytes(4, "little")
    packed = bytes(cramjam.snappy.compress_raw(data))
    if compressed is None:
        compressed = len(packed) < len(data) - len(data) // 8
    return chunk(0x00, crc + packed) if compressed else chunk(0x01, crc + data)


def framed(data: bytes) -> bytes:
    return STREAM_ID + b"".join(data_chunk(data[i : i + SNAPPY_CHUNK]) for i in range(0, len(data), SNAPPY_CHUNK))


def avml_range(
    start: int, data: bytes, *, stream: bytes | None = None, last: int | None = None, trailer: int | None = None,
    padding: int = 0, version: int = 2,
) -> bytes:  # fmt: skip
    """One AVML range: header (last address inclusive), framed stream, stream length."""
    stream = bytes(cramjam.snappy.compress(data)) if stream is None else stream
    last = start + len(data) - 1 if last is None else last
    header = struct.pack("<IIQQQ", AVML_MAGIC, version, start, last, padding)
    return header + stream + struct.pack("<Q", len(stream) if trailer is None else trailer)


def to_avml(src: Path, dst: Path, kind: str = "lime") -> int:
    """Convert a LiME or raw file to AVML version 2 exactly as avml writes it (`avml --compress`,
    `avml convert --format lime_compressed [--source-format raw]`): each range (a raw file is one
    range from physical 0) cut into 16 MiB blocks from its start, all-zero blocks left out, each
    block framed by the snap crate (through cramjam). Returns the number of AVML ranges written."""
    written = 0
    with open(src, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm, open(dst, "wb") as out:
        ranges, off = [], 0
        while kind == "lime" and off + 32 <= len(mm):
            magic, version, start, last, _ = struct.unpack_from("<IIQQQ", mm, off)
            assert (magic, version) == (LIME_MAGIC, 1), f"not a LiME header at {off:#x}"
            ranges.append((start, off + 32, last - start + 1))
            off += 32 + last - start + 1
        for start, data, length in ranges if kind == "lime" else [(0, 0, len(mm))]:
            for pos in range(0, length, AVML_BLOCK):
                block = mm[data + pos : data + min(length, pos + AVML_BLOCK)]
                if block.count(0) == len(block):
                    continue
                out.write(avml_range(start + pos, block))
                written += 1
    return written


def text_pages(n: int, seed: str) -> bytes:
    """Pages that compress to about half (so that a few make a file of several pages, and a range
    stays compressible) and differ from page to page (to tell misplaced reads apart)."""
    rnd = random.Random(seed)
    return b"".join(rnd.randbytes(PAGE // 2) + (f"{seed} page {i:05d} " * 200).encode()[: PAGE // 2] for i in range(n))


def volatility_read(path: Path, phys: int, size: int) -> bytes:
    """The same bytes through Volatility 3's own AVML layer (what the kernel bridge stacks)."""
    from volatility3.framework import contexts
    from volatility3.framework.layers import avml, physical

    ctx = contexts.Context()
    ctx.config["f.location"] = path.resolve().as_uri()
    ctx.add_layer(physical.FileLayer(ctx, "f", "file"))
    layer = avml.AVMLStacker.stack(ctx, "file")
    assert layer is not None, "Volatility does not recognise the AVML file (is libsnappy installed?)"
    ctx.add_layer(layer)
    return ctx.layers.read(layer.name, phys, size)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def refused(p: Path, match: str, seconds: int = 10) -> ImageError:
    with deadline(seconds), pytest.raises(ImageError, match=match) as err:
        open_physical(p, "avml")
    assert "AVML" in err.value.message
    return err.value


# -- unit tests on small files --------------------------------------------------------------------
def test_hand_built_chunks_equal_the_snap_crates():
    """The builders above write what avml writes (so the hostile variants below are faithful)."""
    data = text_pages(20, "a") + os.urandom(40 * PAGE) + bytes(9 * PAGE) + text_pages(3, "b")[:1000]
    stream = framed(data)
    assert stream == bytes(cramjam.snappy.compress(data))
    kinds, pos = [], 0
    while pos < len(stream):
        kinds.append(stream[pos])
        pos += 4 + int.from_bytes(stream[pos + 1 : pos + 4], "little")
    assert kinds[0] == 0xFF and {0x00, 0x01} <= set(kinds[1:]) <= {0x00, 0x01}


def test_round_trip_of_ranges_and_bytes(tmp_path):
    a = text_pages(3, "a")
    b = text_pages(36, "b")[: 16 * PAGE] + os.urandom(16 * PAGE) + text_pages(36, "c")[: 4 * PAGE]  # a stored chunk
    c = text_pages(5, "d")  # adjacent to b: one physical run across two AVML ranges
    p = write(tmp_path, "m.avml", avml_range(0x1000, a) + avml_range(0x100000, b) + avml_range(0x100000 + len(b), c))
    assert sniff(p) == "avml"
    with deadline(20):
        img = open_physical(p, "avml")
        assert [(s.start, s.length, s.file_offset) for s in img.segments] == [
            (0x1000, len(a), None), (0x100000, len(b), None), (0x100000 + len(b), len(c), None),
        ]  # fmt: skip
        assert not img.problems and not img.mmappable and img.format == "avml"
        assert img.physical_bytes == len(a) + len(b) + len(c)
        assert img.physical_run(0x1000 + 5, 1 << 20) == (0x1005, len(a) - 5)
        assert img.physical_run(0x100000 + 7, 1 << 30) == (0x100007, len(b) + len(c) - 7)
        assert img.physical_run(0x5000, 1) is None
        assert img.avml.read(0x1000, len(a)) == a
        assert img.avml.read(0x100000, len(b) + len(c)) == b + c  # across chunks and ranges
        for phys, want in ((0x100000 + SNAPPY_CHUNK - 3, b[SNAPPY_CHUNK - 3 : SNAPPY_CHUNK + 9]), (0x1000 + 4093, a[4093:4100])):
            assert img.avml.read(phys, len(want)) == want
        # what Volatility's layer reads from the same file (it walks the same chunks)
        assert volatility_read(p, 0x100000, len(b) + len(c)) == b + c
        assert volatility_read(p, 0x1000, len(a)) == a
        img.avml.close()


def test_skippable_chunks_are_skipped_by_both_readers(tmp_path):
    data = text_pages(20, "s")
    stream = (
        STREAM_ID + chunk(0xFE, b"\0" * 7) + data_chunk(data[:SNAPPY_CHUNK]) + chunk(0x80, b"x") + data_chunk(data[SNAPPY_CHUNK:])
    )
    p = write(tmp_path, "pad.avml", avml_range(0, data, stream=stream))
    with deadline(20):
        img = open_physical(p, "avml")
        assert img.avml.read(0, len(data)) == data == volatility_read(p, 0, len(data))


def test_conversion_leaves_out_zero_blocks_and_cuts_16_mib(tmp_path):
    body = bytes(AVML_BLOCK) + text_pages(4096, "z") + text_pages(3, "t")  # zero block, full block, tail
    src = write(tmp_path, "m.lime", struct.pack("<IIQQQ", LIME_MAGIC, 1, 0x100000, 0x100000 + len(body) - 1, 0) + body)
    dst = tmp_path / "m.avml"
    assert to_avml(src, dst) == 2
    with deadline(30):
        img = open_physical(dst, "avml")
        assert [(s.start, s.length) for s in img.segments] == [
            (0x100000 + AVML_BLOCK, AVML_BLOCK),
            (0x100000 + 2 * AVML_BLOCK, 3 * PAGE),
        ]
        assert img.avml.read(0x100000 + AVML_BLOCK, len(body) - AVML_BLOCK) == body[AVML_BLOCK:]


def boundaries(blob: bytes) -> list[int]:
    """File offsets where a header, chunk or trailer of an AVML file starts."""
    out, off = [], 0
    while off < len(blob):
        _, _, start, last, _ = struct.unpack_from("<IIQQQ", blob, off)
        out.append(off)
        pos, total = off + 32, 0
        while total < last - start + 1:
            out.append(pos)
            kind, n = blob[pos], int.from_bytes(blob[pos + 1 : pos + 4], "little")
            if kind == 0x01:
                total += n - 4
            elif kind == 0x00:
                total += len(cramjam.snappy.decompress_raw(blob[pos + 8 : pos + 4 + n]))
            pos += 4 + n
        out.append(pos)
        off = pos + 8
    return out


def test_cut_anywhere_is_refused_in_bounded_time(tmp_path):
    """Every prefix of a two-range file is refused with 'truncated' (Volatility would spin on
    most of them), except the one that ends exactly after the first range: that is a whole file.
    Cuts are made around every header, chunk and trailer, and every 509 bytes in between."""
    first = avml_range(0x1000, text_pages(20, "x"))
    whole = first + avml_range(0x400000, text_pages(18, "y"))
    cuts = {c for b in boundaries(whole) for c in range(b - 3, b + 13)} | set(range(0, len(whole), 509))
    with deadline(120):
        for cut in sorted(c for c in cuts if PAGE <= c < len(whole)):
            p = write(tmp_path, "cut.avml", whole[:cut])
            if cut == len(first):
                assert len(open_physical(p, "avml").segments) == 1
                continue
            with pytest.raises(ImageError) as err:
                open_physical(p, "avml")
            text = f"{err.value.message} {err.value.hint}"
            assert "truncated" in text and "AVML" in text, (cut, text)


@pytest.mark.parametrize("kind", [0x02, 0x40, 0x7F])
def test_unskippable_chunk_types_are_refused(tmp_path, kind):
    data = text_pages(4, "u")
    stream = STREAM_ID + chunk(kind, b"\0" * 12) + data_chunk(data)
    err = refused(
        write(tmp_path, "u.avml", avml_range(0x2000, data, stream=stream)), f"unskippable snappy chunk of type {kind:#x}"
    )
    assert "0x2000-0x5fff" in err.message and "file offset 0x0" in err.message


FILLER = avml_range(1 << 32, text_pages(4, "filler"))  # keeps a file above zen's minimum of a page


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: avml_range(0, d, stream=framed(d)[10:]), "does not start with the snappy stream identifier"),
        (lambda d: avml_range(0, d, stream=chunk(0xFF, b"sNaPpX") + framed(d)[10:]), "bad snappy stream identifier"),
        (
            lambda d: avml_range(0, d, stream=STREAM_ID + chunk(0x00, b"\0" * 4 + _varint(70_000) + b"\0" * 20)) + FILLER,
            "claims 70,000",
        ),
        (lambda d: avml_range(0, d, stream=STREAM_ID + chunk(0x00, b"\0" * 4 + b"\xff" * 6)) + FILLER, "no readable length"),
        (lambda d: avml_range(0, d, stream=STREAM_ID + chunk(0x01, b"\0" * 4) + framed(d)[10:]), "claims 0 bytes"),
        (lambda d: avml_range(0, d, last=len(d) - PAGE - 1), "hold 16,384 bytes but the header says 12,288"),
        (lambda d: avml_range(0, d, trailer=12345), "trailer gives a stream of 12,345 bytes"),
        (lambda d: avml_range(0, os.urandom(len(d))), "incompressible"),
        (lambda d: avml_range(0, d, version=1), "no AVML version 2 range header"),
        (lambda d: avml_range(0x9000, d) + avml_range(0x1000, d), "out of order"),
        (lambda d: avml_range(0, d) + avml_range(0x2000, d), "out of order"),  # overlaps the first
        (lambda d: avml_range(0, d) + b"\0" * 40, "no AVML version 2 range header at file offset"),
        (lambda d: avml_range(0, d) + b"junk", "the 4 bytes after the last complete AVML range"),
        (lambda d: avml_range(1 << 60, d), "impossible"),
    ],
)
def test_malformed_files_are_refused_clearly(tmp_path, make, match):
    refused(write(tmp_path, "bad.avml", make(text_pages(4, "m"))), match)


def test_header_claiming_more_than_its_stream_is_refused(tmp_path):
    """The walk then reads the trailer and the next header as chunks: whatever it finds, it must
    end in a refusal, never in a segment table Volatility would read differently."""
    d = text_pages(4, "o")
    for extra in (1, PAGE, 1 << 30):
        refused(
            write(tmp_path, "more.avml", avml_range(0, d, last=len(d) - 1 + extra) + avml_range(1 << 32, d)), "AVML range 0x0-"
        )


def test_nonzero_padding_is_a_problem_not_a_refusal(tmp_path):
    d = text_pages(4, "p")
    img = open_physical(write(tmp_path, "pad.avml", avml_range(0, d, padding=7)), "avml")
    assert img.avml.read(0, len(d)) == d and any("padding" in x for x in img.problems)


def test_chunk_flood_is_bounded(tmp_path):
    """A range claiming 1 GiB whose stream is 200,000 empty padding chunks (or 1-byte data chunks)
    is refused after a few chunks, not walked to the end."""
    for flood in (chunk(0xFE, b""), chunk(0x01, b"\0" * 4 + b"z")):
        stream = STREAM_ID + flood * 200_000
        p = write(tmp_path, "flood.avml", avml_range(0, b"", stream=stream, last=(1 << 30) - 1))
        t = time.perf_counter()
        refused(p, "corrupt or hostile: 17 snappy chunks")
        assert time.perf_counter() - t < 1


def test_header_flood_is_bounded(tmp_path):
    """MAX_SEGMENTS + 10 valid one-page ranges: refused after MAX_SEGMENTS, quickly."""
    page = bytes(PAGE - 1) + b"\1"
    one = avml_range(0, page)
    head = struct.Struct("<IIQQQ")
    blob = bytearray()
    for i in range(MAX_SEGMENTS + 10):
        blob += head.pack(AVML_MAGIC, 2, i * PAGE, i * PAGE + PAGE - 1, 0) + one[32:]
    p = write(tmp_path, "flood.avml", bytes(blob))
    t = time.perf_counter()
    refused(p, f"more than {MAX_SEGMENTS} AVML ranges", seconds=60)
    assert time.perf_counter() - t < 30


# -- the real guest -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def guest_avml(guest, tmp_path_factory):
    """The guest's images converted to AVML as avml converts them, made on first use."""
    made: dict[str, Path] = {}
    where = tmp_path_factory.mktemp("avml")

    def get(kind: str) -> Path:
        if kind not in guest["images"]:
            pytest.skip(f"no {kind} image of the guest")
        if kind not in made:
            src, dst = guest["images"][kind], where / f"guest-{kind}.avml"
            t = time.perf_counter()
            n = to_avml(src, dst, kind)
            print(f"\n{kind} {src.stat().st_size:,} bytes -> AVML {dst.stat().st_size:,} bytes, {n} ranges, "
                  f"{time.perf_counter() - t:.1f} s")  # fmt: skip
            made[kind] = dst
        return made[kind]

    yield get
    for p in made.values():
        p.unlink(missing_ok=True)


def _outcome(res) -> tuple[int, str]:
    """Exit code and the last clause of the error line (the part that does not name the image)."""
    lines = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    return res.returncode, lines[0].rsplit(": ", 1)[-1] if lines else ""


@pytest.mark.parametrize("kind", ["raw", "lime"])
def test_avml_gives_the_case_of_its_source(guest, guest_avml, tmp_path, kind):  # noqa: F811
    """The AVML made from an image recovers exactly what the image itself does: the same files,
    or (LiME of the running guest is not one instant) the same refusal."""
    avml = guest_avml(kind)
    mid = hex(guest["target"].truth["variants"]["convnet_se"]["model_id"])
    runs, seconds = {}, {}
    for name, image in (("source", guest["images"][kind]), ("avml", avml)):
        t = time.perf_counter()
        runs[name] = zen("recover", image, "--symbols", guest["symbols"], "-o", tmp_path / name, "--model", mid, check=False)
        seconds[name] = time.perf_counter() - t
    print(f"\nrecover convnet_se: {kind} {seconds['source']:.1f} s, AVML of it {seconds['avml']:.1f} s")
    assert "Traceback" not in runs["avml"].stderr
    assert _outcome(runs["avml"]) == _outcome(runs["source"]), (runs["source"].stderr, runs["avml"].stderr)
    if runs["source"].returncode in (0, 5):
        for f in ("weights.safetensors", "mr.json", "pr.json", "ur.json", "code.marshal"):
            assert (tmp_path / "avml" / f).read_bytes() == (tmp_path / "source" / f).read_bytes(), f
        ev = json.loads((tmp_path / "avml" / "manifest.json").read_text())["evidence"]
        assert ev["system"]["format"] == "avml" and ev["pid"] == guest["record"]["workload_pid"]
    else:
        assert kind == "lime", runs["source"].stderr  # the paused instant (raw) must recover


def test_ps_of_the_avml_lists_the_lime_processes(guest, guest_avml):  # noqa: F811
    def ps(image):
        return json.loads(zen("ps", image, "--symbols", guest["symbols"], "--all", "--json", timeout=900).stdout)

    a, b = ps(guest_avml("lime")), ps(guest["images"]["lime"])
    assert a["format"] == "avml" and a["processes"] == b["processes"]
    assert any(p["pid"] == guest["record"]["workload_pid"] and p["torch"] for p in a["processes"])


def test_cut_short_avml_of_the_guest_is_refused_clearly(guest_avml, guest, tmp_path):  # noqa: F811
    whole = guest_avml("lime")
    cut = tmp_path / "cut.avml"
    with open(whole, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(whole.stat().st_size * 3 // 4))
    t = time.perf_counter()
    res = zen("recover", cut, "--symbols", guest["symbols"], "-o", tmp_path / "case", check=False, timeout=300)
    assert res.returncode in (2, 5), res.stderr
    assert "Traceback" not in res.stderr and "truncated" in res.stderr and "AVML range" in res.stderr, res.stderr
    assert time.perf_counter() - t < 120


def test_page_walks_over_the_avml_agree(guest, guest_avml):  # noqa: F811
    """zen's table-at-a-time walk over the AVML frames holds every page Volatility's page-by-page
    walk holds, with the same bytes, and the same bytes as the LiME image.

    Not the same chunks: avml cuts ranges into 16 MiB blocks from their start (the LiME's second
    range starts at 1 MiB) and leaves all-zero blocks out, so a 2 MiB page can be half in the
    image; Volatility's mapping then drops the whole page silently, zen keeps the half it has and
    reports the rest missing. Any page the LiME image holds and the AVML does not must be zeros."""
    from zen.memory.system.image import SystemImage
    from zen.memory.system.process import SystemProcessSpace

    pid = guest["record"]["workload_pid"]
    img = SystemImage(guest_avml("lime"), "avml", [guest["symbols"]])
    if "lime" not in guest["images"]:
        pytest.skip("no LiME image of the guest")
    lime = SystemImage(guest["images"]["lime"], "lime", [guest["symbols"]])
    try:
        entry = img.process(pid)
        space, by_volatility = (SystemProcessSpace(img.kernel, entry, walker=w) for w in ("numpy", "volatility"))
        assert len(by_volatility.chunks) > 1000 and space.captured_bytes >= by_volatility.captured_bytes > 100 << 20
        for c in by_volatility.chunks:
            assert not space.gaps(c.start, c.end)
            assert space.read(c.start, 64) == c.read(0, 64) and space.read(c.end - 64, 64) == c.read(c.end - c.start - 64, 64)
        ref = SystemProcessSpace(lime.kernel, lime.process(pid))
        for c in ref.chunks:
            for lo, hi in space.gaps(c.start, c.end):
                assert ref.read(lo, hi - lo).count(0) == hi - lo, f"{lo:#x}-{hi:#x} holds data the AVML lacks"
        for c in ref.chunks[:: max(1, len(ref.chunks) // 2000)]:
            n = min(c.end - c.start, 1 << 16)
            if not space.gaps(c.start, c.start + n):
                assert space.read(c.start, n) == c.read(0, n)
        space.close()
    finally:
        img.close()
        lime.close()
