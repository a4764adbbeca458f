"""PersonaPlex's Mimi tail (old-moshi state handling) reproduced on moshi 0.2.13 weights.

CPU, released size, B=1, 130 frames through both Mimi instances (past the KV ring's wrap at frame
125). No reduced config is used.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moshi")

from duplexcadence.examples.moshi import model as mimi_model  # noqa: E402
from duplexcadence.examples.moshi.stock import MoshiStockDecoder  # noqa: E402
from duplexcadence.examples.personaplex.stock import PersonaPlexMimiDecoder, PersonaPlexTail, RingKVCache  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

FRAMES = 130
RESET_FRAMES = 4
RING_FULL_FRAME = 124
"""First frame whose 2 new steps fill the 250-slot ring (end_offset reaches 250)."""


@dataclasses.dataclass
class TailRun:
    main: list[torch.Tensor]
    other: list[torch.Tensor]
    initial_state: dict[str, torch.Tensor | None]
    pointers: list[dict[str, int | None]]
    reset_main: list[torch.Tensor]


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def tail_run(mimi, codes) -> TailRun:
    tail = PersonaPlexTail(mimi)
    initial = dict(tail.mimi.state_tensors())
    main, other, pointers = [], [], []
    for t in range(FRAMES):
        main_pcm, other_pcm = tail.step(codes[:, :, t : t + 1])
        main.append(main_pcm)
        other.append(other_pcm)
        pointers.append(
            {name: None if tensor is None else tensor.data_ptr() for name, tensor in tail.mimi.state_tensors().items()}
        )
    tail.reset()
    reset_main = [tail.step(codes[:, :, t : t + 1])[0] for t in range(RESET_FRAMES)]
    return TailRun(main, other, initial, pointers, reset_main)


@pytest.fixture(scope="module")
def moshi_eager(mimi, codes, tail_run) -> list[torch.Tensor]:
    """moshi 0.2.13's eager streaming decode of the same codes on the same weights."""
    with MoshiStockDecoder(mimi, batch_size=1, mode="eager") as decoder:
        return [decoder.step(codes[:, :, t : t + 1]) for t in range(FRAMES)]


def test_two_instances_decode_identically(tail_run: TailRun) -> None:
    assert len(tail_run.main) == FRAMES
    for main_pcm, other_pcm in zip(tail_run.main, tail_run.other):
        assert main_pcm.shape == (1, 1, mimi_model.FRAME_SIZE)
        assert torch.equal(main_pcm, other_pcm)
    assert torch.cat(tail_run.main, dim=-1).std() > 1e-3


def test_conv_carries_start_as_none_and_move_every_tick(tail_run: TailRun) -> None:
    """The obstacle DuplexCadence removes: every non-empty carry is a new tensor each tick."""
    carries = [name for name in tail_run.initial_state if name.endswith((".previous", ".partial"))]
    assert len(carries) == 15
    assert all(tail_run.initial_state[name] is None for name in carries)
    moving = [name for name in carries if not name.endswith(".block.3.previous")]
    assert len(moving) == 11
    for before, after in zip(tail_run.pointers, tail_run.pointers[1:]):
        for name in moving:
            assert after[name] is not None and after[name] != before[name], name


def test_transformer_state_is_preallocated_and_stable(tail_run: TailRun) -> None:
    stable = [name for name in tail_run.initial_state if ".kv_cache." in name or name.endswith("offset")]
    assert len(stable) == 8 * 3 + 1
    for pointers in tail_run.pointers:
        for name in stable:
            assert pointers[name] == tail_run.initial_state[name].data_ptr(), name


def test_equals_moshi_eager_until_the_ring_is_full(tail_run: TailRun, moshi_eager: list[torch.Tensor]) -> None:
    """Bit-identical to moshi 0.2.13 until frame 124, then different, by one masked KV slot.

    Everything else is the same arithmetic (conv carries hold the same values whether
    concatenated or copied in place; the conv-transpose bias is subtracted once either way; rope
    and the attention mask broadcast differently but compute the same elements). The difference:
    old ``RingKVCache`` derives key positions from ``end_offset`` after the write, so slot
    ``end_offset % 250`` is labelled ``end_offset`` (a future position) and masked. From frame 124
    on (end_offset = 250) that slot holds the oldest step, which moshi 0.2.13 still attends to.
    """
    differing = [t for t in range(FRAMES) if not torch.equal(tail_run.main[t], moshi_eager[t])]
    assert differing[0] == RING_FULL_FRAME
    assert differing == list(range(RING_FULL_FRAME, FRAMES))
    assert max((tail_run.main[t] - moshi_eager[t]).abs().max().item() for t in differing) < 1e-4


def test_reset_starts_a_fresh_conversation(tail_run: TailRun) -> None:
    for fresh, after_reset in zip(tail_run.main, tail_run.reset_main):
        assert torch.equal(fresh, after_reset)


def test_ring_kv_cache_masks_its_oldest_slot_once_full() -> None:
    """Capacity 6, two steps per call: positions the old code assigns to the six slots."""
    ring = RingKVCache(1, 1, 1, 6, device=torch.device("cpu"), dtype=torch.float32)
    step = torch.zeros(1, 1, 2, 1)
    _, _, positions = ring.complete(step, step)
    assert positions.tolist() == [0, 1, -1, -1, -1, -1]
    ring.complete(step, step)
    _, _, positions = ring.complete(step, step)
    # end_offset 6: slot 0 holds step 0 but is labelled 6, a future position.
    assert positions.tolist() == [6, 1, 2, 3, 4, 5]
    _, _, positions = ring.complete(step, step)
    # end_offset 8: slots 0-1 hold steps 6-7, slot 2 (step 2, the oldest) is labelled 8.
    assert positions.tolist() == [6, 7, 8, 3, 4, 5]


def test_rejects_configurations_it_does_not_reproduce(mimi) -> None:
    transformer = mimi.decoder_transformer.transformer
    original = transformer.positional_embedding
    transformer.positional_embedding = "sin"
    try:
        with pytest.raises(ValueError, match="rope"):
            PersonaPlexMimiDecoder(mimi)
    finally:
        transformer.positional_embedding = original


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
def test_gpu_graphed_transformer_equals_eager(codes) -> None:
    """Upstream graphs only the transformer; that graph must not change a bit (cudnn deterministic)."""
    previous = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        mimi = mimi_model.build_mimi(seed=1234, device="cuda")
        gpu_codes = codes.cuda()
        outputs = {}
        for graphed in (False, True):
            decoder = PersonaPlexMimiDecoder(mimi, graph_transformer=graphed)
            outputs[graphed] = [decoder.decode(gpu_codes[:, :, t : t + 1]).cpu() for t in range(FRAMES)]
        assert all(torch.equal(a, b) for a, b in zip(outputs[False], outputs[True]))
    finally:
        torch.backends.cudnn.deterministic = previous
