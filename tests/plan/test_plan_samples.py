"""The sample accounting pass: every output's units over a session, against one offline call.

Pinned for every stdlib tail and the toy over the default 60 s session; the sums checked against the
`.clock` state machine stepped instant by instant (the last instant ending the stream), on the stdlib
tails and on generated programs (hypothesis) with latencies, losses and lookaheads.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplexcadence import Runtime
from duplexcadence.dsl.frontend import check_file, load_program
from duplexcadence.interpreter.plans.plan import make_plan, plan_file, to_json
from duplexcadence.interpreter.plans.plan_text import format_plan
from duplexcadence.interpreter.plans.samples import MAX_SESSION_INSTANTS, SessionLengthError
from duplexcadence.interpreter.plans.trace import Simulator

ROOT = Path(__file__).resolve().parents[2]
STDLIB = ROOT / "stdlib" / "models"
TOY = ROOT / "examples" / "toy" / "toy.clock"


def stepped_total(plan, region: str, seconds: Fraction) -> tuple[int, int]:
    """(units of `region` written, input units fed) when the state machine steps every instant of a
    `seconds` session from the start, then, where something is held back, the end of the stream with
    no new input (left out where it cannot run: the plan says why)."""
    program, clocks = plan.program, plan.clocks
    simulator = Simulator(program, clocks)
    instants = clocks.instants_within(seconds)
    steps = [simulator.run_instant(index) for index in range(instants)]
    if program.holds_back():
        inputs = {name for name, r in program.regions.items() if r.role == "input"}
        try:
            steps.append(simulator.run_instant(instants, dict.fromkeys(inputs, 0), last=True))
        except ValueError as error:
            assert plan.samples.unflushed is not None and str(error) in plan.samples.unflushed
    views = [view for firings in steps for firing in firings for view in firing.views]
    written = sum(view.length for view in views if view.kind == "write" and view.region == region)
    return written, sum(view.length for view in views if view.kind == "feed")


# name, output, firings, input units, emitted, flushed, dropped, offline
SIXTY_SECONDS = [
    ("mimi_decoder", "pcm", 750, 750, 1_440_000, 0, 0, 1_440_000),
    ("personaplex_mimi_decoder", "pcm", 750, 750, 1_440_000, 0, 0, 1_440_000),
    ("qwen3_omni_code2wav", "wav", 60, 750, 1_406_700, 0, 32_745, 1_439_445),
    ("qwen3_omni_code2wav_streaming", "wav", 750, 750, 1_439_445, 0, 0, 1_439_445),
    ("step_audio2_token2wav", "pcm", 61, 1503, 1_436_160, 6720, 0, 1_442_880),
]


@pytest.mark.parametrize(
    ("model", "output", "firings", "units", "emitted", "flushed", "dropped", "offline"), SIXTY_SECONDS
)
def test_every_stdlib_output_over_sixty_seconds(model, output, firings, units, emitted, flushed, dropped, offline):
    account = plan_file(STDLIB / f"{model}.clock").samples
    assert (account.seconds, account.skipped, account.clamped, account.unflushed) == (60, {}, None, None)
    assert account.flush == (model == "step_audio2_token2wav")  # the only one that holds units back
    found = account.outputs[output]
    assert (found.firings, found.input_units, found.emitted, found.flushed, found.dropped, found.offline) == (
        firings,
        units,
        emitted,
        flushed,
        dropped,
        offline,
    )
    assert found.total == emitted + flushed and found.short == dropped and found.unaccounted == 0


def test_the_stock_qwen_loop_loses_555_samples_at_each_of_59_boundaries():
    found = plan_file(STDLIB / "qwen3_omni_code2wav.clock").samples.outputs["wav"]
    assert (found.input, found.ratio, found.loss, found.loss_intended, found.boundaries) == (
        "codes",
        1920,
        555,
        False,
        59,
    )
    assert [t.values() for t in found.ticks] == [
        (12, 22485, 0, 0),  # 12 codes x 1920 - 555, nothing before it
        (13, 24405, 0, 555),
        (12, 22485, 0, 555),
        (13, 24405, 0, 555),
    ]
    assert found.steady_from == 2
    assert (found.last.firing, found.last.time, found.last.values()) == (59, 59, (13, 24405, 0, 555))
    assert found.whole_loss == 555  # one offline forward over 750 codes: 750 x 1920 - 555


def test_step_audio2_holds_back_its_latency_and_lookahead_and_flushes_them_at_the_end():
    found = plan_file(STDLIB / "step_audio2_token2wav.clock").samples.outputs["pcm"]
    assert (found.input, found.ratio, found.latency, found.latency_dropped) == ("tokens", 960, 3840, False)
    # the first chunk emits 24 000 - 3840; 3840 + 3 lookahead tokens x 960 stay owed until the end
    assert [t.values() for t in found.ticks] == [(25, 20160, 6720, 0), (25, 24000, 6720, 0), (25, 24000, 6720, 0)]
    assert found.held_back == found.flushed == 6720
    # the end of the stream, with no new token: the 3 lookahead tokens become 6 mel frames, the 3840 are released
    assert (found.last.firing, found.last.time, found.last.values()) == (60, 60, (0, 2880 + 3840, 0, 0))
    assert found.input_units == 3 + 60 * 25  # the 3 priming tokens it is given count as input
    assert found.offline == found.total == found.input_units * 960


def test_the_streaming_qwen_clock_drops_its_latency_as_one_offline_forward_does():
    found = plan_file(STDLIB / "qwen3_omni_code2wav_streaming.clock").samples.outputs["wav"]
    assert (found.latency, found.latency_dropped, found.whole_loss, found.flushed) == (555, True, 555, 0)
    assert found.ticks[0].values() == (1, 1920 - 555, 0, 0) and found.ticks[1].values() == (1, 1920, 0, 0)


@pytest.mark.parametrize(
    ("path", "output"),
    [
        (STDLIB / "mimi_decoder.clock", "pcm"),
        (STDLIB / "qwen3_omni_code2wav_streaming.clock", "wav"),
        (STDLIB / "step_audio2_token2wav.clock", "pcm"),
        (TOY, "pcm"),
    ],
)
@pytest.mark.parametrize("seconds", [Fraction(1), Fraction(3), Fraction(37, 10), Fraction(61, 10)])
def test_the_sums_are_the_state_machine_stepped_instant_by_instant(path, output, seconds):
    plan = make_plan(load_program(path), seconds=seconds)
    found = plan.samples.outputs[output]
    written, fed = stepped_total(plan, output, seconds)
    assert found.total == written
    given = plan.program.regions[found.input]
    assert found.input_units == fed + (given.start_length if given.start == "given" else 0)


def test_a_session_length_and_its_limits():
    program = load_program(STDLIB / "qwen3_omni_code2wav.clock")
    found = make_plan(program, seconds=Fraction(3)).samples.outputs["wav"]
    assert (found.firings, found.input_units, found.total, found.offline, found.dropped) == (3, 37, 69375, 70485, 1110)
    for seconds in (Fraction(0), Fraction(MAX_SESSION_INSTANTS + 1)):
        with pytest.raises(SessionLengthError):
            make_plan(program, seconds=seconds)


def test_a_default_session_with_more_instants_than_the_accounting_sums_is_shortened_and_loads():
    text = (
        "cadence 0.001 ms\nclock sample = 1000 kHz\nregion x : f32[1, time] on sample input\n"
        "region y : f32[1, time] on sample output\nstage s on sample { hook copy; read x; write y +1 }\n"
    )
    program = check_file("megahertz.clock", text=text).program
    samples = make_plan(program).samples
    assert (samples.seconds, samples.instants, samples.outputs["y"].total) == (10, 10_000_000, 10_000_000)
    assert samples.clamped == (
        "a session of 60 s has 60000000 instants; the sample accounting sums at most 10000000: accounted over "
        "the first 10 s"
    )
    runtime = Runtime.load(program, None, hooks={"copy": lambda model, x: x}, device="cpu")
    assert runtime.session().step(x=torch.ones(1, 1)).tolist() == [[1.0]]


def test_a_write_ahead_of_its_input_is_unaccounted_until_a_whole_hyperperiod():
    text = (
        "use std.audio (sample, mimi_frame)\ncadence 1 s\nclock code = mimi_frame\n"
        "region codes : i64[1, 16, time] on code input retain last 25\nregion wav : f32[1, 1, time] on sample output\n"
        "stage decode on second { hook chunk; read codes new + 25; write wav +24000 }\nclock second = 1 Hz\n"
    )
    program = check_file("ahead.clock", text=text).program
    odd = make_plan(program, seconds=Fraction(3)).samples.outputs["wav"]
    assert (odd.total, odd.offline, odd.unaccounted) == (72000, 71040, -960)
    assert "960 samples more than the input's units times 1920" in format_plan(make_plan(program, seconds=Fraction(3)))
    assert make_plan(program, seconds=Fraction(4)).samples.outputs["wav"].unaccounted == 0


def test_outputs_that_cannot_be_counted_say_why_and_a_horizon_shortens_the_session():
    text = (
        "cadence 1 s\nclock c = 10 Hz\nregion a : f32[time] on c input\nregion b : f32[time] on c input\n"
        "region log : f32[time] on c retain all horizon 20\nregion out : f32[time] on c output\n"
        'stage s on c { module "s"; read a; read b; update log +1; write out +1 }\n'
    )
    account = make_plan(check_file("two.clock", text=text).program).samples
    assert account.outputs == {}
    assert account.skipped == {"out": "several inputs feed it (a, b): no single rate ratio"}
    assert account.clamped is not None and account.instants == 20


def test_the_json_carries_the_accounting():
    data = json.loads(json.dumps(to_json(plan_file(STDLIB / "qwen3_omni_code2wav.clock"))))
    samples = data["samples"]
    assert (samples["seconds"], samples["instants"], samples["skipped"], samples["clamped"]) == ("60", 60, {}, None)
    wav = samples["outputs"]["wav"]
    assert {k: wav[k] for k in ("units_per_input_unit", "loss_per_firing", "boundaries", "dropped", "short")} == {
        "units_per_input_unit": "1920",
        "loss_per_firing": 555,
        "boundaries": 59,
        "dropped": 32745,
        "short": 32745,
    }
    assert wav["ticks"][1] == {
        "firing": 1,
        "instant": 1,
        "time_s": "1",
        "input": 13,
        "emitted": 24405,
        "held_back": 0,
        "dropped": 555,
    }
    assert wav["last"]["time_s"] == "59" and wav["steady_from"] == 2


def test_dsl_plan_shows_the_section_condensed_and_every_firing_with_verbose():
    plan = plan_file(STDLIB / "qwen3_omni_code2wav.clock")
    text = format_plan(plan)
    section = text[text.index("Samples over") :].splitlines()
    assert section[:6] == [
        "Samples over 60 s (60 instants; units of each output's clock)",
        "  output  clock   input            firings  emitted  flushed  dropped    total  offline  short",
        "  ------  ------  ---------------  -------  -------  -------  -------  -------  -------  -----",
        "  wav     sample  750 codes x1920       60  1406700        0    32745  1406700  1439445  32745",
        "  wav: 555 samples (23.1 ms at 24 kHz) lost at each of 59 boundaries, 32745 samples (1.36 s) in all",
        "      (boundary-loss)",
    ]
    verbose = format_plan(plan, verbose=True)
    table = verbose[verbose.index("  wav per firing of 'decode'") :].splitlines()
    assert table == [
        "  wav per firing of 'decode' (warm-up, one steady period that repeats, the last):",
        "    firings    time  input  emitted  held back  dropped",
        "    ---------  ----  -----  -------  ---------  -------",
        "    0          0 ms     12    22485          0        0",
        "    1          1 s      13    24405          0      555",
        "    2          2 s      12    22485          0      555",
        "    3          3 s      13    24405          0      555",
        "    59 (last)  59 s     13    24405          0      555",
    ]


# --- generated programs -------------------------------------------------------------------------------


@st.composite
def streams(draw) -> tuple[str, Fraction]:
    """A one-input, one-output program: the output on a faster clock, an optional latency (dropped or
    not), loss and lookahead; and a session length."""
    stage_hz = draw(st.sampled_from(["10", "25", "12.5"]))
    input_per_firing = draw(st.sampled_from([1, 2]))
    ratio = draw(st.sampled_from([2, 4, 8]))
    advance = input_per_firing * ratio
    latency = draw(st.integers(0, advance // 2))
    dropped = draw(st.booleans()) and latency > 0
    loss = draw(st.integers(0, advance - latency))
    lookahead = draw(st.integers(0, 1))
    write = f"write out +{advance}" + (f" latency {latency}" + (" dropped" if dropped else "") if latency else "")
    write += f" loses {loss} intended" if loss else ""
    read = f"read inp last {input_per_firing + lookahead}" + (f" lookahead {lookahead}" if lookahead else "")
    text = (
        f"cadence 1 s\nclock tick = {stage_hz} Hz\nclock units = tick * {input_per_firing}\n"
        f"clock fine = units * {ratio}\n"
        "region inp : f32[2, time] on units input"
        + (f" retain last {lookahead} start given {lookahead}" if lookahead else "")
        + "\nregion out : f32[2, time] on fine output\n"
        f'stage s on tick {{ module "m"; {read}; {write} }}\n'
    )
    seconds = Fraction(draw(st.integers(1, 40)), 10)
    return text, seconds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_generated_streams_account_for_every_unit(case):
    text, seconds = case
    result = check_file("stream.clock", text=text)
    assert result.ok, [d.message for d in result.diagnostics]
    plan = make_plan(result.program, seconds=seconds)
    found = plan.samples.outputs["out"]
    written, _ = stepped_total(plan, "out", seconds)
    assert found.total == written
    assert found.firings == math.ceil(seconds * plan.clocks.rates["tick"]) + plan.samples.flush
    assert found.dropped == found.loss * (found.firings - 1)
    if plan.samples.unflushed is None:  # (a flush too short for its loss: what it held back stays owed)
        assert found.unaccounted == 0, text
