"""The tensor frame: every dtype and shape round-trips bit for bit, the layout is the one docs/serving.md draws,
and every malformed frame is a `FrameError` with its code (never another exception, never a tensor)."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplexcadence.interpreter.serve import codec, messages


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(low, high, shape, generator=generator, dtype=torch.int64).to(dtype)


names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12)
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)
dtypes = st.sampled_from(list(codec.TORCH_DTYPES.values()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(names, st.tuples(dtypes, shapes, st.integers(0, 2**16)), max_size=5), st.booleans())
def test_any_tensors_round_trip_bit_for_bit(specs, last):
    tensors = {name: random_tensor(dtype, shape, seed) for name, (dtype, shape, seed) in specs.items()}
    frame = codec.decode(codec.encode(tensors, last))
    assert frame.last == last
    assert list(frame.tensors) == list(tensors)
    for name, tensor in tensors.items():
        assert same_bits(frame.tensors[name], tensor), name


def test_a_non_contiguous_view_and_a_nan_travel_as_their_values():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    base[0, 0] = float("nan")
    view = base.t()
    decoded = codec.decode(codec.encode({"x": view})).tensors["x"]
    assert same_bits(decoded, view.contiguous())
    assert decoded.is_contiguous()


def test_the_layout_is_the_documented_one():
    frame = codec.encode({"codes": torch.tensor([[7, 9]], dtype=torch.int64)}, last=True)
    expected = (
        b"DCTF"
        + struct.pack("<HHH", 1, 1, 1)  # version 1, flags LAST, one tensor
        + struct.pack("<H", 5)
        + b"codes"
        + struct.pack("<BB", 5, 2)  # i64, two dims
        + struct.pack("<II", 1, 2)
        + struct.pack("<qq", 7, 9)
    )
    assert frame == expected
    assert len(frame) == 4 + 6 + 2 + 5 + 2 + 8 + 16


def test_the_dtype_table_names_every_clock_dtype():
    from duplexcadence.dsl.messages import DTYPES

    assert set(codec.DTYPE_CODES.values()) == set(DTYPES) == set(codec.TORCH_DTYPES)


VALID = codec.encode({"codes": torch.tensor([[1, 2, 3]], dtype=torch.int64), "w": torch.ones(2, dtype=torch.float16)})


def mutated(offset: int, data: bytes) -> bytes:
    return VALID[:offset] + data + VALID[offset + len(data) :]


MALFORMED = {
    "bad magic": (b"RIFF" + VALID[4:], messages.BAD_MAGIC, "the frame starts with b'RIFF', not the magic b'DCTF'"),
    "empty": (b"", messages.BAD_MAGIC, "the frame starts with b'', not the magic b'DCTF'"),
    "bad version": (mutated(4, struct.pack("<H", 2)), messages.BAD_VERSION, "protocol version 2 is not spoken here"),
    "bad flags": (mutated(6, struct.pack("<H", 0x8001)), messages.BAD_FLAGS, "flags 0x8001 set bits"),
    "unknown dtype": (mutated(17, bytes([42])), messages.UNKNOWN_DTYPE, "tensor 'codes' has dtype code 42"),
    "truncated data": (VALID[:-1], messages.TRUNCATED, "inside the data of tensor 'w'"),
    "truncated header": (VALID[:12], messages.TRUNCATED, "inside the name of tensor 0"),
    "extra bytes": (VALID + b"\x00\x00", messages.BAD_FRAME, "the frame has 2 bytes after the data of its tensors"),
    "name not utf-8": (mutated(12, b"\xff"), messages.BAD_FRAME, "the name of tensor 0 is not UTF-8 text"),
    "too many dims": (mutated(18, bytes([9])), messages.BAD_FRAME, "tensor 'codes' has 9 dimensions"),
    "an empty tensor of an impossible shape": (
        b"DCTF" + struct.pack("<HHHH", 1, 0, 1, 5) + b"codes" + struct.pack("<BB8I", 5, 8, 0, *[2**32 - 1] * 7),
        messages.BAD_FRAME,
        "tensor 'codes' has shape [0, 4294967295, 4294967295, 4294967295, 4294967295, 4294967295, 4294967295, "
        "4294967295]: its dimensions other than the empty one hold more than 2147483647 elements",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_frame_is_a_frame_error_with_its_code(case):
    data, code, text = MALFORMED[case]
    with pytest.raises(codec.FrameError) as raised:
        codec.decode(data)
    assert raised.value.code == code
    assert text in raised.value.message
    assert code in messages.ERROR_CODES


def test_a_duplicate_name_and_a_bool_that_is_not_0_or_1_are_refused():
    twice = b"DCTF" + struct.pack("<HHH", 1, 0, 2) + (struct.pack("<H", 1) + b"a" + struct.pack("<BB", 9, 0)) * 2
    with pytest.raises(codec.FrameError, match="tensor 'a' appears twice"):
        codec.decode(twice + b"\x01\x02")
    flag = codec.encode({"b": torch.tensor([True])})
    with pytest.raises(codec.FrameError) as raised:
        codec.decode(flag[:-1] + b"\x02")
    assert (raised.value.code, raised.value.message) == (
        messages.BAD_FRAME,
        "a bool tensor holds a byte other than 0 or 1",
    )


@settings(max_examples=80, deadline=None)
@given(st.integers(0, len(VALID) - 1))
def test_every_prefix_of_a_frame_is_refused(cut):
    with pytest.raises(codec.FrameError) as raised:
        codec.decode(VALID[:cut])
    assert raised.value.code in (messages.TRUNCATED, messages.BAD_MAGIC)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(0, len(VALID)))
def test_any_bytes_decode_to_a_frame_or_a_frame_error(noise, at):
    data = VALID[:at] + noise + VALID[at + len(noise) :]
    try:
        frame = codec.decode(data)
    except codec.FrameError as error:
        assert error.code in messages.ERROR_CODES
    else:
        assert codec.decode(codec.encode(frame.tensors, frame.last)).tensors.keys() == frame.tensors.keys()


def test_swapping_bytes_turns_one_byte_order_into_the_other():
    value = torch.tensor([1.5, -2.25], dtype=torch.float32)
    raw = value.view(torch.uint8)
    swapped = codec.swap_bytes(raw, 4)
    assert swapped.numpy().tobytes() == struct.pack(">ff", 1.5, -2.25)
    assert torch.equal(codec.swap_bytes(swapped, 4), raw)


def test_what_a_frame_cannot_carry_is_a_value_error():
    with pytest.raises(ValueError, match=r"a frame cannot carry torch\.complex64"):
        codec.encode({"z": torch.zeros(1, dtype=torch.complex64)})
    with pytest.raises(ValueError, match="'x' is a list, not a tensor"):
        codec.encode({"x": [1, 2]})
