"""Lanes and `Runtime.step_many` on the toy tail: concurrent sessions, each bit-identical to its solo stock run.

With `lanes=K` the arena holds K scratch blocks; slot i is in lane i % K. `step_many` interleaves the
sessions of different lanes run by run on the caller's thread (on CPU on the host, on CUDA each lane on its
own stream), or with `lane_threads` (the default on CUDA) steps each lane from a thread of its own; the
sessions of one lane run one after another. CPU tests run in CI (`lane_threads=True` forced there); the
`gpu` tests add streams, graph replay and per-lane graph pools and generator states.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import attrs
import pytest
import torch

from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.runtime.errors import SessionFailed, SessionsFailed, StepError
from duplexcadence.interpreter.runtime.rng import get_rng_state, seeded_rng_state, set_rng_state
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
PROMPT, WINDOW = 6, 20
TICKS = 300


def make(device="cpu", sessions=4, lanes=2, graphs="auto", lane_threads=None):
    model = build_toy(device=device)
    runtime = Runtime.load(
        CLOCK, model, device=device, sessions=sessions, lanes=lanes, graphs=graphs, lane_threads=lane_threads
    )
    return runtime, make_prompt(model, PROMPT).to(device)


def codes_of(seed: int, ticks: int = TICKS, device="cpu") -> torch.Tensor:
    return torch.randint(0, 64, (1, ticks), generator=torch.Generator().manual_seed(seed)).to(device)


class SoloStock:
    """One session's solo stock run: the stock stream with its own generator state from `seed` (as verify)."""

    def __init__(self, prompt: torch.Tensor, seed: int, device="cpu"):
        self.device = torch.device(device)
        self.stock = ToyStockStream(build_toy(device=device), prompt, WINDOW)
        self.stock.reset()
        self.rng = seeded_rng_state(seed, self.device)

    def step(self, codes: torch.Tensor) -> torch.Tensor:
        saved = get_rng_state(self.device)
        set_rng_state(self.device, self.rng)
        out = self.stock.step(codes=codes)
        self.rng = get_rng_state(self.device)
        set_rng_state(self.device, saved)
        return out


def serve(runtime, prompt, count: int, ticks: int = TICKS, device="cpu"):
    """`count` sessions (seeds 0..count-1, own inputs) stepped together by step_many for `ticks` ticks;
    returns the sessions and every session's output per tick, after checking against solo stock."""
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(count)]
    codes = [codes_of(10 + s, ticks, device) for s in range(count)]
    solo = [SoloStock(prompt, s, device) for s in range(count)]
    pointers = [s.data_ptrs() for s in sessions]
    with torch.no_grad():
        for tick in range(ticks):
            outputs = runtime.step_many({s: {"codes": c[:, tick : tick + 1]} for s, c in zip(sessions, codes)})
            assert list(outputs) == sessions
            for index, session in enumerate(sessions):
                expected = solo[index].step(codes[index][:, tick : tick + 1])
                assert torch.equal(outputs[session], expected), f"session {index}, tick {tick}"
    assert [s.data_ptrs() for s in sessions] == pointers
    return sessions


def attend_failing_for(runtime, victim, error):
    """The runtime's 'attend' stage, raising `error()` in `victim`'s firings (found by its lane's scratch)."""
    original = runtime.callables["attend"]

    def attend(*args, **kwargs):
        if args[0].data_ptr() == victim.storage["hidden"].flat.data_ptr():
            raise error()
        return original.fn(*args, **kwargs)

    return attrs.evolve(original, fn=attend)


@pytest.mark.parametrize("lane_threads", [False, True])
@pytest.mark.parametrize("count,lanes", [(4, 2), (3, 2), (3, 3)])
def test_step_many_each_session_equals_its_solo_stock_run(count, lanes, lane_threads):
    runtime, prompt = make(sessions=count, lanes=lanes, lane_threads=lane_threads)
    assert runtime.lane_threads is lane_threads
    sessions = serve(runtime, prompt, count, ticks=TICKS if not lane_threads else 100)
    assert [s.lane for s in sessions] == [i % lanes for i in range(count)]
    ticks = TICKS if not lane_threads else 100
    assert all(s.counters.steps == ticks and s.counters.eager_off_plan == 0 for s in sessions)


def test_lane_threads_are_on_by_default_only_for_cuda_lanes():
    assert make(sessions=2, lanes=2)[0].lane_threads is False  # the CPU: interleaved on the caller's thread
    assert make(sessions=2, lanes=1, lane_threads=True)[0].lane_threads is True


def test_lane_threads_step_each_lane_on_a_thread_of_its_own_and_eager_firings_take_turns():
    runtime, prompt = make(sessions=4, lanes=2, lane_threads=True)
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(4)]  # lanes 0, 1, 0, 1
    calls = []
    original = runtime.callables["attend"]

    def record(*args, **kwargs):
        began = time.perf_counter()
        time.sleep(0.02)  # without the eager lock the other lane's firing would start in here
        out = original.fn(*args, **kwargs)
        calls.append((args[0].data_ptr(), threading.current_thread().name, began, time.perf_counter()))
        return out

    runtime.callables["attend"] = attrs.evolve(original, fn=record)
    codes = {"codes": codes_of(1)[:, :1]}
    runtime.step_many({session: codes for session in sessions})
    runtime.callables["attend"] = original
    scratch = {session.storage["hidden"].flat.data_ptr(): session.lane for session in sessions}
    threads = {}
    for pointer, thread, _, _ in calls:
        threads.setdefault(scratch[pointer], set()).add(thread)
    assert len(calls) == 4 and all(len(names) == 1 for names in threads.values())
    assert threads[0] != threads[1] and all(name.startswith("duplexcadence-lane") for (name,) in threads.values())
    spans = sorted((began, ended) for _, _, began, ended in calls)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))  # never two at once


def test_lane_threads_step_in_the_caller_s_inference_mode():
    """Grad and inference modes are per thread: a runtime loaded and stepped under inference_mode has an
    arena of inference tensors, which its lane threads may write only in that mode too."""
    with torch.inference_mode():
        runtime, prompt = make(sessions=2, lanes=2, lane_threads=True)
        sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(2)]
        solo = [SoloStock(prompt, s) for s in range(2)]
        codes = codes_of(7, 5)
        for tick in range(5):
            outputs = runtime.step_many({s: {"codes": codes[:, tick : tick + 1]} for s in sessions})
            for index, session in enumerate(sessions):
                assert torch.equal(outputs[session], solo[index].step(codes[:, tick : tick + 1])), (index, tick)


def test_lane_threads_a_stage_raising_fails_its_session_only():
    runtime, prompt = make(sessions=3, lanes=2, lane_threads=True)
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(3)]
    solo = [SoloStock(prompt, s) for s in range(3)]
    codes = codes_of(30, 3)
    original = runtime.callables["attend"]
    victim = sessions[1]
    runtime.callables["attend"] = attend_failing_for(runtime, victim, lambda: RuntimeError("injected fault"))
    with pytest.raises(SessionsFailed, match=r"the session\(s\) in slot 1 failed; the others completed") as caught:
        runtime.step_many({s: {"codes": codes[:, :1]} for s in sessions})
    runtime.callables["attend"] = original
    assert list(caught.value.failures) == [victim] and list(caught.value.outputs) == [sessions[0], sessions[2]]
    for index in (0, 2):
        assert torch.equal(caught.value.outputs[sessions[index]], solo[index].step(codes[:, :1]))


def test_lane_threads_an_interrupt_stops_its_lane_and_the_other_lanes_complete():
    runtime, prompt = make(sessions=4, lanes=2, lane_threads=True)
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(4)]  # lanes 0, 1, 0, 1
    solo = [SoloStock(prompt, s) for s in range(4)]
    codes = codes_of(50, 4)
    original = runtime.callables["attend"]
    victim = sessions[1]
    runtime.callables["attend"] = attend_failing_for(runtime, victim, Interrupt)
    with pytest.raises(Interrupt):
        runtime.step_many({s: {"codes": codes[:, :1]} for s in sessions})
    runtime.callables["attend"] = original
    with pytest.raises(SessionFailed, match=r"the session failed at instant 0 \(Interrupt\(\)\)"):
        victim.step(codes=codes[:, :1])
    # lane 0 completed its instant (sessions 0 and 2); session 3, after the victim in lane 1, had not started
    assert [s.instant for s in sessions] == [1, 0, 1, 0]
    for index in (0, 2):
        solo[index].step(codes[:, :1])
    for tick in range(1, 4):
        outputs = runtime.step_many({s: {"codes": codes[:, tick : tick + 1]} for s in (sessions[0], sessions[2])})
        for index in (0, 2):
            assert torch.equal(outputs[sessions[index]], solo[index].step(codes[:, tick : tick + 1]))
    assert torch.equal(sessions[3].step(codes=codes[:, :1]), solo[3].step(codes[:, :1]))


def test_each_lane_has_its_own_scratch_and_the_arena_reports_it():
    runtime, prompt = make(sessions=4, lanes=2)
    plan = runtime.plan.arena
    assert runtime.arena.buffer.numel() == plan.total_bytes(4, 2) == 4 * plan.session_bytes + 2 * plan.scratch_bytes
    sessions = [runtime.session(initial={"cache": prompt}) for _ in range(4)]
    scratch = [name for name, r in runtime.plan.schedule.regions.items() if not r.persistent]
    assert scratch, "the toy has scratch regions"
    for name in scratch:
        pointers = [s.data_ptrs()[name] for s in sessions]
        assert pointers[0] == pointers[2] and pointers[1] == pointers[3] and pointers[0] != pointers[1]
    report = runtime.report()
    assert report.lanes == 2 and report.arena_bytes == plan.total_bytes(4, 2)
    assert "4 session slot(s) in 2 lanes" in str(report) and "2 x " in str(report)
    assert "one copy per lane" in str(report)


def test_one_lane_is_the_same_arena_and_the_same_outputs_as_step():
    one_lane, prompt = make(sessions=3, lanes=1)
    plain = Runtime.load(CLOCK, build_toy(), sessions=3)  # lanes left out
    assert one_lane.arena.nbytes == plain.arena.nbytes == plain.plan.arena.total_bytes(3)
    assert one_lane.report() == plain.report() and "shared scratch" in str(plain.report())
    offsets = []
    for runtime in (one_lane, plain):
        base = runtime.arena.buffer.data_ptr()
        offsets.append(
            [
                {name: pointer - base for name, pointer in session.data_ptrs().items()}
                for session in (runtime.session(initial={"cache": prompt}) for _ in range(3))
            ]
        )
        for session in list(runtime.sessions):
            session.close()
    assert offsets[0] == offsets[1]
    serve(one_lane, prompt, 3, ticks=60)  # three sessions of one lane: one after another in the lane


def test_step_many_interleaves_lanes_run_by_run_and_serialises_a_lane():
    runtime, prompt = make(sessions=4, lanes=2)
    sessions = [runtime.session(initial={"cache": prompt}) for _ in range(4)]
    order = []
    for stage, call in list(runtime.callables.items()):

        def record(*args, _fn=call.fn, _stage=stage, **kwargs):
            order.append(_stage)
            return _fn(*args, **kwargs)

        runtime.callables[stage] = attrs.evolve(call, fn=record)
    codes = {"codes": codes_of(1)[:, :1]}
    stages = ["encode", "attend", "upsample"]
    runtime.step_many({sessions[0]: codes, sessions[1]: codes})  # lanes 0 and 1: run by run
    assert order == [stage for stage in stages for _ in range(2)]
    order.clear()
    runtime.step_many({sessions[0]: codes, sessions[2]: codes})  # both in lane 0: one after the other
    assert order == stages + stages


def test_one_positional_tensor_per_session_is_accepted():
    runtime, prompt = make(sessions=2, lanes=2)
    a, b = (runtime.session(initial={"cache": prompt}, seed=s) for s in range(2))
    codes = codes_of(5)
    outputs = runtime.step_many({a: codes[:, :1], b: codes[:, 1:2]})
    solo = [SoloStock(prompt, s) for s in range(2)]
    assert torch.equal(outputs[a], solo[0].step(codes[:, :1])) and torch.equal(outputs[b], solo[1].step(codes[:, 1:2]))


def test_lanes_must_be_between_one_and_sessions():
    with pytest.raises(ValueError, match=r"lanes must be a whole number from 1 to sessions \(2\), not 3"):
        make(sessions=2, lanes=3)
    with pytest.raises(ValueError, match="not 0"):
        make(sessions=2, lanes=0)


def test_a_bad_input_for_one_session_steps_no_session():
    runtime, prompt = make(sessions=3, lanes=2)
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(3)]
    solo = [SoloStock(prompt, s) for s in range(3)]
    codes = [codes_of(20 + s, 30) for s in range(3)]
    other = make(sessions=1, lanes=1)[0].session(initial={"cache": prompt})
    for tick in range(30):
        if tick % 5 == 2:
            bad = {s: {"codes": c[:, tick : tick + 1]} for s, c in zip(sessions, codes)}
            bad[sessions[2]] = {"codes": torch.zeros(1, 1, dtype=torch.int32)}
            with pytest.raises(
                StepError,
                match=r"step_many\(\), the session in slot 2: step\(\) input 'codes': "
                r"dtype .*; no session was stepped",
            ):
                runtime.step_many(bad)
            with pytest.raises(StepError, match="takes sessions of this runtime"):
                runtime.step_many({sessions[0]: {"codes": codes[0][:, tick : tick + 1]}, other: {}})
        outputs = runtime.step_many({s: {"codes": c[:, tick : tick + 1]} for s, c in zip(sessions, codes)})
        for index, session in enumerate(sessions):
            assert torch.equal(outputs[session], solo[index].step(codes[index][:, tick : tick + 1]))
    assert all(s.instant == 30 for s in sessions)


def test_a_closed_or_failed_session_is_refused_before_anything_runs():
    runtime, prompt = make(sessions=2, lanes=2)
    a, b = (runtime.session(initial={"cache": prompt}) for _ in range(2))
    b.close()
    codes = {"codes": codes_of(1)[:, :1]}
    with pytest.raises(RuntimeError, match=r"the session in slot 1: this session is closed; no session was stepped"):
        runtime.step_many({a: codes, b: codes})
    assert a.instant == 0


def test_a_stage_raising_fails_its_session_only_and_the_others_complete():
    runtime, prompt = make(sessions=3, lanes=2)
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(3)]
    solo = [SoloStock(prompt, s) for s in range(3)]
    codes = [codes_of(30 + s, 20) for s in range(3)]
    original = runtime.callables["attend"]
    victim = sessions[1]

    def explode_for_the_victim(*args, **kwargs):
        if args[0].data_ptr() == victim.storage["hidden"].flat.data_ptr():  # slot 1's hidden (lane 1's scratch)
            raise RuntimeError("injected fault")
        return original.fn(*args, **kwargs)

    for tick in range(20):
        inputs = {s: {"codes": c[:, tick : tick + 1]} for s, c in zip(sessions, codes)}
        if tick == 10:
            runtime.callables["attend"] = attrs.evolve(original, fn=explode_for_the_victim)
            with pytest.raises(
                SessionsFailed, match=r"the session\(s\) in slot 1 failed; the others completed"
            ) as caught:
                runtime.step_many(inputs)
            runtime.callables["attend"] = original
            assert isinstance(caught.value, SessionFailed)
            assert list(caught.value.failures) == [victim] and list(caught.value.outputs) == [sessions[0], sessions[2]]
            for index in (0, 2):
                assert torch.equal(caught.value.outputs[sessions[index]], solo[index].step(codes[index][:, 10:11]))
            with pytest.raises(SessionFailed, match="the session in slot 1: the session failed at instant 10"):
                runtime.step_many(inputs)
            victim.reset()
            solo[1] = SoloStock(prompt, 1)
            codes[1] = codes[1][:, 11:]  # the victim starts afresh from the next tick's inputs
            continue
        shift = 11 if tick > 10 else 0
        outputs = runtime.step_many(
            {s: {"codes": c[:, tick - (shift if s is victim else 0) :][:, :1]} for s, c in zip(sessions, codes)}
        )
        for index, session in enumerate(sessions):
            local = tick - (shift if session is victim else 0)
            assert torch.equal(outputs[session], solo[index].step(codes[index][:, local : local + 1])), (index, tick)


@pytest.mark.gpu
@pytest.mark.parametrize("lane_threads", [None, False])  # None: the default on CUDA, a thread per lane
@pytest.mark.parametrize("count,lanes", [(2, 2), (4, 2)])
def test_gpu_step_many_on_streams_equals_solo_stock(count, lanes, lane_threads):
    torch.backends.cudnn.deterministic = True
    runtime, prompt = make(device="cuda", sessions=count, lanes=lanes, lane_threads=lane_threads)
    assert runtime.lane_threads is (lane_threads is None)
    sessions = serve(runtime, prompt, count, device="cuda")
    report = runtime.report()
    assert report.eager_off_plan == 0 and report.eager_planned == 0 and report.replays == 3 * TICKS * count
    assert runtime.pools[0] != runtime.pools[1]
    assert runtime.lane_stream(0) != runtime.lane_stream(1)
    assert len({s.lane for s in sessions}) == lanes


@pytest.mark.gpu
def test_gpu_step_many_equals_sequential_steps_of_the_same_runtime():
    """The same runtime (same graphs) stepped by `step` and by `step_many` gives the same outputs."""
    torch.backends.cudnn.deterministic = True
    runtime, prompt = make(device="cuda", sessions=2, lanes=2)
    a, b = (runtime.session(initial={"cache": prompt}, seed=s) for s in range(2))
    codes = [codes_of(40 + s, 100, "cuda") for s in range(2)]
    sequential = [[s.step(codes=c[:, t : t + 1]) for t in range(100)] for s, c in ((a, codes[0]), (b, codes[1]))]
    a.reset()
    b.reset()
    for t in range(100):
        outputs = runtime.step_many({a: {"codes": codes[0][:, t : t + 1]}, b: {"codes": codes[1][:, t : t + 1]}})
        assert torch.equal(outputs[a], sequential[0][t]) and torch.equal(outputs[b], sequential[1][t]), t


class Interrupt(BaseException):
    """Not a stage's error: as KeyboardInterrupt, or an exception a signal handler raises between runs."""


def test_an_interrupt_fails_the_sessions_it_left_half_stepped_and_no_other():
    """A BaseException escapes step_many and step (it does not fail one session as a stage's error does);
    every session that had run part of its instant then refuses steps until reset(), instead of running
    the instant's first runs a second time; a session that had not started, or had finished, goes on."""
    runtime, prompt = make(sessions=3, lanes=2)
    sessions = [runtime.session(initial={"cache": prompt}, seed=s) for s in range(3)]  # lanes 0, 1, 0
    solo = [SoloStock(prompt, s) for s in range(3)]
    codes = codes_of(50, 10)
    original = runtime.callables["attend"]
    victim = sessions[1]
    interrupt_the_victim = attend_failing_for(runtime, victim, Interrupt)

    for tick in range(2):
        outputs = runtime.step_many({s: {"codes": codes[:, tick : tick + 1]} for s in sessions})
        assert all(torch.equal(outputs[s], solo[i].step(codes[:, tick : tick + 1])) for i, s in enumerate(sessions))
    runtime.callables["attend"] = interrupt_the_victim
    with pytest.raises(Interrupt):  # session 0 ran 'encode', then session 1 was interrupted in 'attend'
        runtime.step_many({s: {"codes": codes[:, 2:3]} for s in sessions})
    runtime.callables["attend"] = original
    for session in sessions[:2]:
        with pytest.raises(SessionFailed, match=r"the session failed at instant 2 \(Interrupt\(\)\)"):
            session.step(codes=codes[:, 2:3])
    for tick in range(2, 10):  # session 2 (lane 0, after session 0) had not started: it goes on
        assert torch.equal(sessions[2].step(codes=codes[:, tick : tick + 1]), solo[2].step(codes[:, tick : tick + 1]))

    runtime.callables["attend"] = interrupt_the_victim
    victim.reset()
    with pytest.raises(Interrupt):  # step: 'encode' ran, 'attend' was interrupted
        victim.step(codes=codes[:, :1])
    runtime.callables["attend"] = original
    with pytest.raises(SessionFailed, match="the session failed at instant 0"):
        victim.step(codes=codes[:, :1])
    for session in sessions[:2]:
        session.reset()
    fresh = [SoloStock(prompt, s) for s in range(2)]
    for tick in range(5):
        outputs = runtime.step_many({s: {"codes": codes[:, tick : tick + 1]} for s in sessions[:2]})
        assert all(
            torch.equal(outputs[s], fresh[i].step(codes[:, tick : tick + 1])) for i, s in enumerate(sessions[:2])
        )
