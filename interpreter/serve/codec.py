"""The binary tensor frame: one tick's inputs (client to server) or outputs (server to client).

Layout, all integers little-endian (docs/serving.md draws it byte by byte)::

    offset 0   4 bytes   magic b"DCTF"
           4   u16       version (1)
           6   u16       flags (bit 0: LAST, the stream's last tick: `Session.finish`; other bits 0)
           8   u16       tensor count N
          10   N times:  u16 name length L, L bytes of UTF-8 name, u8 dtype code, u8 ndim D, D x u32 dims
           ..  the raw bytes of the N tensors in the same order, each C-contiguous, little-endian

Nothing is padded. A frame's length is exactly its header plus the bytes its dims and dtypes say; `decode`
raises `FrameError` (with an error code of `messages`) for anything else, before any tensor is made.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES
from duplexcadence.interpreter.serve import messages

MAGIC = b"DCTF"
VERSION = 1
VERSIONS = (VERSION,)
FLAG_LAST = 0x0001
KNOWN_FLAGS = FLAG_LAST
MAX_TENSORS = 64
MAX_NAME_BYTES = 255
MAX_DIMS = 8
MAX_HEADER_BYTES = 10 + MAX_TENSORS * (2 + MAX_NAME_BYTES + 2 + 4 * MAX_DIMS)
"""The longest header a frame can have."""
MAX_ELEMENTS = 2**31 - 1
"""The most elements an empty tensor's other dimensions may hold (a tensor with data is bounded by the frame)."""

DTYPE_CODES: dict[int, str] = {
    1: "f32",
    2: "f16",
    3: "bf16",
    4: "f64",
    5: "i64",
    6: "i32",
    7: "i16",
    8: "i8",
    9: "u8",
    10: "bool",
}
"""Dtype code -> the `.clock` dtype name (docs/language.md)."""

CODES_BY_NAME = {name: code for code, name in DTYPE_CODES.items()}
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}

CACHED_LAYOUTS = 256
"""Frame headers kept (read or written): a stream's frames repeat one header, so most frames skip its parsing."""

_PREFIX = struct.Struct("<4sHHH")
_NAME_LENGTH = struct.Struct("<H")
_DTYPE_NDIM = struct.Struct("<BB")
_HEADERS: dict[tuple, bytes] = {}
_LAYOUTS: dict[int, Layout] = {}


class FrameError(ValueError):
    """A binary frame that cannot be read: `code` is one of the error codes of `messages`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class Frame:
    """One decoded frame: the tensors by name, in frame order, and whether it is the stream's last tick."""

    tensors: dict[str, torch.Tensor]
    last: bool = False


def dtype_name(dtype: torch.dtype) -> str:
    """The `.clock` name of a torch dtype (`f32`); ValueError for one the frame cannot carry."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"a frame cannot carry {dtype}; it carries {', '.join(TORCH_DTYPES)}") from None


def little_endian_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's elements as C-contiguous little-endian bytes (on the host)."""
    return memoryview(tensor_data(tensor)).tobytes()


def tensor_data(tensor: torch.Tensor) -> Any:
    """The tensor's elements as C-contiguous little-endian bytes (a buffer): a view of the tensor's own memory
    where it already is those bytes (a contiguous host tensor on a little-endian host), a copy otherwise."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_cpu:
        tensor = tensor.to("cpu")
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if sys.byteorder == "little":
        return (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if tensor.numel() == 0:
        return b""
    raw = tensor.reshape(-1).view(torch.uint8)
    if tensor.element_size() > 1:
        raw = swap_bytes(raw, tensor.element_size())
    return raw.numpy()


def swap_bytes(raw: torch.Tensor, itemsize: int) -> torch.Tensor:
    """`raw` (uint8, a whole number of items) with the bytes of each item reversed (one byte order to the other)."""
    return raw.reshape(-1, itemsize).flip(1).reshape(-1).contiguous()


def encode(tensors: Mapping[str, torch.Tensor], last: bool = False) -> bytes:
    """One frame of `tensors` (by name, in this order); ValueError for what a frame cannot carry."""
    try:
        key = (last, *((name, tensor.dtype, tensor.shape) for name, tensor in tensors.items()))
    except AttributeError:  # not a tensor: the header says which
        key = None
    header = _HEADERS.get(key) if key is not None else None
    if header is None:
        header = _header(tensors, last)
        if key is not None:
            if len(_HEADERS) >= CACHED_LAYOUTS:
                _HEADERS.clear()
            _HEADERS[key] = header
    return b"".join([header, *(tensor_data(tensor) for tensor in tensors.values())])


def _header(tensors: Mapping[str, torch.Tensor], last: bool) -> bytes:
    if len(tensors) > MAX_TENSORS:
        raise ValueError(messages.too_many_tensors(len(tensors), MAX_TENSORS))
    header = [_PREFIX.pack(MAGIC, VERSION, FLAG_LAST if last else 0, len(tensors))]
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"'{name}' is a {type(tensor).__name__}, not a tensor")
        encoded = name.encode("utf-8")
        if len(encoded) > MAX_NAME_BYTES:
            raise ValueError(messages.name_too_long(len(encoded), MAX_NAME_BYTES))
        if tensor.dim() > MAX_DIMS:
            raise ValueError(messages.too_many_dims(name, tensor.dim(), MAX_DIMS))
        code = CODES_BY_NAME[dtype_name(tensor.dtype)]
        header.append(_NAME_LENGTH.pack(len(encoded)))
        header.append(encoded)
        header.append(_DTYPE_NDIM.pack(code, tensor.dim()))
        header.append(struct.pack(f"<{tensor.dim()}I", *tensor.shape))
    return b"".join(header)


def _need(frame: bytes | memoryview, offset: int, size: int, what: str) -> None:
    if offset + size > len(frame):
        raise FrameError(messages.TRUNCATED, messages.truncated(offset + size, len(frame), what))


@attrs.frozen
class Layout:
    """Where a valid frame's tensors lie: its header bytes (everything before the data), whether it is LAST,
    and each tensor's name, dtype, shape, data offset and size. Frames of one stream repeat their header."""

    header: bytes
    last: bool
    tensors: tuple[tuple[str, torch.dtype, tuple[int, ...], int, int], ...]


def decode(frame: bytes | bytearray | memoryview) -> Frame:
    """The tensors of one frame (new host tensors, writable); FrameError for a frame that is not one."""
    view = memoryview(frame).cast("B")
    layout = _LAYOUTS.get(len(view))
    if layout is None or view[: len(layout.header)] != layout.header:
        layout = _layout(view)
        if len(_LAYOUTS) >= CACHED_LAYOUTS:
            _LAYOUTS.clear()
        _LAYOUTS[len(view)] = layout
    tensors = {
        name: _tensor(view[offset : offset + size], dtype, shape) for name, dtype, shape, offset, size in layout.tensors
    }
    return Frame(tensors, layout.last)


def _layout(view: memoryview) -> Layout:
    """Read a frame's header and check its length; FrameError for anything else than a frame."""
    if len(view) < 4 or bytes(view[:4]) != MAGIC:
        raise FrameError(messages.BAD_MAGIC, messages.bad_magic(bytes(view[:4]), MAGIC))
    _need(view, 0, _PREFIX.size, "the frame's prefix")
    _, version, flags, count = _PREFIX.unpack_from(view, 0)
    if version not in VERSIONS:
        raise FrameError(messages.BAD_VERSION, messages.bad_version(version, VERSIONS))
    if flags & ~KNOWN_FLAGS:
        raise FrameError(messages.BAD_FLAGS, messages.bad_flags(flags, KNOWN_FLAGS))
    if count > MAX_TENSORS:
        raise FrameError(messages.BAD_FRAME, messages.too_many_tensors(count, MAX_TENSORS))
    offset = _PREFIX.size
    specs: list[tuple[str, str, tuple[int, ...]]] = []
    for index in range(count):
        _need(view, offset, _NAME_LENGTH.size, f"the name length of tensor {index}")
        (length,) = _NAME_LENGTH.unpack_from(view, offset)
        offset += _NAME_LENGTH.size
        _need(view, offset, length, f"the name of tensor {index}")
        try:
            name = bytes(view[offset : offset + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(messages.BAD_FRAME, messages.bad_name(index)) from None
        offset += length
        if any(name == seen for seen, _, _ in specs):
            raise FrameError(messages.BAD_FRAME, messages.duplicate_name(name))
        _need(view, offset, _DTYPE_NDIM.size, f"the dtype of tensor '{name}'")
        code, ndim = _DTYPE_NDIM.unpack_from(view, offset)
        offset += _DTYPE_NDIM.size
        if code not in DTYPE_CODES:
            raise FrameError(messages.UNKNOWN_DTYPE, messages.unknown_dtype(code, name, DTYPE_CODES))
        if ndim > MAX_DIMS:
            raise FrameError(messages.BAD_FRAME, messages.too_many_dims(name, ndim, MAX_DIMS))
        _need(view, offset, 4 * ndim, f"the shape of tensor '{name}'")
        shape = struct.unpack_from(f"<{ndim}I", view, offset)
        offset += 4 * ndim
        specs.append((name, DTYPE_CODES[code], tuple(shape)))
    header = bytes(view[:offset])
    placed = []
    for name, dtype, shape in specs:
        dtype_ = TORCH_DTYPES[dtype]
        size = math.prod(shape) * dtype_.itemsize
        if size == 0 and math.prod(dim for dim in shape if dim) > MAX_ELEMENTS:  # torch's strides would overflow
            raise FrameError(messages.BAD_FRAME, messages.empty_shape_too_large(name, shape, MAX_ELEMENTS))
        _need(view, offset, size, f"the data of tensor '{name}'")
        placed.append((name, dtype_, shape, offset, size))
        offset += size
    if offset != len(view):
        raise FrameError(messages.BAD_FRAME, messages.trailing_bytes(len(view) - offset))
    return Layout(header, bool(flags & FLAG_LAST), tuple(placed))


def _tensor(data: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if len(data) == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # one copy; every check below is vectorised
    if dtype == torch.bool and bool((raw > 1).any()):
        raise FrameError(messages.BAD_FRAME, messages.bad_bool())
    if sys.byteorder != "little" and dtype.itemsize > 1:
        raw = swap_bytes(raw, dtype.itemsize)
    return raw.view(dtype).view(shape)
