"""The conversation engine with MiniCPM-o 4.5 at the reduced sizes on the CPU.

One scenario is run twice (module fixture) and read by several tests: conversations A and B start together, A
speaks a scripted turn while B decides for itself; B leaves after its second unit (mid-turn), C joins at the
third (while A speaks) and listens, then starts a turn. The second run opens an idle conversation first, so that
every conversation of the scenario lands in another slot (C in the slot B left, in both runs): every output is
the same, bit for bit, so a slot's state is its conversation's alone and a slot left by one conversation holds
nothing of it for the next. (Rows of a round are not independent bit for bit: a row's matrix products can take
other kernels at other row counts; the second run has the same rows.) Each conversation's audio equals the
stock token2wav tail (``Token2wav.stream``) fed its speech tokens.
"""

from __future__ import annotations

import importlib.util

import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("stepaudio2") is None:
    pytest.skip("needs stepaudio2-minicpmo (scripts/model-pins.txt)", allow_module_level=True)

from duplexcadence.interpreter.engine import registry  # noqa: E402
from duplexcadence.interpreter.engine.api import (  # noqa: E402
    ConversationError,
    ConversationRefused,
    Decision,
    UnitInput,
)
from duplexcadence.interpreter.engine.engine import RoundModel  # noqa: E402

pytestmark = pytest.mark.slow

N_TIMESTEPS = 2
SEEDS = {"A": 11, "B": 12, "C": 13}


def speak(text: tuple[int, ...], end: bool = False) -> Decision:
    return Decision("speak", text=text, end_of_turn=end)


LISTEN = Decision("listen")
SCRIPTS = {
    "A": [speak((5, 6, 7)), speak((8, 9)), speak((10,), end=True), LISTEN],
    "B": [None, None],
    "C": [LISTEN, speak((40, 41, 42, 43))],
}
JOINS = {"A": 0, "B": 0, "C": 2}


def unit_input(name: str, unit: int) -> UnitInput:
    generator = np.random.default_rng(SEEDS[name] * 100 + unit)
    audio = (0.1 * generator.standard_normal(16000)).astype(np.float32)
    return UnitInput(audio, SCRIPTS[name][unit - JOINS[name]])


@attrs.define
class Scenario:
    engine: object
    outputs: dict[str, list]
    slots: dict[str, set[int]]
    replay: dict[str, list]
    replay_slots: dict[str, set[int]]


def run_scenario(engine, spare: bool) -> tuple[dict[str, list], dict[str, set[int]]]:
    idle = engine.open(seed=0) if spare else None
    ids: dict[str, int] = {}
    outputs: dict[str, list] = {name: [] for name in SCRIPTS}
    slots: dict[str, set[int]] = {name: set() for name in SCRIPTS}
    for unit in range(4):
        for name, start in JOINS.items():
            if unit == start:
                ids[name] = engine.open(seed=SEEDS[name])
        units = {ids[name]: unit_input(name, unit) for name in ids}
        for name, output in zip(list(ids), engine.step(units).values()):
            outputs[name].append(output)
            slots[name].add(engine.conversations[ids[name]].slot)
        if unit == 1:
            engine.close(ids.pop("B"))
    for cid in [*ids.values(), *([idle] if idle is not None else [])]:
        engine.close(cid)
    return outputs, slots


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    engine = registry.load_engine("minicpmo45", device="cpu", sizes="reduced", conversations=4, n_timesteps=N_TIMESTEPS)
    outputs, slots = run_scenario(engine, spare=False)
    replay, replay_slots = run_scenario(engine, spare=True)
    engine.open(seed=SEEDS["A"])  # the one conversation the tests below use
    return Scenario(engine, outputs, slots, replay, replay_slots)


def test_a_conversation_is_the_same_in_another_slot_after_others_left_it(scenario) -> None:
    assert scenario.slots == {"A": {0}, "B": {1}, "C": {1}}
    assert scenario.replay_slots == {"A": {1}, "B": {2}, "C": {2}}
    for name in SCRIPTS:
        for first, again in zip(scenario.outputs[name], scenario.replay[name], strict=True):
            assert (again.kind, again.text_tokens, again.speech_tokens) == (
                first.kind,
                first.text_tokens,
                first.speech_tokens,
            )
            assert np.array_equal(again.audio, first.audio), (name, first.unit)


def test_units_follow_the_scripts_and_the_tail_rules(scenario) -> None:
    a = scenario.outputs["A"]
    assert [o.kind for o in a] == ["speak", "speak", "speak", "listen"]
    assert [o.text_tokens for o in a[:3]] == [(5, 6, 7), (8, 9), (10, 151717)]  # the turn's end is spoken too
    assert [o.end_of_turn for o in a] == [False, False, True, False]
    assert [len(o.speech_tokens) for o in a[:2]] == [25, 25]
    # the turn's first unit flushes 3 silence + 25 tokens: one chunk held back by 3840 samples; then a steady
    # chunk; the last unit's tokens and the lookahead close the turn with what was held back
    assert [o.audio.shape[0] for o in a[:2]] == [20160, 24000]
    assert a[3].audio.shape == (0,) and a[3].speech_tokens == ()
    assert [o.unit for o in a] == [0, 1, 2, 3]
    assert [o.kind for o in scenario.outputs["C"]] == ["listen", "speak"]
    b = scenario.outputs["B"]
    assert all(o.kind == "speak" for o in b)  # random weights almost never choose to listen
    assert [len(o.text_tokens) for o in b] == [18, 18]  # steps 1..18 of 19, then the chunk's end is forced
    assert b[0].text == "".join(f"<{token}>" for token in b[0].text_tokens)


def test_each_conversations_audio_equals_the_stock_tail_fed_its_tokens(scenario) -> None:
    from duplexcadence.examples.minicpmo45.model import build_tail
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    model = scenario.engine.model
    tail = build_tail(model.sizes.tail, seed=1234)
    compared = 0
    for name in ("A", "C", "B"):
        stock = StockToken2wavSession(tail, model.prompt, N_TIMESTEPS, session_seed=SEEDS[name], own_caches=True)
        turn_start = True
        for output in scenario.outputs[name]:
            if output.kind != "speak":
                continue
            chunks = stock.push_tokens(output.speech_tokens, flush=turn_start, end_of_turn=output.end_of_turn)
            expected = torch.cat([c.reshape(-1) for c in chunks]).numpy() if chunks else np.zeros(0, np.float32)
            assert np.array_equal(output.audio, expected), (name, output.unit)
            compared += len(chunks)
            turn_start = output.end_of_turn
            if output.end_of_turn:
                stock.reset()
    assert compared >= 6  # A's turn (3 or 4 chunks), C's first unit, B's two units


def test_barge_in_starts_the_conversation_over(scenario) -> None:
    engine = scenario.engine
    (cid,) = engine.conversations
    engine.reset(cid)
    first = engine.step({cid: unit_input("A", 0)})[cid]
    engine.step({cid: unit_input("A", 1)})
    engine.reset(cid)
    again = engine.step({cid: unit_input("A", 0)})[cid]
    assert (first.unit, again.unit) == (0, 0)
    assert again.speech_tokens == first.speech_tokens
    assert np.array_equal(again.audio, first.audio)


def test_bad_units_are_refused_before_anything_runs(scenario) -> None:
    engine = scenario.engine
    (cid,) = engine.conversations
    units_before = engine.conversations[cid].units
    silence = np.zeros(16000, dtype=np.float32)
    cases = [
        ({cid + 100: UnitInput(silence)}, f"no open conversation {cid + 100} (open: [{cid}])"),
        (
            {cid: UnitInput(np.zeros(8000, dtype=np.float32))},
            f"conversation {cid}: a unit's audio is float32 [16000] (1 s at 16000 Hz), got float32 [8000]",
        ),
        (
            {cid: UnitInput(np.zeros(16000))},
            f"conversation {cid}: a unit's audio is float32 [16000] (1 s at 16000 Hz), got float64 [16000]",
        ),
        (
            {cid: UnitInput(np.full(16000, np.nan, dtype=np.float32))},
            f"conversation {cid}: the audio holds NaN or infinite samples",
        ),
        ({}, "a round needs the unit of at least one conversation"),
        (
            {cid: UnitInput(silence, speak((151700,)))},
            f"conversation {cid}: decision text tokens must be text ids 0..151642",
        ),
    ]
    for units, message in cases:
        with pytest.raises(ConversationError) as raised:
            engine.step(units)
        assert str(raised.value) == message
    engine.step({cid: UnitInput(silence, speak((1,)))})  # a turn starts: listening must wait for its end
    with pytest.raises(ConversationError) as raised:
        engine.step({cid: UnitInput(silence, LISTEN)})
    assert str(raised.value) == (
        f"conversation {cid}: a listening decision inside a speaking turn: the turn must end first "
        "(a speaking decision with end_of_turn)"
    )
    assert engine.conversations[cid].units == units_before + 1


def test_admission_refuses_with_the_numbers(scenario) -> None:
    engine = scenario.engine
    others = [engine.open(seed=1), engine.open(seed=2), engine.open(seed=3)]
    try:
        with pytest.raises(ConversationRefused) as raised:
            engine.open()
        bytes_each = engine.capacity().bytes_per_conversation
        assert str(raised.value) == f"all 4 conversation slots are in use ({bytes_each} bytes each on the device)"
    finally:
        for cid in others:
            engine.close(cid)
    engine.round_model = RoundModel.fit({1: 500.0, 3: 1500.0})  # 500 ms a conversation
    try:
        assert engine.capacity().time_limit == 1
        with pytest.raises(ConversationRefused) as raised:
            engine.open()
        assert str(raised.value) == (
            "2 conversations would take 1000 ms a round, over 900 ms (1000 ms cadence less 10% headroom); 1 fit"
        )
    finally:
        engine.round_model = None


def test_a_failed_round_fails_its_conversations_until_reset(scenario, monkeypatch) -> None:
    engine = scenario.engine
    (cid,) = engine.conversations

    def broken(slots, inputs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.model, "run_units", broken)
    silence = np.zeros(16000, dtype=np.float32)
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step({cid: UnitInput(silence)})
    monkeypatch.undo()
    with pytest.raises(ConversationError) as raised:
        engine.step({cid: UnitInput(silence)})
    assert str(raised.value) == f"conversation {cid} failed (RuntimeError: device lost); reset it to go on"
    engine.reset(cid)
    assert engine.step({cid: UnitInput(silence, LISTEN)})[cid].unit == 0


def test_a_turn_ends_when_its_tts_cache_could_not_hold_another_unit(scenario) -> None:
    engine = scenario.engine
    (cid,) = engine.conversations
    engine.reset(cid)
    kv = engine.model.tts_kv
    capacity = kv.capacity
    kv.capacity = 60  # 4 + 1 condition tokens and 25 steps leave 30 free: less than a longest unit's 44
    try:
        out = engine.step({cid: UnitInput(np.zeros(16000, dtype=np.float32), speak((1, 2, 3, 4)))})[cid]
    finally:
        kv.capacity = capacity
    assert out.kind == "speak" and out.end_of_turn
    assert int(kv.host_lengths[engine.conversations[cid].slot]) == 0  # the turn's cache emptied
    after = engine.step({cid: UnitInput(np.zeros(16000, dtype=np.float32), LISTEN)})[cid]
    assert after.kind == "listen"


def test_no_autograd_graph_holds_a_steps_activations(scenario) -> None:
    """Graphs are captured outside the rounds too (at load): with a parameter that required grad, each captured
    step's static outputs would hold its activations alive through an autograd graph, per row count."""
    model = scenario.engine.model
    assert not any(p.requires_grad for module in model.model.modules() for p in module.parameters())
    model.capture_steps()
    for buffer in (model.llm_logits, model.llm_hidden, model.tts_logits):
        assert buffer.grad_fn is None and not buffer.requires_grad


def test_the_engine_captures_the_graphs_its_plan_declares(scenario) -> None:
    """The batched stages of models.minicpmo45_duplex are the engine's row-count graphs, one per stage at every
    row count, and its caches are the plan's capacities."""
    model = scenario.engine.model
    assert {(g.stage, g.rows) for g in model.plan.batched} == {(g.name, g.rows) for g in model.step_graphs()}
    assert (model.llm_kv.capacity, model.tts_kv.capacity, model.audio_kv.capacity) == tuple(
        model.plan.region(name).capacity for name in ("llm_kv", "tts_kv", "audio_kv")
    )


@pytest.mark.parametrize(("capacity", "ends"), [(74, False), (73, True)])
def test_a_turn_ends_exactly_where_the_next_longest_unit_would_not_fit(scenario, capacity, ends) -> None:
    """A unit of 4 text tokens takes 4 + 1 condition entries and 25 steps: 30; the longest unit takes the plan's
    18 + 1 + 25 = 44. At a capacity of 74 the next longest unit still fits, at 73 it does not."""
    engine = scenario.engine
    (cid,) = engine.conversations
    engine.reset(cid)
    kv = engine.model.tts_kv
    full = kv.capacity
    kv.capacity = capacity
    try:
        out = engine.step({cid: UnitInput(np.zeros(16000, dtype=np.float32), speak((1, 2, 3, 4)))})[cid]
    finally:
        kv.capacity = full
    assert out.end_of_turn is ends
    engine.reset(cid)


def test_every_rows_cache_lengths_on_the_device_are_its_own(scenario) -> None:
    """LISTEN, the LLM and the TTS advance each row of a round by its own count, on the device as on the host."""
    engine = scenario.engine
    (cid,) = engine.conversations
    engine.reset(cid)
    others = [engine.open(seed=21), engine.open(seed=22)]
    model = engine.model
    try:
        silence = np.zeros(16000, dtype=np.float32)
        for unit in range(2):
            engine.step({cid: UnitInput(silence, LISTEN), others[0]: UnitInput(silence), others[1]: UnitInput(silence)})
            slots = [engine.conversations[c].slot for c in (cid, *others)]
            for kv in (model.audio_kv, model.llm_kv, model.tts_kv):
                assert kv.lengths[slots].tolist() == kv.host_lengths[slots].tolist(), (unit, kv)
            assert len(set(model.audio_kv.host_lengths[slots].tolist())) == 1  # every row heard the same seconds
    finally:
        for other in others:
            engine.close(other)
        engine.reset(cid)


def test_a_turn_reopened_after_its_end_token_is_not_reported_ended(scenario, monkeypatch) -> None:
    """The model's own choices: <speak> 100 <turn_eos> 200 <chunk_eos>. The text after the turn's end reopens
    the turn, as stock's ``generate_text`` has it: the unit does not end the turn, and listening must wait."""
    from duplexcadence.examples.minicpmo45.live_config import CHUNK_EOS_TOKEN, SPEAK_TOKEN, TURN_EOS_TOKEN

    engine = scenario.engine
    (cid,) = engine.conversations
    engine.reset(cid)
    model = engine.model
    chosen = iter([SPEAK_TOKEN, 100, TURN_EOS_TOKEN, 200, CHUNK_EOS_TOKEN])
    sample = model._sample_text

    def scripted(slots, logits):
        sample(slots, logits)
        token = next(chosen)
        return [token] * len(slots), [token] * len(slots)

    monkeypatch.setattr(model, "_sample_text", scripted)
    silence = np.zeros(16000, dtype=np.float32)
    out = engine.step({cid: UnitInput(silence)})[cid]
    monkeypatch.undo()
    assert (out.kind, out.text_tokens, out.end_of_turn) == ("speak", (100, TURN_EOS_TOKEN, 200), False)
    assert not model.states[engine.conversations[cid].slot].turn_ended
    with pytest.raises(ConversationError, match="a listening decision inside a speaking turn"):
        engine.step({cid: UnitInput(silence, LISTEN)})
    engine.reset(cid)


@pytest.mark.parametrize(("end", "most"), [(False, 18), (True, 17)])
def test_a_speaking_decision_longer_than_a_unit_is_refused(scenario, end, most) -> None:
    engine = scenario.engine
    (cid,) = engine.conversations
    engine.reset(cid)
    silence = np.zeros(16000, dtype=np.float32)
    with pytest.raises(ConversationError) as raised:
        engine.step({cid: UnitInput(silence, speak(tuple(range(100, 101 + most)), end))})
    ending = " and the turn's end" if end else ""
    assert str(raised.value) == (
        f"conversation {cid}: a unit speaks at most {most} text tokens{ending} (max_new_speak_tokens_per_chunk 20 "
        f"less the speak and chunk-end tokens), got {most + 1}"
    )
    out = engine.step({cid: UnitInput(silence, speak(tuple(range(100, 100 + most)), end))})[cid]
    assert len(out.text_tokens) == most + end and out.end_of_turn is end
    engine.reset(cid)


def test_a_reset_that_fails_leaves_the_conversation_failed_until_reset(scenario, monkeypatch) -> None:
    engine = scenario.engine
    (cid,) = engine.conversations
    model = engine.model

    def lost(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(model, "llm_stack", lost)
    with pytest.raises(RuntimeError, match="device lost"):
        engine.reset(cid)
    monkeypatch.undo()
    silence = np.zeros(16000, dtype=np.float32)
    with pytest.raises(ConversationError) as raised:
        engine.step({cid: UnitInput(silence)})
    assert str(raised.value) == (
        f"conversation {cid} failed (its reset failed: RuntimeError: device lost); reset it to go on"
    )
    engine.reset(cid)
    assert engine.step({cid: UnitInput(silence, LISTEN)})[cid].unit == 0


def test_a_calibration_that_fails_leaves_admission_as_it_was(scenario, monkeypatch) -> None:
    engine = scenario.engine
    (cid,) = engine.conversations
    engine.close(cid)
    model = RoundModel.fit({1: 500.0, 3: 1500.0})
    engine.round_model = model

    def broken(slots, inputs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.model, "run_units", broken)
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            engine.calibrate([1, 2], rounds=1)
        assert engine.round_model is model and not engine.conversations
        with pytest.raises(ValueError, match=r"calibration counts must be 1\.\.4, got \[0, 2\]"):
            engine.calibrate([0, 2], rounds=1)
        assert engine.round_model is model
    finally:
        monkeypatch.undo()
        engine.round_model = None
        engine.open(seed=SEEDS["A"])
