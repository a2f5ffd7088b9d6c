"""TensorFlow's C++ tensor layout as data, and the one decoder of it that calibration and recovery share.

A `tensorflow::Tensor` is {TensorShape shape_ (a 16-byte `TensorShapeRep` + int64 num_elements_), TensorBuffer* buf_};
the shape rep stores dims inline as uint16 (REP16) or uint32 (REP32), or points to an out-of-line
`absl::InlinedVector<int64_t, N>` (whose elements sit inline or on the heap), with the dtype, rank and encoding tag in
its last bytes. Every offset and tag value here comes from a profile measured by `zen profile tf`; this module only
knows the *shape* of that knowledge. It is standard library only: the calibrator runs it inside an interpreter with
TensorFlow (reading through ctypes) and zen runs it over an image (reading through the address space), so the
decoder the profile was self-checked with is the decoder recovery uses.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

Read = Callable[[int, int], bytes]  # (address, size) -> bytes, raising on unreadable memory
MAX_RANK = 254  # the rank is one byte in the shape rep


class LayoutError(Exception):
    """Bytes that do not decode as a tensor under the measured layout."""


@dataclass(frozen=True)
class TensorLayout:
    """Offsets of the TF tensor structures (bytes), as measured; see the profile's provenance."""

    tensor_shape: int  # TensorShapeRep within tensorflow::Tensor
    tensor_num_elements: int
    tensor_buf: int  # TensorBuffer*
    tensor_size: int
    buffer_data: int  # TensorBuffer::data_ (via the vtable-holding RefCounted base)
    rep_dtype: int  # byte offsets inside the 16-byte TensorShapeRep
    rep_ndims: int
    rep_tag: int
    rep_dims: int  # inline dims start
    rep_out_of_line: int  # pointer to the InlinedVector when the tag says so
    tag_rep16: int
    tag_rep32: int
    tag_out_of_line: int
    vec_metadata: int  # InlinedVector: (size << 1) | is_allocated
    vec_inline: int  # inline elements start
    vec_heap: int  # pointer to heap elements when allocated
    vec_inline_capacity: int

    @classmethod
    def from_profile(cls, structs: dict[str, dict], constants: dict[str, int]) -> TensorLayout:
        """Build from a profile's `structs`/`constants` (raises KeyError when a field is missing)."""

        def f(s: str, name: str) -> int:
            return int(structs[s]["fields"][name][0])

        return cls(
            tensor_shape=f("tensor", "shape"), tensor_num_elements=f("tensor", "num_elements"),
            tensor_buf=f("tensor", "buf"), tensor_size=int(structs["tensor"]["size"]),
            buffer_data=f("tensorbuffer", "data"),
            rep_dtype=f("shaperep", "dtype"), rep_ndims=f("shaperep", "ndims"), rep_tag=f("shaperep", "tag"),
            rep_dims=f("shaperep", "dims"), rep_out_of_line=f("shaperep", "out_of_line"),
            tag_rep16=int(constants["TAG_REP16"]), tag_rep32=int(constants["TAG_REP32"]),
            tag_out_of_line=int(constants["TAG_OUT_OF_LINE"]),
            vec_metadata=f("inlinedvector", "metadata"), vec_inline=f("inlinedvector", "inline"),
            vec_heap=f("inlinedvector", "heap"), vec_inline_capacity=int(constants["INLINED_DIMS"]),
        )  # fmt: skip


@dataclass(frozen=True)
class DecodedTensor:
    """One `tensorflow::Tensor` value: its dtype enum, shape, element count and where its bytes are."""

    dtype: int
    shape: tuple[int, ...]
    num_elements: int
    buffer: int  # TensorBuffer* (0 for a tensor without storage)
    data: int  # the buffer's data pointer (0 when there is no buffer)


def decode_shape(L: TensorLayout, rep: bytes, read: Read) -> tuple[int, tuple[int, ...]]:
    """(dtype enum, dims) of a 16-byte TensorShapeRep; out-of-line dims are read through `read`."""
    if len(rep) < 16:
        raise LayoutError("short shape rep")
    dtype, ndims, tag = rep[L.rep_dtype], rep[L.rep_ndims], rep[L.rep_tag]
    if ndims > MAX_RANK:
        raise LayoutError(f"implausible rank {ndims}")
    if tag == L.tag_rep16:
        if L.rep_dims + 2 * ndims > L.rep_dtype:
            raise LayoutError(f"rank {ndims} does not fit a REP16 shape")
        dims = struct.unpack_from(f"<{ndims}H", rep, L.rep_dims)
    elif tag == L.tag_rep32:
        if L.rep_dims + 4 * ndims > L.rep_dtype:
            raise LayoutError(f"rank {ndims} does not fit a REP32 shape")
        dims = struct.unpack_from(f"<{ndims}I", rep, L.rep_dims)
    elif tag == L.tag_out_of_line:
        vec = struct.unpack_from("<Q", rep, L.rep_out_of_line)[0]
        head = read(vec, max(L.vec_metadata, L.vec_heap, L.vec_inline) + 8)
        meta = struct.unpack_from("<Q", head, L.vec_metadata)[0]
        size, allocated = meta >> 1, meta & 1
        if size != ndims:
            raise LayoutError(f"out-of-line shape holds {size} dims, the rep says {ndims}")
        if allocated:
            at = struct.unpack_from("<Q", head, L.vec_heap)[0]
        elif ndims <= L.vec_inline_capacity:
            at = vec + L.vec_inline
        else:
            raise LayoutError(f"{ndims} dims inline in a vector of capacity {L.vec_inline_capacity}")
        dims = struct.unpack(f"<{ndims}q", read(at, 8 * ndims)) if ndims else ()
    else:
        raise LayoutError(f"unknown shape encoding tag {tag}")
    if any(d < 0 for d in dims):
        raise LayoutError(f"negative dimension in {dims}")
    return dtype, tuple(int(d) for d in dims)


def decode_tensor(L: TensorLayout, at: int, read: Read) -> DecodedTensor:
    """Decode the `tensorflow::Tensor` at address `at` and check its fields against each other."""
    raw = read(at, L.tensor_size)
    dtype, shape = decode_shape(L, raw[L.tensor_shape : L.tensor_shape + 16], read)
    numel = struct.unpack_from("<q", raw, L.tensor_num_elements)[0]
    n = 1
    for d in shape:
        n *= d
    if numel != n:
        raise LayoutError(f"num_elements {numel} disagrees with shape {shape}")
    buf = struct.unpack_from("<Q", raw, L.tensor_buf)[0]
    data = struct.unpack_from("<Q", read(buf + L.buffer_data, 8), 0)[0] if buf else 0
    return DecodedTensor(dtype, shape, numel, buf, data)


def read_std_string(at: int, read: Read, data_off: int, size_off: int, limit: int = 4096) -> str:
    """A libstdc++ `std::string` (pointer + length, measured offsets); bounded, decoded leniently."""
    head = read(at, max(data_off, size_off) + 8)
    ptr = struct.unpack_from("<Q", head, data_off)[0]
    size = struct.unpack_from("<Q", head, size_off)[0]
    if size > limit:
        raise LayoutError(f"std::string of {size} bytes")
    return read(ptr, size).decode("utf-8", "replace") if size else ""
