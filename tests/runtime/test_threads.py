"""Threads: the sessions of one runtime stepped from several threads at once never share or corrupt
state (the runtime's lock serialises their steps), and runtimes stepped in parallel keep their own
random draws (the process-wide RNG lock).

A switch interval of 1 µs makes the interpreter hand the GIL over between almost every bytecode and
torch op, so unlocked steps of two sessions interleave inside a stage. Checked by hand when these
tests were written (3 runs each): with `Runtime.lock` replaced by a no-op the first two tests fail
(the sessions share the scratch block and the model's bound `carry`; the second fails
deterministically), and with the RNG lock a no-op the last one fails.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
PROMPT, WINDOW = 6, 20
THREADS, TICKS = 4, 300


@pytest.fixture(autouse=True)
def busy_switching():
    interval, threads = sys.getswitchinterval(), torch.get_num_threads()
    sys.setswitchinterval(1e-6)
    torch.set_num_threads(1)
    yield
    sys.setswitchinterval(interval)
    torch.set_num_threads(threads)


def codes_for(index: int, ticks: int = TICKS) -> torch.Tensor:
    return torch.randint(0, 64, (1, ticks), generator=torch.Generator().manual_seed(100 + index))


def stock_outputs(prompt: torch.Tensor, codes: torch.Tensor, seed: int) -> list[torch.Tensor]:
    """The stock loop run alone on one thread, drawing from the default generator seeded like a session."""
    stock = ToyStockStream(build_toy(), prompt, WINDOW)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [stock.step(codes[:, t : t + 1]) for t in range(codes.shape[1])]


def run_threads(work, count: int) -> list:
    """Run `work(index, barrier)` on `count` threads started together; their results, errors re-raised."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list = []

    def target(index: int) -> None:
        try:
            results[index] = work(index, barrier)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


def test_sessions_of_one_runtime_stepped_from_threads_equal_their_solo_stock_runs():
    model = build_toy()
    runtime = Runtime.load(CLOCK, model, device="cpu", sessions=THREADS)
    prompts = [make_prompt(model, PROMPT, seed=10 + i) for i in range(THREADS)]
    codes = [codes_for(i) for i in range(THREADS)]
    sessions = [runtime.session(initial={"cache": prompts[i]}, seed=i) for i in range(THREADS)]
    pointers = [s.data_ptrs() for s in sessions]

    def work(index, barrier):
        session = sessions[index]
        barrier.wait()
        outputs = []
        for t in range(TICKS):
            outputs.append(session.step(codes=codes[index][:, t : t + 1]))
            if t == TICKS // 2 and index % 2:
                session.reset()  # a barge-in while the others step: only this session starts again
                outputs = []
                for again in range(t + 1):
                    outputs.append(session.step(codes=codes[index][:, again : again + 1]))
        return outputs

    results = run_threads(work, THREADS)
    for index in range(THREADS):
        expected = stock_outputs(prompts[index], codes[index], seed=index)
        assert len(results[index]) == TICKS
        differing = [t for t in range(TICKS) if not torch.equal(results[index][t], expected[t])]
        assert differing == [], f"session {index} differs from its solo stock run at ticks {differing[:5]}..."
        assert sessions[index].data_ptrs() == pointers[index]
    report = runtime.report()
    assert report.eager_off_plan == 0
    assert report.eager_planned == 3 * (THREADS * TICKS + 2 * (TICKS // 2 + 1))


def test_a_step_waits_while_another_sessions_step_is_inside_a_stage():
    """Deterministic: session A is held inside its `attend` stage; B's step does not start until A's ends."""
    model = build_toy()
    runtime = Runtime.load(CLOCK, model, device="cpu", sessions=2)
    prompt = make_prompt(model, PROMPT)
    a, b = runtime.session(initial={"cache": prompt}), runtime.session(initial={"cache": prompt})
    inside, release = threading.Event(), threading.Event()
    events: list[str] = []
    names = threading.local()

    def hold(module, args):
        events.append(f"{names.value} enters attend")
        if names.value == "A":
            inside.set()
            release.wait(timeout=10)

    model.attention.register_forward_pre_hook(hold)
    model.attention.register_forward_hook(lambda module, args, output: events.append(f"{names.value} leaves attend"))
    codes = codes_for(0, 1)

    def step(name, session):
        names.value = name
        session.step(codes=codes)

    thread_a = threading.Thread(target=step, args=("A", a))
    thread_a.start()
    assert inside.wait(timeout=10)
    thread_b = threading.Thread(target=step, args=("B", b))
    thread_b.start()
    thread_b.join(timeout=0.5)
    assert thread_b.is_alive() and events == ["A enters attend"]
    release.set()
    thread_a.join(timeout=10)
    thread_b.join(timeout=10)
    assert events == ["A enters attend", "A leaves attend", "B enters attend", "B leaves attend"]


def test_runtimes_stepped_in_parallel_keep_their_own_random_draws():
    """One runtime per thread, each on its own model: steps run in parallel, and every `rng` stage still
    draws from its own session's generator state."""
    prompt = make_prompt(build_toy(), PROMPT)
    codes = [codes_for(i) for i in range(THREADS)]
    # built here: build_toy seeds the default generator to initialise weights
    runtimes = [Runtime.load(CLOCK, build_toy(), device="cpu") for _ in range(THREADS)]

    def work(index, barrier):
        session = runtimes[index].session(initial={"cache": prompt}, seed=index)
        barrier.wait()
        return [session.step(codes=codes[index][:, t : t + 1]) for t in range(TICKS)]

    results = run_threads(work, THREADS)
    for index in range(THREADS):
        expected = stock_outputs(prompt, codes[index], seed=index)
        differing = [t for t in range(TICKS) if not torch.equal(results[index][t], expected[t])]
        assert differing == [], f"runtime {index} differs from its solo stock run at ticks {differing[:5]}..."


def test_a_reset_on_another_thread_does_not_touch_the_generator_an_rng_stage_draws_from():
    """`reset()` seeds the session's RNG state; it must not do so through the process's default generator,
    which another runtime's `rng` stage may be drawing from at that moment on another thread."""
    prompt = make_prompt(build_toy(), PROMPT)
    codes = codes_for(0)
    stepped, reset = (Runtime.load(CLOCK, build_toy(), device="cpu") for _ in range(2))
    session = stepped.session(initial={"cache": prompt}, seed=0)
    other = reset.session(initial={"cache": prompt}, seed=7)

    def work(index, barrier):
        barrier.wait()
        if index == 1:
            for _ in range(20 * TICKS):
                other.reset()
            return None
        return [session.step(codes=codes[:, t : t + 1]) for t in range(TICKS)]

    results = run_threads(work, 2)[0]
    expected = stock_outputs(prompt, codes, seed=0)
    differing = [t for t in range(TICKS) if not torch.equal(results[t], expected[t])]
    assert differing == [], f"the stepped session differs from its solo stock run at ticks {differing[:5]}..."


@pytest.mark.gpu
def test_gpu_seeded_rng_state_is_the_default_generators_after_manual_seed():
    from duplexcadence.interpreter.runtime.rng import seeded_rng_state

    device = torch.device("cuda", torch.cuda.current_device())
    with torch.random.fork_rng(devices=[device]):
        for seed in (0, 7, 2**40 + 3):
            torch.cuda.manual_seed(seed)
            assert torch.equal(seeded_rng_state(seed, device), torch.cuda.get_rng_state(device))
