"""The duplex unit planned like a tail (interpreter/plans/conversations.py, `models.minicpmo45_duplex`): each
region's capacity and bytes from its declaration, the bytes per conversation, the batched graphs per row
count, the conversations that fit, and what `dsl plan` prints and writes as JSON. No torch."""

from __future__ import annotations

import json

import pytest

from duplexcadence.dsl.loader import stdlib_path
from duplexcadence.interpreter.cli.main import main
from duplexcadence.interpreter.plans.arena import align
from duplexcadence.interpreter.plans.plan import conversation_plan, plan_file

DUPLEX = stdlib_path("models.minicpmo45_duplex")
TAIL = stdlib_path("models.step_audio2_token2wav")
GiB = 2**30


@pytest.fixture(scope="module")
def plan():
    return plan_file(DUPLEX)


def test_each_region_is_sized_from_its_declaration(plan):
    regions = plan.schedule.regions
    # the LLM's window: high mark 4000 + the longest unit (<unit>, 10 embeddings, 20 decode steps, </unit>)
    assert regions["llm_kv"].capacity == 4000 + 32
    assert regions["llm_kv"].shape == (36, 2, 8, 4032, 128) and regions["llm_kv"].bytes == 594_542_592
    # Whisper's cache: slides to nothing above 1400 positions, 50 a unit
    assert regions["audio_kv"].capacity == 1450 and regions["audio_kv"].bytes == 24 * 2 * 16 * 1450 * 64 * 2
    # the TTS's cache for a 60 s turn: up to 18 text tokens, the audio BOS and 25 steps a unit
    assert regions["tts_kv"].capacity == 60 * 44 and regions["tts_kv"].bytes == 20 * 2 * 12 * 2640 * 64 * 2
    assert regions["tts_kv"].stock_shape == (20, 2, 12, 4096, 64)
    assert (regions["text"].capacity, regions["text_hidden"].capacity, regions["speech"].capacity) == (21, 21, 26)
    # the tail, used whole, is planned as it is on its own
    tail = plan_file(TAIL).schedule.regions
    assert {name: (r.capacity, r.bytes) for name, r in tail.items()} == {
        name: (regions[name].capacity, regions[name].bytes) for name in tail
    }


def test_bytes_per_conversation_and_what_fits(plan):
    conversations = plan.conversations
    batched = sum(align(plan.schedule.regions[name].bytes) for name in ("audio", "speech", "text", "text_hidden"))
    assert conversations.bytes_per_conversation == plan.arena.session_bytes + batched == 1_240_538_112
    assert conversations.shared_bytes == plan.arena.scratch_bytes
    assert [r.name for r in conversations.regions[:4]] == ["llm_kv", "estimator_att", "tts_kv", "audio_kv"]
    assert {r.name for r in conversations.regions if r.batched} == {"audio", "speech", "text", "text_hidden"}
    assert conversations.fits(80 * GiB) == (80 * GiB - conversations.shared_bytes) // 1_240_538_112 == 68
    assert conversations.fits(conversations.shared_bytes) == 0
    assert conversations.fits(80 * GiB, lanes=4) == 68 - 1


def test_graphs_per_row_count_and_per_slot(plan):
    conversations = plan.conversations
    batched = [(g.stage, g.rows, g.burst) for g in conversations.batched]
    assert batched == [("listen", 16, None), ("llm_step", 16, 21), ("tts_step", 16, 25)]
    assert conversations.rows == 16 and conversations.batched_graph_count == 48
    stages = {plan.capture.graphs[key].stage for key in conversations.per_conversation_graphs}
    assert stages == {"flow", "hift_front", "hift_back"}
    # the TTS's prefill advances its cache `up to` the condition's length: never captured
    assert not [g for g in plan.capture.graphs if g.stage == "tts_prefill"]
    assert {r.key for r in plan.capture.steady if r.stage == "tts_prefill"} == {None}
    assert plan.clocks.stages["llm_step"].burst == 21 and plan.clocks.stages["llm_step"].per_cadence == 1


def test_params_size_the_unit():
    small = conversation_plan(DUPLEX, {"high": "200", "low": "150", "decode_steps": "10", "conversations": "4"})
    assert small.region("llm_kv").capacity == 200 + 1 + 10 + 10 + 1
    assert small.region("tts_kv").capacity == 60 * (8 + 1 + 25)
    assert small.batched_graph_count == 12


def test_dsl_plan_prints_the_conversations_and_what_fits(capsys):
    assert main(["plan", "models.minicpmo45_duplex", "--memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "  llm_kv         slide 4000 to 3500        4032  567.0 MiB" in out
    assert "  llm_token     up to 21 per unit" in out and "  llm_step     llm_token     up to 21" in out
    assert "batched graphs, 48 in all: listen (graph 3) at rows 1..16;" in out
    assert "  conversations that fit in 80.0 GiB (--memory): 68" in out
    assert main(["plan", "models.minicpmo45_duplex", "--memory", "512 MiB", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["conversations"]["memory"] == {"bytes": 512 * 2**20, "source": "--memory", "conversations": 0}
    assert document["clocks"]["bounds"]["llm_token"] == {"per": "unit", "up_to": 21}
    assert document["conversations"]["batched_graphs"][1] == {"burst": 21, "key": 4, "rows": 16, "stage": "llm_step"}


def test_a_tail_prints_no_conversations_unless_asked(capsys):
    assert main(["plan", "models.mimi_decoder"]) == 0
    assert "Conversations" not in capsys.readouterr().out
    assert main(["plan", "models.mimi_decoder", "--memory", "1GiB"]) == 0
    assert "conversations that fit in 1.0 GiB (--memory): " in capsys.readouterr().out


@pytest.mark.parametrize("size", ["0", "80 GB", "0.5B", "lots"])
def test_a_bad_memory_size_is_a_usage_error(size, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "models.minicpmo45_duplex", "--memory", size])
    assert exit_.value.code == 2
    assert "--memory: must be a positive size such as 80GiB, 512MiB or 1000000 (bytes)" in capsys.readouterr().err


@pytest.mark.gpu
def test_without_memory_dsl_plan_fits_conversations_in_the_devices_free_memory(capsys):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    free, _total = torch.cuda.mem_get_info()
    assert main(["plan", "models.minicpmo45_duplex", "--format", "json"]) == 0
    memory = json.loads(capsys.readouterr().out)["conversations"]["memory"]
    assert memory["source"] == f"free on {torch.cuda.get_device_name()}"
    assert abs(memory["bytes"] - free) < 2**30  # free memory moves a little between the two readings
    assert memory["conversations"] == (memory["bytes"] - 438_648_832) // 1_240_538_112


def test_memory_sets_no_limit_on_conversations_that_hold_no_bytes(tmp_path, capsys):
    path = tmp_path / "stateless.clock"
    path.write_text(
        "cadence 1 s\nclock unit = 1 Hz\nregion a : f32[1, time] on unit input\n"
        "region b : f32[1, time] on unit output\nstage s on unit {\n    hook s\n    read a\n    write b +1\n}\n"
    )
    conversations = plan_file(path).conversations
    assert conversations.bytes_per_conversation == 0
    assert conversations.fits(80 * GiB) is None and conversations.fits(conversations.shared_bytes - 1) == 0
    assert main(["plan", str(path), "--memory", "80GiB"]) == 0
    assert "conversations that fit in 80.0 GiB (--memory): any number (a conversation holds no device bytes)" in (
        capsys.readouterr().out
    )
    assert main(["plan", str(path), "--memory", "80GiB", "--output-format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["conversations"]["memory"]["conversations"] is None
