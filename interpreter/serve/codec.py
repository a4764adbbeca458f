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

import attrs
import torch

from duplexcadence.interpreter.serve import messages

MAGIC = b"DCTF"
VERSION = 1
VERSIONS = (VERSION,)
FLAG_LAST = 0x0001
KNOWN_FLAGS = FLAG_LAST
MAX_TENSORS = 64
MAX_NAME_BYTES = 255
MAX_DIMS = 8

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

TORCH_DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}
CODES_BY_NAME = {name: code for code, name in DTYPE_CODES.items()}
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}

_PREFIX = struct.Struct("<4sHHH")
_NAME_LENGTH = struct.Struct("<H")
_DTYPE_NDIM = struct.Struct("<BB")


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
    flat = tensor.detach().to("cpu").contiguous()
    if flat.numel() == 0:
        return b""
    raw = flat.reshape(-1).view(torch.uint8)
    if sys.byteorder != "little" and flat.element_size() > 1:
        raw = swap_bytes(raw, flat.element_size())
    return raw.numpy().tobytes()


def swap_bytes(raw: torch.Tensor, itemsize: int) -> torch.Tensor:
    """`raw` (uint8, a whole number of items) with the bytes of each item reversed (one byte order to the other)."""
    return raw.reshape(-1, itemsize).flip(1).reshape(-1).contiguous()


def encode(tensors: Mapping[str, torch.Tensor], last: bool = False) -> bytes:
    """One frame of `tensors` (by name, in this order); ValueError for what a frame cannot carry."""
    if len(tensors) > MAX_TENSORS:
        raise ValueError(messages.too_many_tensors(len(tensors), MAX_TENSORS))
    header = [_PREFIX.pack(MAGIC, VERSION, FLAG_LAST if last else 0, len(tensors))]
    data = []
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
        data.append(little_endian_bytes(tensor))
    return b"".join(header + data)


def _need(frame: bytes | memoryview, offset: int, size: int, what: str) -> None:
    if offset + size > len(frame):
        raise FrameError(messages.TRUNCATED, messages.truncated(offset + size, len(frame), what))


def decode(frame: bytes | bytearray | memoryview) -> Frame:
    """The tensors of one frame (new host tensors, writable); FrameError for a frame that is not one."""
    view = memoryview(frame).cast("B")
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
    tensors: dict[str, torch.Tensor] = {}
    for name, dtype, shape in specs:
        dtype_ = TORCH_DTYPES[dtype]
        size = math.prod(shape) * torch.empty((), dtype=dtype_).element_size()
        _need(view, offset, size, f"the data of tensor '{name}'")
        tensors[name] = _tensor(view[offset : offset + size], dtype_, shape)
        offset += size
    if offset != len(view):
        raise FrameError(messages.BAD_FRAME, messages.trailing_bytes(len(view) - offset))
    return Frame(tensors, bool(flags & FLAG_LAST))


def _tensor(data: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if len(data) == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if dtype == torch.bool and int(raw.max()) > 1:
        raise FrameError(messages.BAD_FRAME, messages.bad_bool())
    itemsize = torch.empty((), dtype=dtype).element_size()
    if sys.byteorder != "little" and itemsize > 1:
        raw = swap_bytes(raw, itemsize)
    return raw.view(dtype).reshape(shape)
