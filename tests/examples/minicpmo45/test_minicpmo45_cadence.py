"""MiniCPM-o 4.5's token2wav tail under the DuplexCadence runtime vs stock ``Token2wav.stream``, on the CPU.

CI time forces the reduced tail of conftest.py (1 + 1 conformer layers, a 1-layer DiT, HiFT with 32
base channels, P = 20 prompt frames, 2 Euler steps; released 6 + 4, 16, 512, 150, 10 / 5): the
clock, the hooks and the runtime are the same at every size. The runtime takes its own tail over
(built with the same seed as stock's). Every chunk of three turns (first, second and four steady
chunks, forced flushes, last chunks up to 27 tokens, a flush as the first chunk of a turn) is
compared with ``torch.equal``. On the CPU every firing runs eagerly; tests/examples/minicpmo45/
test_minicpmo45_cadence_gpu.py captures the graphs at released sizes.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

REQUIRED_MODULES = ("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
MISSING = [name for name in REQUIRED_MODULES if name not in sys.modules and importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.models,
    pytest.mark.slow,  # the tail streamed on the CPU
    pytest.mark.skipif(
        bool(MISSING), reason=f"needs {', '.join(MISSING)} (pip install --no-deps stepaudio2-minicpmo==0.1.1 ...)"
    ),
]

CLOCK = Path(__file__).resolve().parents[3] / "stdlib" / "models" / "step_audio2_token2wav.clock"
CARRIED = (
    "tokens",
    "speaker",
    "conformer_att",
    "conformer_cnn",
    "estimator_att",
    "estimator_cnn",
    "noise",
    "hift_mel",
    "hift_source",
    "hift_speech",
)


@dataclass
class RuntimeRun:
    chunks: list[torch.Tensor]
    data_ptrs: list[dict[str, int]] = field(default_factory=list)
    view_ptrs: list[dict[str, int]] = field(default_factory=list)
    lengths: list[dict[str, int]] = field(default_factory=list)
    regions_after_turn_1: dict[str, torch.Tensor] = field(default_factory=dict)
    counters: object = None
    report: object = None


class Recording:
    """Wraps the runtime driver: records addresses and lengths of the regions after every push."""

    def __init__(self, driver, run: RuntimeRun):
        self.driver, self.run = driver, run

    def _record(self) -> None:
        session = self.driver.session
        self.run.data_ptrs.append(session.data_ptrs())
        views = {name: session.region(name) for name in CARRIED}
        self.run.view_ptrs.append({name: view.data_ptr() if view.numel() else 0 for name, view in views.items()})
        self.run.lengths.append({name: tuple(view.shape) for name, view in views.items()})
        assert all(view.is_contiguous() for view in views.values())

    def push_tokens(self, *args, **kwargs):
        chunks = self.driver.push_tokens(*args, **kwargs)
        self._record()
        return chunks

    def reset(self) -> None:
        self.driver.reset()
        self._record()


def script_boundaries():
    """The steps off the plan the token script takes: forced flushes of 10 tokens (mid-turn and at a turn's
    start) and turn ends with 0, 5 and 24 new tokens."""
    from duplexcadence.examples.minicpmo45.cadence import turn_boundaries
    from duplexcadence.interpreter.plans.off_plan import OffPlanStep

    return (OffPlanStep.of({"tokens": [10]}), *turn_boundaries(end_tokens=(0, 5, 24)))


@pytest.fixture(scope="module")
def bound(build_reduced_tail, spec):
    from duplexcadence.examples.minicpmo45.cadence import load_runtime

    return load_runtime(
        build_reduced_tail(), spec.prompt_frames, spec.n_timesteps, sessions=2, off_plan=script_boundaries()
    )


@pytest.fixture(scope="module")
def runtime_run(bound, prompt, spec, script) -> RuntimeRun:
    driver = bound.session(prompt, seed=spec.session_seed)
    run = RuntimeRun(chunks=[])
    recording = Recording(driver, run)

    def keep(turn: int) -> None:
        if turn == 0:
            run.regions_after_turn_1 = {name: driver.session.region(name).clone() for name in CARRIED}

    run.chunks = script(recording, after_turn=keep)
    run.counters = driver.session.counters
    run.report = bound.runtime.report()
    driver.close()
    return run


def test_every_chunk_is_bit_identical_to_stock(runtime_run, reference, spec):
    assert [chunk.shape[-1] for chunk in runtime_run.chunks] == spec.samples
    for index, (mine, theirs) in enumerate(zip(runtime_run.chunks, reference.chunks, strict=True)):
        assert mine.dtype == theirs.dtype == torch.float32
        assert torch.equal(mine, theirs), f"chunk {index}"


def test_carried_state_equals_stock_after_a_turn_with_flush_and_last_chunk(runtime_run, reference, spec):
    regions, flow, hift = (
        runtime_run.regions_after_turn_1,
        reference.flow_cache_after_turn_1,
        reference.hift_cache_after_turn_1,
    )
    n = spec.n_timesteps
    assert torch.equal(regions["conformer_att"], flow["conformer_att_cache"])
    assert torch.equal(regions["conformer_cnn"], flow["conformer_cnn_cache"])
    # stock carries all 16 ODE slots; the runtime the n it uses (stock's others stay zero)
    assert torch.equal(regions["estimator_att"], flow["estimator_att_cache"][:n])
    assert torch.equal(regions["estimator_cnn"], flow["estimator_cnn_cache"][:n])
    assert torch.equal(regions["hift_mel"], hift["mel"])
    assert torch.equal(regions["hift_source"], hift["source"])
    assert torch.equal(regions["hift_speech"], hift["speech"])


def test_region_addresses_never_move(runtime_run):
    base = runtime_run.data_ptrs[0]
    assert all(ptrs == base for ptrs in runtime_run.data_ptrs)
    for views in runtime_run.view_ptrs:  # an empty view (HiFT caches at a turn start) has no address
        assert {name: ptr for name, ptr in views.items() if ptr} == {name: base[name] for name in views if views[name]}
    assert all(ptr for ptr in runtime_run.view_ptrs[0].values())


def test_views_have_the_exact_shapes_of_each_chunk(runtime_run, spec):
    p = spec.prompt_frames
    estimator = [shape["estimator_att"][4] for shape in runtime_run.lengths]
    conformer = [shape["conformer_att"][3] for shape in runtime_run.lengths]
    # after each push of turn 1: first, second, 4 steady, the 10-token flush, the 3-token last chunk;
    # then the reset; turn 2: 2 regular, the 27-token last; the reset; turn 3: the flush, the last
    expected = [
        p + 50,
        p + 100,
        p + 100,
        p + 100,
        p + 100,
        p + 100,
        p + 100,
        p + 100,
        p,
        p + 50,
        p + 100,
        p + 100,
        p,
        p + 20,
        p + 20 + 16,
    ]
    assert estimator == expected and conformer == expected
    tokens = [shape["tokens"][1] for shape in runtime_run.lengths]
    assert tokens[:6] == [3] * 6
    assert [shape["hift_speech"][1] for shape in runtime_run.lengths][:2] == [3840, 3840]


def test_planned_chunks_follow_the_plan_and_flush_and_last_run_off_plan(runtime_run, spec):
    counters = runtime_run.counters
    regular = sum(1 for window in spec.windows if window == 28)
    off_plan = len(spec.windows) - regular
    # each chunk fires flow, hift_front and hift_back; on the CPU all of them run eagerly
    assert counters.replays == 0
    assert counters.eager_planned == 3 * regular
    assert counters.eager_off_plan == 3 * off_plan
    assert runtime_run.report.graphs_planned == 7
    # every off-plan chunk is an instant the declared steps lead to: on a GPU each replays its graph run
    assert counters.undeclared_steps == 0 and runtime_run.report.undeclared_steps == 0
    assert runtime_run.report.off_plan_instants == len(script_boundaries_plan(spec).off_plan.instants) == 42


def script_boundaries_plan(spec, steps=None):
    from duplexcadence.dsl.frontend import load_program
    from duplexcadence.interpreter.plans.plan import make_plan

    program = load_program(CLOCK, {"P": str(spec.prompt_frames), "steps": str(spec.n_timesteps), "layers": "2"})
    return make_plan(program, off_plan=script_boundaries() if steps is None else steps)


def test_minicpm_os_default_turn_boundaries_are_the_turn_ends_after_whole_chunks(spec):
    """What `load_runtime` declares unless told: the end of a turn whose TTS units brought 25 tokens each (the
    3 lookahead tokens only), after the first, second or a steady chunk; the script's other off-plan chunks
    (two 10-token flushes, turn ends with 5 and 24 new tokens) are not among them."""
    from duplexcadence.examples.minicpmo45.cadence import turn_boundaries

    assert [step.text() for step in turn_boundaries()] == ["finish tokens=0 at any"]
    assert [step.text() for step in turn_boundaries(range(5, 25), (0, 3))] == [
        "step tokens=5-24 at start",
        "finish tokens=0 tokens=3 at any",
    ]
    off = script_boundaries_plan(spec, turn_boundaries()).off_plan
    assert [(i.instant, i.last) for i in off.instants] == [(0, True), (1, True), (2, True)]
    with pytest.raises(
        ValueError, match=r"a forced flush streams 5 to 24 new tokens short of the planned 25, not \[4\]"
    ):
        turn_boundaries([4])
    with pytest.raises(ValueError, match=r"the end of a turn streams 0 to 24 new tokens, not \[25\]"):
        turn_boundaries(end_tokens=[25])


def test_sessions_served_in_turn_each_equal_their_solo_stock_run(bound, tail, prompt, reference, spec):
    """Two voices (prompts) with their own seeds, stepped alternately through one runtime."""
    from duplexcadence.examples.minicpmo45 import model, stock

    other_prompt = model.random_prompt(spec.prompt_frames, seed=99)
    tokens = spec.tokens()
    solo_b = stock.StockToken2wavSession(tail, other_prompt, n_timesteps=spec.n_timesteps, session_seed=11)
    expected_b = [solo_b.push_tokens(tokens[25 * i : 25 * i + 25])[0] for i in range(3)]
    a = bound.session(prompt, seed=spec.session_seed)
    b = bound.session(other_prompt, seed=11)
    try:
        assert a.session.slot != b.session.slot
        for index in range(3):
            (chunk_a,) = a.push_tokens(tokens[25 * index : 25 * index + 25])
            (chunk_b,) = b.push_tokens(tokens[25 * index : 25 * index + 25])
            assert torch.equal(chunk_a, reference.chunks[index])
            assert torch.equal(chunk_b, expected_b[index])
    finally:
        a.close()
        b.close()


def test_hift_s_own_istft_gives_the_same_chunks(build_reduced_tail, prompt, reference, spec):
    """`istft="torch"` (HiFT's own `torch.istft`, `hift_back` eager on a GPU) equals stock as the captured
    iSTFT does; an unknown choice is refused with the legal ones."""
    from duplexcadence.examples.minicpmo45.cadence import load_runtime

    tail = build_reduced_tail()
    with pytest.raises(ValueError, match=r"^istft must be one of captured, torch, not 'fft'$"):
        load_runtime(tail, spec.prompt_frames, spec.n_timesteps, istft="fft")  # before the tail is touched
    tokens = spec.tokens()
    driver = load_runtime(tail, spec.prompt_frames, spec.n_timesteps, istft="torch").session(
        prompt, seed=spec.session_seed
    )
    try:
        for index in range(3):
            (chunk,) = driver.push_tokens(tokens[25 * index : 25 * index + 25])
            assert torch.equal(chunk, reference.chunks[index]), f"chunk {index}"
    finally:
        driver.close()


def test_a_turn_must_be_reset_after_it_ended(bound, prompt, spec):
    driver = bound.session(prompt, seed=spec.session_seed)
    try:
        driver.push_tokens([], end_of_turn=True)
        with pytest.raises(RuntimeError, match="reset"):
            driver.push_tokens([1, 2, 3])
        driver.reset()
        assert driver.pending == [] and not driver.turn_finished
    finally:
        driver.close()


def test_plan_at_released_sizes():
    from duplexcadence.interpreter.plans.plan import plan_file

    plan = plan_file(CLOCK)
    regions = plan.schedule.regions
    assert regions["cfm_att"].shape == (10, 16, 2, 8, 150 + 154, 128) and not regions["cfm_att"].persistent
    assert regions["cfm_att"].stock_shape == (16, 16, 2, 8, 1000, 128)
    assert regions["dit_att"].shape == (16, 2, 8, 304, 128)
    assert regions["estimator_att"].shape == (10, 16, 2, 8, 250, 128) and regions["estimator_att"].persistent
    assert regions["conformer_att"].shape == (10, 1, 8, 250, 128)
    assert regions["estimator_cnn"].shape == (10, 16, 2, 1024, 2) and regions["estimator_cnn"].persistent
    assert regions["noise"].shape == (1, 80, 304)
    # a turn's end with a full input: 28 tokens -> 56 frames, 26 880 + 3 840 released samples
    assert regions["chunk_mel"].capacity == 56 and regions["pcm"].capacity == 30_720
    assert plan.trace.warmup_instants == 2 and plan.trace.period_instants == 1
    flows = [f for f in plan.trace.firings if f.stage == "flow"]
    in_flight = [next(v.transient for v in f.views if v.region == "estimator_att") for f in flows]
    kept = [next(v.kept for v in f.views if v.region == "estimator_att") for f in flows]
    assert in_flight == [200, 250, 300] and kept == [200, 250, 250]
    assert [g.stage for g in plan.capture.graphs] == [
        "flow",
        "hift_front",
        "hift_back",
        "flow",
        "hift_front",
        "hift_back",
        "flow",
    ]
    five = plan_file(CLOCK, {"steps": "5"})
    assert five.schedule.regions["cfm_att"].bytes * 2 == regions["cfm_att"].bytes


def test_float16_program_retypes_only_the_flow_tensors():
    from duplexcadence.dsl.frontend import load_program
    from duplexcadence.examples.minicpmo45.cadence import FLOAT16_REGIONS, float16_program

    program = float16_program(load_program(CLOCK))
    halves = {name for name, region in program.regions.items() if region.dtype == "f16"}
    assert halves == set(FLOAT16_REGIONS)
    assert program.regions["conformer_cnn"].dtype == "f32" and program.regions["hift_mel"].dtype == "f32"
    assert all(program.regions[name].itemsize == 2 for name in halves)
