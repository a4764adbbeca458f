"""The runtime on the toy tail (every stock failure mode): bit-identity, stable addresses, errors.

CPU tests run in CI; the `gpu` tests capture CUDA graphs (run them where there is a CUDA device).
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.runtime.errors import SessionFailed, StepError
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
PROMPT, WINDOW = 6, 20
TICKS = 300  # warm-up is 20 frames (window fill) and the hyperperiod 25: 300 ticks pass both many times


def make(device="cpu", sessions=1, graphs="auto", max_graphs=None):
    model = build_toy(device=device)
    runtime = Runtime.load(CLOCK, model, device=device, sessions=sessions, graphs=graphs, max_graphs=max_graphs)
    prompt = make_prompt(model, PROMPT).to(device)
    return runtime, prompt


def test_build_toy_draws_its_weights_from_its_seed_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first, again, other = build_toy(seed=0), build_toy(seed=0), build_toy(seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    weights = [dict(model.state_dict()) for model in (first, again, other)]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    assert not all(torch.equal(weights[0][name], weights[2][name]) for name in weights[0])


def stock_for(prompt, device="cpu"):
    stock = ToyStockStream(build_toy(device=device), prompt, WINDOW)
    stock.initial = {"cache": prompt}
    return stock


def codes_stream(ticks=TICKS, seed=3, device="cpu"):
    codes = torch.randint(0, 64, (1, ticks), generator=torch.Generator().manual_seed(seed)).to(device)
    return lambda t: {"codes": codes[:, t : t + 1]}


def test_bit_identical_to_stock_over_warmup_and_steady_state():
    runtime, prompt = make()
    report = runtime.verify(stock_for(prompt), codes_stream(), ticks=TICKS)
    assert report.equal, str(report)
    assert report.outputs == TICKS
    assert report.runtime_counters.eager_off_plan == 0


def test_addresses_stable_across_ticks_and_reset():
    runtime, prompt = make()
    session = runtime.session(initial={"cache": prompt})
    before = session.data_ptrs()
    feed = codes_stream(60)
    for tick in range(60):
        session.step(**feed(tick))
        assert session.data_ptrs() == before
        assert session.region("cache").data_ptr() == before["cache"]
    session.reset()
    assert session.data_ptrs() == before
    for tick in range(30):
        session.step(**feed(tick))
    assert session.data_ptrs() == before


def test_arena_is_one_allocation_of_the_planned_size():
    runtime, _ = make(sessions=3)
    plan = runtime.plan.arena
    assert runtime.arena.buffer.numel() == plan.total_bytes(3) == 3 * plan.session_bytes + plan.scratch_bytes


def test_region_views_have_the_exact_shape_of_the_tick():
    runtime, prompt = make()
    session = runtime.session(initial={"cache": prompt})
    feed = codes_stream(30)
    lengths = []
    for tick in range(25):
        session.step(**feed(tick))
        lengths.append(session.region("cache").shape[3])
        assert session.region("cache").is_contiguous()
    # prompt 6, then +1 per frame up to prompt + window = 26
    assert lengths[:3] == [7, 8, 9] and lengths[-1] == PROMPT + WINDOW
    assert session.region("carry").shape == (1, 32, 2)


def test_reset_restores_the_start_and_outputs_repeat():
    runtime, prompt = make()
    session = runtime.session(initial={"cache": prompt}, seed=7)
    feed = codes_stream(40)
    first = [session.step(**feed(t)) for t in range(40)]
    session.reset()
    second = [session.step(**feed(t)) for t in range(40)]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_wrong_input_is_rejected_and_the_session_continues_exactly():
    runtime, prompt = make()
    session = runtime.session(initial={"cache": prompt})
    stock = stock_for(prompt)
    stock.reset()
    torch.manual_seed(0)
    feed = codes_stream(40)
    bad_inputs = [
        ({"codes": torch.zeros(1, 1, dtype=torch.int32)}, "dtype"),
        ({"codes": torch.zeros(2, 1, dtype=torch.int64)}, "expected i64[1, 1]"),
        ({"codes": torch.zeros(1, 1, 1, dtype=torch.int64)}, "got i64[1, 1, 1]"),
        ({"tokens": torch.zeros(1, 1, dtype=torch.int64)}, "missing codes; unexpected tokens"),
        ({}, "missing codes"),
    ]
    from duplexcadence.interpreter.runtime.rng import get_rng_state, seeded_rng_state, set_rng_state

    stock_rng = seeded_rng_state(0, torch.device("cpu"))
    for tick in range(40):
        if tick % 7 == 3:
            inputs, text = bad_inputs[(tick // 7) % len(bad_inputs)]
            with pytest.raises(StepError, match=text.replace("[", r"\[").replace("]", r"\]")):
                session.step(**inputs)
        actual = session.step(**feed(tick))
        saved = get_rng_state(torch.device("cpu"))
        set_rng_state(torch.device("cpu"), stock_rng)
        expected = stock.step(**feed(tick))
        stock_rng = get_rng_state(torch.device("cpu"))
        set_rng_state(torch.device("cpu"), saved)
        assert torch.equal(actual, expected), f"tick {tick}"


def test_exception_in_a_stage_fails_only_that_session():
    runtime, prompt = make(sessions=2)
    broken = runtime.session(initial={"cache": prompt})
    healthy = runtime.session(initial={"cache": prompt})
    feed = codes_stream(10)
    original = runtime.callables["attend"]
    calls = {"n": 0}

    def explode(*args, **kwargs):
        calls["n"] += 1
        raise RuntimeError("injected fault")

    import attrs

    runtime.callables["attend"] = attrs.evolve(original, fn=explode)
    with pytest.raises(
        SessionFailed,
        match=r"stage 'attend' \(module 'attention' called as \(hidden f32\[1, 32, 1\], "
        r"cache f32\[2, 1, 4, 6, 8\]\)\) raised at instant 0",
    ):
        broken.step(**feed(0))
    runtime.callables["attend"] = original
    with pytest.raises(SessionFailed, match=r"the session failed at instant 0 .*call reset\(\) to start it again"):
        broken.step(**feed(0))
    for tick in range(5):
        healthy.step(**feed(tick))
    broken.reset()
    reference = runtime.session  # the slots are full; compare the recovered session with the healthy one
    del reference
    healthy.reset()
    assert all(torch.equal(broken.step(**feed(t)), healthy.step(**feed(t))) for t in range(8))


def test_interleaved_sessions_each_equal_their_solo_stock_run():
    runtime, prompt = make(sessions=3)
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(3)]
    feeds = [codes_stream(50, seed=10 + s) for s in range(3)]
    outputs = {s: [] for s in range(3)}
    for tick in range(50):
        for s in range(3):
            if tick >= 5 * s:  # staggered starts
                outputs[s].append(sessions[s].step(**feeds[s](tick - 5 * s)))
    for s in range(3):
        rt, _ = make()
        report = rt.verify(stock_for(prompt), feeds[s], ticks=len(outputs[s]), seed=s)
        assert report.equal
        session = rt.session(initial={"cache": prompt}, seed=s)
        solo_outputs = [session.step(**feeds[s](t)) for t in range(len(outputs[s]))]
        assert all(torch.equal(a, b) for a, b in zip(outputs[s], solo_outputs))


def test_binding_with_a_wrong_shape_is_a_located_error():
    model = build_toy()
    model.upsample.partial = torch.zeros(1, 5, 2)  # the .clock declares f32[B, 4, time]
    with pytest.raises(ClockError) as caught:
        Runtime.load(CLOCK, model)
    diagnostic = caught.value.diagnostics[0]
    assert diagnostic.code.name == "binding-mismatch"
    assert diagnostic.message == (
        "region 'partial' is declared f32[1, 4, time] but 'upsample.partial' is f32[1, 5, 2] on cpu"
    )
    assert diagnostic.span.path.endswith("toy.clock")
    assert CLOCK.read_text().splitlines()[diagnostic.span.line - 1].lstrip().startswith("region partial")


def test_unknown_module_path_is_a_located_error():
    text = CLOCK.read_text().replace('module "attention"', 'module "atention"')
    path = CLOCK.parent / "_broken_toy.clock"
    try:
        path.write_text(text)
        with pytest.raises(ClockError) as caught:
            Runtime.load(path, build_toy())
    finally:
        path.unlink()
    diagnostic = caught.value.diagnostics[0]
    assert diagnostic.message.startswith("stage 'attend' calls 'atention', 'ToyTail' has no attribute 'atention'")


def test_a_session_needs_its_given_regions():
    runtime, prompt = make()
    with pytest.raises(StepError, match="needs initial values for cache"):
        runtime.session()
    with pytest.raises(StepError, match=r"expected f32\[2, 1, 4, 6, 8\]"):
        runtime.session(initial={"cache": prompt[:, :, :, :5]})


def test_reset_many_times_allocates_nothing_new():
    runtime, prompt = make()
    session = runtime.session(initial={"cache": prompt})
    pointers = session.data_ptrs()
    buffer = runtime.arena.buffer.data_ptr()
    feed = codes_stream(3)
    for _ in range(1000):
        session.reset()
    for tick in range(3):
        session.step(**feed(tick))
    assert session.data_ptrs() == pointers and runtime.arena.buffer.data_ptr() == buffer


@pytest.mark.gpu
def test_gpu_graphs_bit_identical_and_every_planned_graph_captured():
    torch.backends.cudnn.deterministic = True
    runtime, prompt = make(device="cuda")
    report = runtime.verify(stock_for(prompt, "cuda"), codes_stream(device="cuda"), ticks=TICKS, deterministic=True)
    assert report.equal, str(report)
    counters = report.runtime_counters
    assert counters.eager_off_plan == 0 and counters.eager_planned == 0
    assert counters.replays == 3 * TICKS
    report = runtime.report()
    assert report.stage_graphs_covered == len(runtime.plan.capture.graphs)
    assert report.graphs_captured == len({tuple(f.signature for f in t.firings) for t in runtime.templates})


@pytest.mark.gpu
def test_gpu_no_automatic_garbage_collection_inside_a_capture():
    """Runtimes are reference cycles (runtime <-> session) that hold CUDA graphs. A collection inside a
    capture may destroy such a garbage runtime's graphs, which invalidates the capture: its failed end leaves
    the default generator marked as capturing, and every later replay of a random-drawing graph raises
    'Offset increment outside graph capture' (seen once in a GPU test run, through the order of collections).
    The collector is made to run at nearly every allocation here: none may start while a stream captures."""
    torch.backends.cudnn.deterministic = True
    collections_in_captures = []

    def watch(phase, info):
        if phase == "start" and torch.cuda.is_current_stream_capturing():
            collections_in_captures.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(watch)
    try:
        runtime, prompt = make(device="cuda")
        session = runtime.session(initial={"cache": prompt})
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*threshold)
    assert collections_in_captures == []
    assert runtime.report().graphs_captured > 0 and not runtime.blocked
    session.close()
    report = runtime.verify(stock_for(prompt, "cuda"), codes_stream(device="cuda"), ticks=60, deterministic=True)
    assert report.equal, str(report)


@pytest.mark.gpu
def test_gpu_stages_warm_up_on_the_callers_stream_and_only_captures_run_on_the_side_stream():
    """Eager work of a model on a side stream makes every CUDA graph in the process replay slower
    (docs/benchmarks.md, "CUDA graph replay on the H200"): every eager run of a stage body while a session captures
    its graphs (the warm-up and the host-sync probe) is on the caller's stream, every capture on the lane's."""
    from duplexcadence.interpreter.runtime.body import Body

    runtime, prompt = make(device="cuda")
    caller = torch.cuda.current_stream()
    eager_streams, capture_streams = [], []
    run_body = Body.run

    def recording(self, firing):
        streams = capture_streams if torch.cuda.is_current_stream_capturing() else eager_streams
        streams.append(torch.cuda.current_stream())
        return run_body(self, firing)

    Body.run = recording
    try:
        session = runtime.session(initial={"cache": prompt})
    finally:
        Body.run = run_body
    assert eager_streams and capture_streams
    assert set(eager_streams) == {caller}
    assert set(capture_streams) == {runtime.lane_stream(0)} and caller not in capture_streams
    session.close()


@pytest.mark.gpu
def test_gpu_replays_are_resolved_at_capture_and_shared_by_the_slots_next_sessions():
    """Every planned instant's graph runs are resolved when the slot captures (a warm-up instant is stepped
    once per session: resolving on first use would cost each warm-up step), and a later session of the
    same slot steps on the same resolved views."""
    runtime, prompt = make(device="cuda")
    first = runtime.session(initial={"cache": prompt})
    assert set(first.replays) == set(range(len(runtime.templates)))
    assert all(replays is not None for replays in first.replays.values())
    first.close()
    second = runtime.session(initial={"cache": prompt})
    assert second.replays is first.replays


@pytest.mark.gpu
def test_gpu_graph_budget_sends_the_rest_eager_and_still_matches():
    runtime, prompt = make(device="cuda", max_graphs=4)
    report = runtime.verify(stock_for(prompt, "cuda"), codes_stream(device="cuda"), ticks=80, deterministic=True)
    assert report.equal, str(report)
    assert report.runtime_counters.eager_planned > 0 and report.runtime_counters.replays > 0


@pytest.mark.gpu
def test_gpu_failed_capture_falls_back_eager_with_a_warning():
    from duplexcadence.interpreter.runtime.errors import CaptureWarning

    model = build_toy(device="cuda")
    original = model.attention.forward

    def syncing_forward(x, cache):
        float(cache.sum())  # a host sync: the capture probe must catch it
        return original(x, cache)

    model.attention.forward = syncing_forward
    runtime = Runtime.load(CLOCK, model, device="cuda")
    prompt = make_prompt(model, PROMPT).cuda()
    with pytest.warns(CaptureWarning, match="stage 'attend' cannot be captured"):
        session = runtime.session(initial={"cache": prompt})
    session.close()
    report = runtime.verify(stock_for(prompt, "cuda"), codes_stream(device="cuda"), ticks=60, deterministic=True)
    assert report.equal
    assert "attend" in runtime.blocked
