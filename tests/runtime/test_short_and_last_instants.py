"""Instants off the plan that streaming tails need: a short input (a forced flush) and the last instant.

A chunked tail with lookahead and latency (Step-Audio2 token2wav in miniature): each 1 s chunk reads
the held lookahead token plus 4 new ones, turns all but the newest token into 2 frames each, keeps
a prompt + window history, holds back the last 2 output frames for the next chunk, and releases
them (and its lookahead token) only at the end of the stream. The reference is a plain loop.
"""

from __future__ import annotations

import torch

from duplexcadence.interpreter.plans.plan import plan_file
from duplexcadence.interpreter.runtime.errors import StepError
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = """
cadence 1 s
clock token = 4 Hz
clock frame = token * 2
clock half = token / 2
clock second = 1 Hz

region tokens : i64[1, time] on token input retain last 1 start given 1
region history : f32[1, time] on frame retain first 2 + last 6 start given 2
region held : f32[1, time] on frame retain last 2 start empty
region coarse : f32[1, time] on half retain last 2 start zeros
region out : f32[1, time] on frame output

stage chunk on second {
    hook chunk
    read tokens last 5 lookahead 1
    update history +8
    update held +8
    update coarse +2
    write out +8 latency 2
}
"""

PRIME = torch.tensor([[7]])
PROMPT = torch.tensor([[0.5, -1.0]])


def make_frames(window: torch.Tensor, history: torch.Tensor, last: bool) -> torch.Tensor:
    """Two frames per converted token; the newest token is lookahead unless the stream ends."""
    converted = window if last else window[:, :-1]
    return converted.repeat_interleave(2, dim=1).float() + history.mean()


def chunk_hook(model, tokens, history, held, coarse, *, firing):
    model.seen_last.append(firing.last)
    frames = make_frames(tokens, history, firing.last)
    stream = torch.cat([held, frames], dim=1)
    coarse_view = next(v for v in firing.views if v.region == "coarse")
    out_view = next(v for v in firing.views if v.region == "out")
    new_coarse = torch.cat([coarse, torch.full((1, coarse_view.transient - coarse_view.length), 2.0)], dim=1)
    return torch.cat([history, frames], dim=1), stream, new_coarse, stream[:, : out_view.length]


class Model:
    def __init__(self):
        self.seen_last: list[bool] = []


def reference(chunks: list[list[int]], last_index: int | None = None) -> list[torch.Tensor]:
    window = PRIME
    history = PROMPT
    held = torch.zeros(1, 0)
    outputs = []
    for index, new in enumerate(chunks):
        last = index == last_index
        window = torch.cat([window, torch.tensor([new])], dim=1)
        frames = make_frames(window, history, last)
        history = torch.cat([history, frames], dim=1)
        if history.shape[1] > 8:
            history = torch.cat([history[:, :2], history[:, -6:]], dim=1)
        stream = torch.cat([held, frames], dim=1)
        outputs.append(stream if last else stream[:, :-2])
        held = stream[:, -2:]
        window = window[:, -1:]
    return outputs


def load(tmp_path, text: str = CLOCK) -> tuple[Runtime, Model]:
    path = tmp_path / "chunked.clock"
    path.write_text(text)
    model = Model()
    return Runtime.load(path, model, hooks={"chunk": chunk_hook}, device="cpu"), model


def feed(tokens: list[int]) -> dict[str, torch.Tensor]:
    return {"tokens": torch.tensor([tokens], dtype=torch.int64)}


def initial() -> dict[str, torch.Tensor]:
    return {"tokens": PRIME, "history": PROMPT}


def test_a_short_input_scales_every_advance_of_the_instant(tmp_path):
    runtime, _ = load(tmp_path)
    session = runtime.session(initial=initial())
    chunks = [[1, 2, 3, 4], [5, 6], [8, 9, 10, 11], [12, 13]]
    got = [session.step(**feed(new)) for new in chunks]
    expected = reference(chunks)
    assert [g.shape[1] for g in got] == [6, 4, 8, 4]
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)
    assert session.region("coarse").shape[1] == 2
    assert session.region("history").shape[1] == 8
    assert session.counters.eager_off_plan == 2  # the short instants are not in the plan


def test_a_short_input_with_a_fractional_advance_is_refused_and_changes_nothing(tmp_path):
    runtime, _ = load(tmp_path)
    session = runtime.session(initial=initial())
    session.step(**feed([1, 2, 3, 4]))
    before = {name: session.region(name).clone() for name in ("tokens", "history", "held", "coarse")}
    try:
        session.step(**feed([5]))  # a quarter of a chunk: 'coarse' would advance half a unit
    except StepError as error:
        assert "coarse" in str(error)
    else:
        raise AssertionError("a fractional advance was accepted")
    for name, value in before.items():
        assert torch.equal(session.region(name), value)
    assert torch.equal(session.step(**feed([5, 6, 7, 8])), reference([[1, 2, 3, 4], [5, 6, 7, 8]])[1])


def test_finish_consumes_the_lookahead_and_releases_the_latency(tmp_path):
    runtime, model = load(tmp_path)
    session = runtime.session(initial=initial())
    chunks = [[1, 2, 3, 4], [5, 6, 7, 8], [9]]
    got = [session.step(**feed(chunks[0])), session.step(**feed(chunks[1])), session.finish(**feed(chunks[2]))]
    expected = reference(chunks, last_index=2)
    assert [g.shape[1] for g in got] == [6, 8, 2 * 2 + 2]
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)
    assert model.seen_last == [False, False, True]
    try:
        session.step(**feed([1, 2, 3, 4]))
    except StepError as error:
        assert "reset" in str(error)
    else:
        raise AssertionError("a finished session accepted a step")
    session.reset()
    assert torch.equal(session.step(**feed(chunks[0])), expected[0])


def test_finish_on_the_first_instant_releases_what_its_latency_held(tmp_path):
    runtime, _ = load(tmp_path)
    session = runtime.session(initial=initial())
    got = session.finish(**feed([1]))
    (expected,) = reference([[1]], last_index=0)
    assert got.shape[1] == 4 and torch.equal(got, expected)


def test_a_dropped_latency_is_not_released_at_the_end_of_the_stream(tmp_path):
    """`latency 2 dropped`: the first firing is 2 short as before, and `finish` emits what a firing of its
    input emits, with nothing released (a tail whose whole-utterance output is that much shorter)."""
    runtime, model = load(tmp_path, CLOCK.replace("latency 2", "latency 2 dropped"))
    session = runtime.session(initial=initial())
    chunks = [[1, 2, 3, 4], [5, 6, 7, 8], [9]]
    got = [session.step(**feed(chunks[0])), session.step(**feed(chunks[1])), session.finish(**feed(chunks[2]))]
    expected = reference(chunks, last_index=2)
    assert [g.shape[1] for g in got] == [6, 8, 2 * 2]
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert torch.equal(got[2], expected[2][:, :4])  # the 2 held frames and the first converted token's 2
    assert model.seen_last == [False, False, True]


def test_capacities_cover_a_last_instant_with_a_full_input(tmp_path):
    path = tmp_path / "chunked.clock"
    path.write_text(CLOCK)
    plan = plan_file(path)
    # a planned chunk appends 8 output frames. Finishing with 4 new tokens + 1 lookahead would
    # advance 'coarse' by 2.5 units; finishing with 3 + 1 covers the planned time: 8 frames and the
    # 2 that the latency held back
    assert plan.schedule.regions["out"].capacity == 10
    assert all(f.last for f in plan.trace.last_instants)
    assert plan.capture.eager_firings == 0 and all(not f.last for f in plan.trace.firings)


def test_a_view_of_another_region_in_the_arena_does_not_alias(tmp_path):
    runtime, _ = load(tmp_path)
    session = runtime.session(initial=initial())
    history, held = session.storage["history"], session.storage["held"]
    assert history.flat.untyped_storage().data_ptr() == held.flat.untyped_storage().data_ptr()  # one arena
    assert not history._aliases(held.flat[:2])
    assert history._aliases(history.flat[1:3])
    assert history._aliases(history.flat.view(-1)[::2])
