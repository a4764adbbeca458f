"""The token2wav tail under the DuplexCadence runtime on a GPU, released sizes: graphs and bit-identity.

P = 150 prompt frames; float32 with n_timesteps 10 and 5, float16 with 10 and 5. Stock runs on one
tail, the runtime on another built with the same seed. Bit-identity needs deterministic cuDNN
(HiFT's convolutions). Planned chunks replay one graph
per instant that fuses ``flow`` (first, second, steady), ``hift_front`` (first, steady) and ``hift_back``
(first, steady: its inverse STFT has no host read-back, so nothing is blocked from capture). The turn
boundaries `load_runtime` declares (the end of a turn after whole chunks) replay graphs captured with the
planned ones; forced flushes and other last chunks run eagerly unless declared too, and then replay theirs.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import warnings
from collections.abc import Iterator

import pytest
import torch

REQUIRED_MODULES = ("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
MISSING = [name for name in REQUIRED_MODULES if name not in sys.modules and importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.models,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}"),
]

PROMPT_FRAMES = 150
REGULAR, OFF_PLAN = 13, 5  # chunks of the script below: planned shapes (28 tokens) and off the plan (flush, last)
TURN_ENDS = 2  # of the off-plan chunks, the ends of a turn after whole chunks (3 tokens: the default declaration)
SAMPLES = (
    [20_160]
    + [24_000] * 5
    + [9_600, 6_720]
    + [20_160, 24_000, 29_760]
    + [20_160, 24_000, 24_000, 9_600, 24_000, 24_000, 6_720]
)


@pytest.fixture(autouse=True)
def deterministic_cudnn() -> Iterator[None]:
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn as scope

    with scope():
        yield


def _tokens(seed: int = 2024) -> list[int]:
    return torch.randint(0, 6561, (500,), generator=torch.Generator().manual_seed(seed)).tolist()


def _script(session, tokens: list[int]) -> list[torch.Tensor]:
    """Turn 1: first, second, four steady chunks, a 13-token flush, a 3-token last chunk. Turn 2 (after
    reset): two regular chunks and a 27-token last chunk (P + 154 frames in flight). Turn 3: three
    regular chunks, a 13-token flush from the steady state (trimmed straight back to P + 100: the
    next chunks have the steady shapes again and replay its graph), two regular chunks, the end."""
    chunks: list[torch.Tensor] = []
    for index in range(6):
        chunks += session.push_tokens(tokens[25 * index : 25 * index + 25])
    chunks += session.push_tokens(tokens[150:160], flush=True)
    chunks += session.push_tokens([], end_of_turn=True)
    session.reset()
    chunks += session.push_tokens(tokens[200:225])
    chunks += session.push_tokens(tokens[225:250])
    chunks += session.push_tokens(tokens[250:274], end_of_turn=True)
    session.reset()
    chunks += session.push_tokens(tokens[300:375])
    chunks += session.push_tokens(tokens[375:385], flush=True)
    chunks += session.push_tokens(tokens[385:435], end_of_turn=True)
    return chunks


def _stock_chunks(float16: bool, n_timesteps: int, prompt, seed: int, tokens: list[int], script=_script):
    from duplexcadence.examples.minicpmo45.model import RELEASED, build_tail
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    tail = build_tail(RELEASED, seed=1234, device="cuda", float16=float16)
    chunks = script(StockToken2wavSession(tail, prompt, n_timesteps=n_timesteps, session_seed=seed), tokens)
    del tail
    gc.collect()
    torch.cuda.empty_cache()
    return chunks


@pytest.mark.parametrize(
    "float16,n_timesteps",
    [(False, 10), (False, 5), (True, 10), (True, 5)],
    ids=["fp32-n10", "fp32-n5", "fp16-n10", "fp16-n5"],
)
def test_graphs_replay_every_planned_chunk_bit_identical_to_stock(float16, n_timesteps):
    from duplexcadence.examples.minicpmo45.cadence import load_runtime
    from duplexcadence.examples.minicpmo45.model import RELEASED, build_tail, random_prompt
    from duplexcadence.interpreter.runtime.errors import CaptureWarning

    prompt = random_prompt(PROMPT_FRAMES, seed=4321, device="cuda")
    tokens = _tokens()
    reference = _stock_chunks(float16, n_timesteps, prompt, 3, tokens)

    bound = load_runtime(build_tail(RELEASED, seed=1234, device="cuda", float16=float16), PROMPT_FRAMES, n_timesteps)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureWarning)  # every stage captures
        driver = bound.session(prompt, seed=3)
    runtime = bound.runtime
    assert not runtime.blocked and not runtime.off_plan_blocked
    report = runtime.report()
    # stage graphs: flow x 3 (first, second, steady), hift_front x 2 and hift_back x 2 (first, steady);
    # each planned instant fuses its three stages into one graph (3 instant graphs), and so does each
    # declared turn end (after the first, second or a steady chunk: 3 more)
    assert report.graphs_planned == 7 and report.stage_graphs_covered == 7
    assert report.off_plan_instants == report.off_plan_graphs == 3 and report.graphs_captured == 6
    addresses = driver.session.data_ptrs()

    chunks = _script(driver, tokens)
    assert [chunk.shape[-1] for chunk in chunks] == SAMPLES
    for index, (mine, theirs) in enumerate(zip(chunks, reference, strict=True)):
        assert torch.equal(mine, theirs), f"chunk {index}"
    counters = driver.session.counters
    # the three stages of every planned shape, after a flush too, and of the declared turn ends
    assert counters.replays == 3 * (REGULAR + TURN_ENDS) and counters.replays_off_plan == 3 * TURN_ENDS
    assert counters.eager_planned == 0
    assert counters.eager_off_plan == 3 * (OFF_PLAN - TURN_ENDS) and counters.undeclared_steps == OFF_PLAN - TURN_ENDS
    assert driver.session.data_ptrs() == addresses


def test_declared_flushes_and_turn_ends_replay_graphs_and_nothing_runs_eagerly():
    """The script's every off-plan chunk declared (a 13-token flush anywhere, turn ends with 0 and 24 new
    tokens: 33 instants): each replays a graph captured ahead of time, bit-identical to stock (fp32, n = 5)."""
    from duplexcadence.examples.minicpmo45.cadence import load_runtime, turn_boundaries
    from duplexcadence.examples.minicpmo45.model import RELEASED, build_tail, random_prompt
    from duplexcadence.interpreter.plans.off_plan import OffPlanStep
    from duplexcadence.interpreter.runtime.errors import CaptureWarning

    prompt = random_prompt(PROMPT_FRAMES, seed=4321, device="cuda")
    tokens = _tokens()
    reference = _stock_chunks(False, 5, prompt, 3, tokens)
    declared = (OffPlanStep.of({"tokens": [10]}), *turn_boundaries(end_tokens=(0, 24)))
    tail = build_tail(RELEASED, seed=1234, device="cuda")
    bound = load_runtime(tail, PROMPT_FRAMES, 5, off_plan=declared)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureWarning)  # every stage captures, at the last instant too
        driver = bound.session(prompt, seed=3)
    report = bound.runtime.report()
    assert report.off_plan_instants == 33 and report.off_plan_graphs == 33

    chunks = _script(driver, tokens)
    for index, (mine, theirs) in enumerate(zip(chunks, reference, strict=True)):
        assert torch.equal(mine, theirs), f"chunk {index}"
    counters = driver.session.counters
    assert counters.eager_planned == counters.eager_off_plan == counters.undeclared_steps == 0
    assert counters.replays == 3 * (REGULAR + OFF_PLAN) and counters.replays_off_plan == 3 * OFF_PLAN
    assert counters.short_path_steps == REGULAR  # back on the plan after each flush: the short path again


def test_sessions_served_in_turn_each_equal_their_solo_stock_run():
    """Two voices with their own seeds and token streams, stepped alternately (fp32, n = 5)."""
    from duplexcadence.examples.minicpmo45.cadence import load_runtime
    from duplexcadence.examples.minicpmo45.model import RELEASED, build_tail, random_prompt

    def three_chunks(session, tokens):
        return [session.push_tokens(tokens[25 * i : 25 * i + 25])[0] for i in range(3)]

    prompts = [random_prompt(PROMPT_FRAMES, seed=seed, device="cuda") for seed in (4321, 99)]
    streams = [_tokens(2024), _tokens(7)]
    solo = [_stock_chunks(False, 5, prompts[i], 3 + i, streams[i], three_chunks) for i in range(2)]
    bound = load_runtime(build_tail(RELEASED, seed=1234, device="cuda"), PROMPT_FRAMES, 5, sessions=2)
    drivers = [bound.session(prompts[i], seed=3 + i) for i in range(2)]
    for index in range(3):
        for which in range(2):
            (chunk,) = drivers[which].push_tokens(streams[which][25 * index : 25 * index + 25])
            assert torch.equal(chunk, solo[which][index]), f"session {which}, chunk {index}"
    assert all(driver.session.counters.replays == 9 for driver in drivers)
