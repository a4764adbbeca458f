"""A step is atomic: an interrupt (KeyboardInterrupt, or what a signal handler raises) at any moment either
leaves the session failed, commits the instant (its outputs in `session.last_outputs`), or, when it arrives
before the step changed anything, leaves the session as it was. The process's generator state and grad
mode are what they were before the step, on every path.

Tested the way it failed, on the toy tail (CPU), for `step` (the general path), `finish` (off the plan),
the short path (stand-in graphs, as in test_replay_path.py) and `step_many`:

* at every line boundary: a tracer (`sys.settrace`) raises KeyboardInterrupt at the n-th line executed in the
  runtime's modules, for every n a step has;
* at random moments: a timer signal whose handler raises KeyboardInterrupt, over 20 000 step calls.

After every interrupted step the outcome is checked: failed (then `reset()` and the stream from the start
equals an uninterrupted reference run), committed (`last_outputs` equal to the reference at that instant,
and the next step equals the reference too), or untouched (clock, generator state and counters as before,
and the next step equals the reference). Anything else is a bad outcome, and there must be none. The timer's
delays are drawn around a step's duration, measured first, only to aim the interrupts; what is asserted
does not depend on where they land.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from duplexcadence.examples.toy.model import build_toy, make_prompt
from duplexcadence.interpreter import runtime as runtime_package
from duplexcadence.interpreter.runtime.errors import SessionFailed
from duplexcadence.interpreter.runtime.rng import RNG_LOCK
from duplexcadence.interpreter.runtime.runtime import Runtime
from duplexcadence.tests.runtime.test_replay_path import install_eager_graphs

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
RUNTIME_FILES = str(Path(runtime_package.__file__).parent)
HORIZON = 30  # instants of a stream: through the warm-up (20 frames) into the steady state
AT = 2  # the instant the line-by-line test interrupts


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny op spins for milliseconds with two threads on a busy 2-core machine
    yield
    torch.set_num_threads(threads)


class Toy:
    """A toy runtime with `sessions` sessions (seeds 0, 1, ...) and their uninterrupted reference: the outputs of
    every instant of a stream of HORIZON steps, and of `finish` at its end."""

    def __init__(self, sessions: int = 1, lanes: int = 1, short_path: bool = False):
        model = build_toy()
        self.prompt = make_prompt(model, 6)
        self.codes = torch.randint(0, 64, (1, HORIZON + 1), generator=torch.Generator().manual_seed(7))
        self.runtime = Runtime.load(CLOCK, model, device="cpu", sessions=sessions, lanes=lanes)
        self.sessions = [self.runtime.session(initial={"cache": self.prompt}, seed=seed) for seed in range(sessions)]
        if short_path:
            for session in self.sessions:
                install_eager_graphs(session)
        reference = Runtime.load(CLOCK, build_toy(), device="cpu")
        self.steps, self.finishes = [], []
        for seed in range(sessions):
            solo = reference.session(initial={"cache": self.prompt}, seed=seed)
            self.steps.append([solo.step(codes=self.frame(t)) for t in range(HORIZON)])
            self.finishes.append(solo.finish(codes=self.frame(HORIZON)))
            solo.close()

    def frame(self, instant: int) -> torch.Tensor:
        return self.codes[:, instant : instant + 1]

    def expected(self, index: int, instant: int, last: bool = False) -> torch.Tensor:
        return self.finishes[index] if last else self.steps[index][instant]

    def restart(self, session, at: int) -> None:
        """`reset()`, then steps to instant `at`, each equal to the reference: what a failed session comes back to."""
        session.reset()
        index = self.sessions.index(session)
        for t in range(at):
            assert torch.equal(session.step(codes=self.frame(t)), self.steps[index][t]), f"after reset, instant {t}"


class Outcomes:
    """What interrupted steps left, by outcome; `bad` lists what no interrupted step may leave."""

    def __init__(self):
        self.counts = {"failed": 0, "committed": 0, "untouched": 0, "not interrupted": 0}
        self.bad: list[str] = []

    def judge(self, toy: Toy, session, before: tuple, interrupted: bool, returned, last: bool) -> str:
        """Classify one session's step (`before`: its instant, generator state and step count before it);
        checks the outputs and, for the untouched, that nothing moved. Returns the outcome."""
        index = toy.sessions.index(session)
        instant, rng_state, steps = before
        expected = toy.expected(index, instant, last)
        if not interrupted:
            outcome = "not interrupted"
            if session.failed is not None or session.instant != instant + 1 or not torch.equal(returned, expected):
                self.bad.append(f"a step that returned did not commit its instant {instant} with its outputs")
        elif session.failed is not None:
            outcome = "failed"
        elif session.instant == instant + 1:
            outcome = "committed"
            if not torch.equal(session.last_outputs, expected):
                self.bad.append(f"instant {instant} committed without its outputs in last_outputs")
        elif session.instant == instant:
            outcome = "untouched"
            if session.counters.steps != steps or not torch.equal(session.rng_state, rng_state):
                self.bad.append(f"instant {instant} not committed, session not failed, but its state moved")
        else:
            outcome = "bad"
            self.bad.append(f"instant {instant}: the session is at instant {session.instant}, not failed")
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        return outcome


def process_state() -> tuple[torch.Tensor, bool]:
    return torch.get_rng_state(), torch.is_grad_enabled()


def check_process_state(before: tuple[torch.Tensor, bool], outcomes: Outcomes, where: str) -> None:
    rng, grad = before
    if not torch.equal(torch.get_rng_state(), rng):
        outcomes.bad.append(f"{where}: the process's generator state was left changed")
        torch.set_rng_state(rng)
    if torch.is_grad_enabled() != grad:
        outcomes.bad.append(f"{where}: the grad mode was left changed")
        torch.set_grad_enabled(grad)


# --- an interrupt at every line boundary -----------------------------------------------------------


class LineInterrupt:
    """A tracer that counts the lines executed in the runtime's modules and raises KeyboardInterrupt at
    line `at` (never when `at` is None). Python unsets a tracer that raised."""

    def __init__(self, at: int | None = None):
        self.at = at
        self.lines = 0

    def __call__(self, frame, event, arg):
        return self.local if frame.f_code.co_filename.startswith(RUNTIME_FILES) else None

    def local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                raise KeyboardInterrupt(f"line {self.lines}")
        return self.local


def release_held(*locks) -> None:
    """Give back the locks a tracer's exception left held by this thread. A tracer raises where no signal's
    handler runs: at a `try:` line (a NOP) or at a `with` block's exit (before its C `__exit__`), and
    CPython then leaves the enclosing `with` without its exit. The random-moment test below checks the
    locks under real signals."""
    for lock in locks:
        while lock._is_owned():  # an RLock's own check (C and Python implementations): held by this thread
            lock.release()


def traced(action, tracer: LineInterrupt) -> tuple[object, bool]:
    """(what `action()` returned, whether it raised KeyboardInterrupt) under `tracer`."""
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return action(), False
    except KeyboardInterrupt:
        return None, True
    finally:
        sys.settrace(previous)


KINDS = {
    # kind: (toy arguments, how many sessions step, whether the step is the stream's last)
    "step": (dict(), 1, False),
    "finish": (dict(), 1, True),
    "short path": (dict(short_path=True), 1, False),
    "step_many": (dict(sessions=2, lanes=2), 2, False),
}


def act(toy: Toy, kind: str):
    if kind == "step_many":
        return lambda: toy.runtime.step_many({s: {"codes": toy.frame(AT)} for s in toy.sessions})
    session = toy.sessions[0]
    return (
        (lambda: session.finish(codes=toy.frame(AT)))
        if kind == "finish"
        else (lambda: session.step(codes=toy.frame(AT)))
    )


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.slow
def test_an_interrupt_at_every_line_of_a_step_commits_it_or_fails_the_session(kind):
    arguments, stepping, last = KINDS[kind]
    toy = Toy(**arguments)
    if last:  # a stream whose last instant is AT: its reference is a finish at AT
        reference = Runtime.load(CLOCK, build_toy(), device="cpu").session(initial={"cache": toy.prompt})
        for t in range(AT):
            reference.step(codes=toy.frame(t))
        toy.finishes = [reference.finish(codes=toy.frame(AT))]
    sessions = toy.sessions[:stepping]
    for session in sessions:
        toy.restart(session, AT)
    counting = LineInterrupt()
    traced(act(toy, kind), counting)
    lines = counting.lines
    assert lines > 100  # the tracer sees the runtime's lines
    outcomes = Outcomes()
    for at in range(1, lines + 1):
        for session in sessions:
            toy.restart(session, AT)
        before = {s: (s.instant, s.rng_state, s.counters.steps) for s in sessions}
        state = process_state()
        returned, interrupted = traced(act(toy, kind), LineInterrupt(at))
        assert interrupted, f"line {at} of {lines} was not reached"
        release_held(RNG_LOCK, toy.runtime.lock, toy.runtime.eager_lock)
        check_process_state(state, outcomes, f"line {at}")
        for session in sessions:
            outcome = outcomes.judge(toy, session, before[session], interrupted, returned, last)
            if outcome == "failed":
                with pytest.raises(SessionFailed, match=r"call reset\(\) to start it again"):
                    session.step(codes=toy.frame(AT))
            elif outcome in ("committed", "untouched") and not (last and outcome == "committed"):
                index = toy.sessions.index(session)
                instant = session.instant
                expected = toy.expected(index, instant, last)
                got = session.finish(codes=toy.frame(AT)) if last else session.step(codes=toy.frame(instant))
                if not torch.equal(got, expected):
                    outcomes.bad.append(f"line {at}: the step after a {outcome} one differs from the reference")
    assert outcomes.bad == []
    assert sum(outcomes.counts.values()) == lines * stepping
    assert outcomes.counts["failed"] and outcomes.counts["committed"]


# --- interrupts at random moments ------------------------------------------------------------------


class Alarm:
    """SIGALRM's handler: raises KeyboardInterrupt once, while armed."""

    def __init__(self):
        self.armed = False

    def __call__(self, signum, frame):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


def free(lock) -> bool:
    """Whether another thread can take `lock` (a step left nothing holding it)."""
    taken = []

    def take():
        if lock.acquire(timeout=5):
            taken.append(True)
            lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return bool(taken)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_interrupts_at_random_moments_of_20000_steps_leave_no_bad_outcome():
    """10 000 `step`/`finish` calls on the general path, 5 000 on the short path, 5 000 `step_many` calls of
    two sessions (in two lanes), each with a timer set to go off at a random moment of it."""
    general, short, many = Toy(), Toy(short_path=True), Toy(sessions=2, lanes=2)

    def call(toy: Toy):
        if toy is many:
            return lambda: many.runtime.step_many({s: {"codes": many.frame(s.instant)} for s in many.sessions})
        session = toy.sessions[0]
        if session.instant == HORIZON:
            return lambda: session.finish(codes=toy.frame(HORIZON))
        return lambda: session.step(codes=toy.frame(session.instant))

    durations = {}
    for toy in (general, short, many):
        started = time.perf_counter()
        for _ in range(20):
            call(toy)()
        durations[toy] = (time.perf_counter() - started) / 20  # aims the timer only
        for session in toy.sessions:
            session.reset()
    schedule = [general, general, short, many] * 5_000
    alarm = Alarm()
    previous = signal.signal(signal.SIGALRM, alarm)
    chance = random.Random(11)
    outcomes = Outcomes()
    interrupted_calls = 0
    try:
        for number, toy in enumerate(schedule):
            stepping = toy.sessions
            last = toy is general and general.sessions[0].instant == HORIZON
            before = {s: (s.instant, s.rng_state, s.counters.steps) for s in stepping}
            action = call(toy)
            state = process_state()
            returned, interrupted = None, False
            try:
                alarm.armed = True
                signal.setitimer(signal.ITIMER_REAL, chance.uniform(1e-6, 1.25 * durations[toy]))
                returned = action()
                alarm.armed = False
            except KeyboardInterrupt:
                interrupted = True
            finally:
                alarm.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            interrupted_calls += interrupted
            check_process_state(state, outcomes, f"call {number}")
            for session in stepping:
                mine = returned[session] if isinstance(returned, dict) else returned
                outcome = outcomes.judge(toy, session, before[session], interrupted, mine, last)
                if outcome == "failed" or session.finished or (toy is not general and session.instant == HORIZON):
                    session.reset()  # a failed stream starts again, as one that ended
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert outcomes.bad[:5] == []
    assert sum(outcomes.counts.values()) == 25_000
    assert interrupted_calls > 0
    runtimes = (general.runtime, short.runtime, many.runtime)
    assert all(free(lock) for lock in (RNG_LOCK, *(r.lock for r in runtimes), *(r.eager_lock for r in runtimes)))
    for toy in (general, short, many):  # every session still steps like the reference
        for index, session in enumerate(toy.sessions):
            toy.restart(session, 3)
            assert torch.equal(session.step(codes=toy.frame(3)), toy.steps[index][3])
