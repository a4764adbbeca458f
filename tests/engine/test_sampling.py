"""Batched sampling against a per-row reference written after upstream's samplers (MiniCPM-o's
`StreamDecoder.decode` and `CustomRepetitionPenaltyLogitsProcessorRepeat`, as examples/minicpmo45/live_model.py
re-expresses them), in float64; each row's stream independent of its batch; errors."""

from __future__ import annotations

import math

import pytest
import torch

from duplexcadence.interpreter.engine.sampling import NEVER, Sampler, SamplingConfig, stream_key, uniforms

VOCAB = 40
SETTINGS = {  # slot: (seed, open's settings)
    3: (11, dict(temperature=0.7, top_k=8, top_p=0.8, penalty=1.3, banned=[(5, NEVER), (7, 3)])),
    0: (12, dict(temperature=1.3, top_k=0, top_p=1.0, penalty=0.8, banned=[(39, 2)])),
    4: (13, dict(temperature=1.0, top_k=12, top_p=0.5, penalty=1.0)),
    1: (14, dict(temperature=0.4, top_k=1, top_p=0.95, penalty=2.0, banned=[(2, NEVER)])),
}


def lowbias32(x: int) -> int:
    """Wellons' lowbias32 on Python integers (github.com/skeeto/hash-prospector)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


class ReferenceRow:
    """One conversation's sampling, one token at a time, in float64 (see the module docstring)."""

    def __init__(self, config: SamplingConfig, seed: int, settings: dict) -> None:
        self.config = config
        self.key = stream_key(seed)
        self.counter = 0
        self.history: list[int] = []
        self.settings = dict(dict(temperature=1.0, top_k=0, top_p=1.0, penalty=1.0, banned=()), **settings)

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.settings
        scores = logits.double().clone()
        window = self.history[-self.config.window :]
        for token in set(window):
            if self.config.penalty == "distinct":
                scores[token] /= s["penalty"]
            else:
                alpha = s["penalty"] ** window.count(token)
                scores[token] = scores[token] * alpha if scores[token] < 0 else scores[token] / alpha
        for token, until in s["banned"]:
            if len(self.history) < until:
                scores[token] = -math.inf
        scores /= s["temperature"]
        if s["top_k"] > 0:
            scores[scores < torch.topk(scores, s["top_k"]).values[-1]] = -math.inf
        ordered, order = torch.sort(scores, descending=True)
        remove = ordered.softmax(0).cumsum(0) > s["top_p"]
        remove[1:] = remove[:-1].clone()
        remove[0] = False
        scores[order[remove]] = -math.inf
        return scores.softmax(0)

    def sample(self, logits: torch.Tensor) -> int:
        """Inverse transform over the tokens from the most likely down, with this row's next uniform."""
        probabilities = self.distribution(logits)
        u = float(uniforms(torch.tensor(self.key), torch.tensor(self.counter)))
        self.counter += 1
        order = torch.sort(probabilities, descending=True, stable=True).indices
        cumulative = probabilities[order].cumsum(0)
        return int(order[min(int((cumulative <= u * cumulative[-1]).sum()), len(order) - 1)])


def opened(config: SamplingConfig, slots: int = 6) -> tuple[Sampler, dict[int, ReferenceRow]]:
    sampler = Sampler(config, slots=slots, device="cpu")
    references = {}
    for slot, (seed, settings) in SETTINGS.items():
        if config.candidates is not None and not settings["top_k"]:
            settings = settings | {"top_k": config.candidates}
        sampler.open(slot, seed, **settings)
        references[slot] = ReferenceRow(config, seed, settings)
    return sampler, references


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(vocab=VOCAB, window=4, penalty="distinct", banned=2),
        SamplingConfig(vocab=VOCAB, window=4, penalty="repeat", banned=2),
        SamplingConfig(vocab=VOCAB, window=6, penalty="distinct", banned=2, candidates=16),
    ],
    ids=["distinct", "repeat", "distinct-16-candidates"],
)
def test_batched_sampling_matches_the_per_row_reference(config) -> None:
    """Twelve steps of four rows in shuffled slots, each with its own settings, the windows wrapping around;
    the probabilities each row draws from and the tokens drawn agree with the reference row by row."""
    sampler, references = opened(config)
    generator = torch.Generator().manual_seed(7)
    slots = list(SETTINGS)
    drawn = []
    for step in range(12):
        logits = torch.randn(len(slots), VOCAB, generator=generator) * 3
        logits[:, :3] += 2.0  # a few tokens often drawn, so the penalties bite
        rows = torch.tensor(slots)
        torch.testing.assert_close(
            sampler.distribution(rows, logits).double(),
            torch.stack([references[slot].distribution(logits[r]) for r, slot in enumerate(slots)]),
            atol=1e-6,
            rtol=1e-5,
        )
        tokens = sampler.sample(rows, logits)
        assert tokens.tolist() == [references[slot].sample(logits[r]) for r, slot in enumerate(slots)]
        sampler.record(rows, tokens)
        for slot, token in zip(slots, tokens.tolist()):
            references[slot].history.append(token)
        drawn.append(tokens.tolist())
        slots = slots[1:] + slots[:1] if step % 3 else slots[::-1]
    assert sampler.counters.tolist() == [12, 12, 0, 12, 12, 0] and sampler.recorded.tolist() == [12, 12, 0, 12, 12, 0]
    assert len({tuple(step) for step in drawn}) > 6  # the rows really draw


def test_a_rows_tokens_do_not_depend_on_its_batch() -> None:
    """Slot 3 alone, then with three others in two orders: the same tokens; reopened with its seed, the same
    again."""
    config = SamplingConfig(vocab=VOCAB, window=4, penalty="repeat", banned=2)
    logits = torch.randn(8, 6, VOCAB, generator=torch.Generator().manual_seed(1))  # [step, slot]
    runs = []
    for batch in ([3], [0, 3, 4, 1], [1, 4, 3, 0], [3]):
        sampler, _ = opened(config)
        tokens = []
        for step in range(8):
            rows = torch.tensor(batch)
            chosen = sampler.sample(rows, logits[step, rows])
            sampler.record(rows, chosen)
            tokens.append(int(chosen[batch.index(3)]))
        runs.append(tokens)
    assert runs[0] == runs[1] == runs[2] == runs[3]


def test_record_keeps_only_where_asked_and_restart_empties_the_window() -> None:
    sampler = Sampler(SamplingConfig(vocab=VOCAB, window=3, banned=1), slots=2, device="cpu")
    sampler.open(1, 5, banned=[(9, 2)])
    rows = torch.tensor([1])
    for token, keep in ((4, True), (6, False), (7, True), (8, True), (2, True)):
        sampler.record(rows, torch.tensor([token]), keep=torch.tensor([keep]))
    assert sampler.recorded.tolist() == [0, 4] and sampler.window[1].tolist() == [2, 7, 8]
    logits = torch.zeros(1, VOCAB)
    assert sampler.distribution(rows, logits)[0, 9] > 0  # 4 recorded: the ban of 9 until 2 is over
    sampler.restart(1)
    assert sampler.distribution(rows, logits)[0, 9] == 0
    sampler.record(rows, torch.tensor([3]))
    assert sampler.window[1, 0] == 3 and sampler.recorded.tolist() == [0, 1]


def test_the_stream_is_lowbias32_chained_over_key_and_counter_and_uniform() -> None:
    for seed in (0, 1, 2**40 + 3, -5):
        seed64 = seed & (2**64 - 1)
        assert stream_key(seed) == lowbias32(lowbias32(seed64 & 0xFFFFFFFF) ^ (seed64 >> 32))
    keys = torch.tensor([stream_key(3)] * 4)
    counters = torch.tensor([0, 1, 2**31 + 7, 2**32 - 1])
    expected = [(lowbias32(int(keys[0]) ^ lowbias32(c)) >> 8) / 2**24 for c in counters.tolist()]
    assert uniforms(keys, counters).tolist() == expected
    u = uniforms(torch.full((100_000,), stream_key(9)), torch.arange(100_000))
    counts = torch.histc(u, bins=10, min=0, max=1)
    assert counts.min() > 9_700 and counts.max() < 10_300 and float(u.min()) >= 0 and float(u.max()) < 1
    across = uniforms(
        torch.tensor([stream_key(seed) for seed in range(20_000)]), torch.zeros(20_000, dtype=torch.int64)
    )
    assert abs(float(across.mean()) - 0.5) < 0.01


def test_draw_takes_the_logits_as_given() -> None:
    sampler = Sampler(SamplingConfig(vocab=4, window=1), slots=1, device="cpu")
    sampler.open(0, 3, temperature=0.1, top_k=1, penalty=5.0)
    rows = torch.tensor([0])
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.25, 0.25]]))
    key = torch.tensor([stream_key(3)])
    drawn = [int(sampler.draw(rows, logits)) for _ in range(20)]
    assert drawn == [int(u * 4) for u in uniforms(key.expand(20), torch.arange(20)).tolist()]


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda s: s.open(0, 1, temperature=0.0, top_p=1.5),
            "Sampler.open(slot 0): temperature must be > 0, got 0.0; top_p must be in (0, 1], got 1.5",
        ),
        (lambda s: s.open(0, 1, top_k=41), "Sampler.open(slot 0): top_k must be in 0..40 (0: off), got 41"),
        (lambda s: s.open(2, 1), "slot 2 is not one of this sampler's slots 0..1"),
        (lambda s: s.ban(0, [(1, 1), (2, 2), (3, 3)]), "slot 0: 3 bans, the sampler holds 2 a slot"),
        (lambda s: s.ban(0, [(40, 1)]), "slot 0: banned token 40 is not in the vocabulary 0..39"),
        (
            lambda s: s.sample(torch.tensor([0]), torch.zeros(1, 39)),
            "logits must be [rows=1, vocab=40] on cpu, got [1, 39] on cpu",
        ),
        (lambda s: SamplingConfig(vocab=40, penalty="linear"), "penalty must be one of distinct, repeat, got 'linear'"),
        (
            lambda s: Sampler(SamplingConfig(vocab=40, candidates=8), 1, "cpu").open(0, 1),
            "Sampler.open(slot 0): top_k must be in 1..8 (the sampler's candidates), got 0",
        ),
    ],
)
def test_errors_say_what_is_wrong(call, message) -> None:
    sampler = Sampler(SamplingConfig(vocab=VOCAB, banned=2), slots=2, device="cpu")
    with pytest.raises(ValueError) as raised:
        call(sampler)
    assert str(raised.value) == message


@pytest.mark.gpu
def test_a_captured_sampling_step_replays_as_eager(captured) -> None:
    """sample + record captured at 3 rows over the released vocabulary, replayed 5 times; the same steps run
    eagerly on a copy of the state give the same tokens and state."""
    config = SamplingConfig(vocab=151_748, window=16, penalty="distinct", banned=2, candidates=64)
    samplers = [Sampler(config, slots=4, device="cuda") for _ in range(2)]
    for sampler in samplers:
        for slot, seed in ((0, 1), (2, 2), (3, 3)):
            sampler.open(slot, seed, temperature=0.8, top_k=20 + slot, top_p=0.9, penalty=1.2, banned=[(7, 4)])
    rows = torch.tensor([2, 0, 3], device="cuda")
    logits = torch.randn(3, config.vocab, device="cuda")
    graphed = samplers[0]

    def step() -> torch.Tensor:
        tokens = graphed.sample(rows, logits)
        graphed.record(rows, tokens)
        return tokens

    graph, tokens = captured(step)
    eager = samplers[1]
    eager.record(rows, eager.sample(rows, logits))  # the warm-up's step
    for replay in range(5):
        logits.copy_(
            torch.randn(3, config.vocab, device="cuda", generator=torch.Generator(device="cuda").manual_seed(replay))
        )
        graph.replay()
        expected = eager.sample(rows, logits)
        eager.record(rows, expected)
        assert torch.equal(tokens, expected)
    for name in ("counters", "window", "recorded"):
        assert torch.equal(getattr(graphed, name), getattr(eager, name))
