"""`draft` on every shipped tail: the drafted `.clock` declares the regions, rates and retention of the
shipped one (names aside) and passes `dsl check`.

Regions are compared as multisets of (role, dtype, shape, clock rate, retention), every family member
counted, params at their defaults (B = 1). Scratch regions are left out of the comparison and named in
each test: they hand a tensor from one stage to the next inside one stock call, which drafting sees
whole. Where a shipped clock declares more (or less) than drafting can see, the test lists exactly what
differs and why. Model tails are built as tests/examples builds them (MiniCPM-o 4.5 reduced on CPU).
"""

from __future__ import annotations

import importlib.util
import types
import warnings
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.interpreter.draft.draft import draft
from duplexcadence.interpreter.draft.loop import StockLoop
from duplexcadence.interpreter.plans.prune import prune_unobserved

ROOT = Path(str(resources.files("duplexcadence")))


def shipped(name: str):
    path = ROOT / "examples" / "toy" / "toy.clock" if name == "toy" else ROOT / "stdlib" / "models" / f"{name}.clock"
    return load_program(path)


def signatures(program) -> tuple[Counter, list[str]]:
    """(role, dtype, shape, rate, retention) of every non-scratch region, and the scratch regions' names."""
    found, scratch = Counter(), []
    for name, region in program.regions.items():
        if region.role == "state" and region.retention.kind == "scratch":
            scratch.append(name)
            continue
        rate = program.clocks[region.clock].rate if region.clock else None
        found[(region.role, region.dtype, region.shape, rate, region.retention.describe())] += 1
    return found, sorted(scratch)


def compare(drafted, reference) -> tuple[Counter, Counter, list[str]]:
    """What the shipped clock declares and the draft does not, the reverse, and the shipped scratch regions.
    Counters and regions that always hold 0 units (`retain last 0`) are left out: a clock may declare them
    or not (the stock's zero-length caches hold nothing, a hook may count with `firing.count`)."""
    ours, _ = signatures(drafted)
    theirs, scratch = signatures(reference)
    optional = {key for key in ours | theirs if key[0] == "counter" or key[4] == "last 0"}
    for key in optional:
        ours.pop(key, None)
        theirs.pop(key, None)
    return theirs - ours, ours - theirs, scratch


def assert_drafts_clean(result) -> None:
    assert result.check.ok, result.text
    assert not result.check.diagnostics, [d.message for d in result.check.diagnostics]


def test_toy_draft_is_the_shipped_toy_clock():
    from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt

    model = build_toy()
    runner = ToyStockStream(model, make_prompt(model, 6), 20)
    codes = torch.randint(0, 64, (1, 64), generator=torch.Generator().manual_seed(3))
    loop = StockLoop(model, runner.step, lambda t: {"codes": codes[:, t : t + 1]}, rate=12.5, state=runner)
    result = draft(loop)
    assert_drafts_clean(result)
    missing, extra, scratch = compare(result.check.program, shipped("toy"))
    assert (missing, extra) == (Counter(), Counter())
    assert scratch == ["attended", "hidden"]
    # the cache window fills after 20 calls: drafting runs on until it stops growing
    assert result.proposals.calls == 21
    binds = {r.bind for r in result.check.program.regions.values() if r.bind}
    assert binds == {"encoder.conv.carry", "upsample.partial"}  # the cache is the stream object's: no bind
    assert "region cache : f32[2, 1, 4, time, 8] on frame retain first 6 + last 20 start given 6" in result.text
    assert "# caller-owned: found at state.cache" in result.text
    assert "    rng  # the call drew from the default generator" in result.text


@pytest.mark.models
@pytest.mark.slow
def test_moshi_mimi_decoder_draft_matches_the_shipped_clock_and_its_bindings():
    pytest.importorskip("moshi")
    from duplexcadence.examples.moshi import model as mimi_model
    from duplexcadence.examples.moshi.stock import MoshiStockDecoder

    mimi = mimi_model.build_mimi(seed=1234)
    stock = MoshiStockDecoder(mimi, 1, mode="eager")
    codes = mimi_model.random_codes(1, 16, seed=7)
    loop = StockLoop(mimi, stock.step, lambda t: {"codes": codes[:, :, t : t + 1]}, rate=12.5, outputs=("pcm",))
    result = draft(loop, calls=4)
    stock.close()
    assert_drafts_clean(result)
    reference = shipped("mimi_decoder")
    missing, extra, scratch = compare(result.check.program, reference)
    assert (missing, extra) == (Counter(), Counter())
    assert scratch == ["embedded", "latent_out"]
    ours = {r.bind for r in result.check.program.regions.values() if r.bind and r.retention.describe() != "last 0"}
    theirs = {r.bind for r in reference.regions.values() if r.bind}
    assert ours == theirs
    # the kernel-1 convs' zero-length carries are regions that keep 0 units (the encoder's, never run, are not)
    assert sum(r.retention.describe() == "last 0" for r in result.check.program.regions.values()) == 4
    assert (
        "region cache[layer < 8] : f32[2, 1, 8, time, 64] on frame_x2 retain ring 250 start zeros\n"
        '    bind private "decoder_transformer.transformer.layers.{layer}.self_attn._streaming_state.kv_cache.cache"'
    ) in result.text
    # moshi counts its transformer's offsets on the host, +2 a frame: counters, read by hooks
    assert sorted(result.check.program.counters) == ["offset_cpu", "self_attn_offset_cpu"]
    assert (
        "# a host int at 8 paths, decoder_transformer.transformer.layers.0._streaming_state.offset_cpu ...: "
        "0, 2, 4, ... (+2 a call)"
    ) in result.text


@pytest.mark.models
@pytest.mark.slow
def test_personaplex_draft_matches_the_shipped_clock():
    pytest.importorskip("moshi")
    from duplexcadence.examples.moshi import model as mimi_model
    from duplexcadence.examples.personaplex.stock import PersonaPlexMimiDecoder

    stock = PersonaPlexMimiDecoder(mimi_model.build_mimi(seed=1234), 1)
    codes = mimi_model.random_codes(1, 16, seed=7)
    feed = lambda t: {"codes": codes[:, :, t : t + 1]}  # noqa: E731
    result = draft(StockLoop(stock.mimi, stock.decode, feed, rate=12.5, state=stock, outputs=("pcm",)), calls=4)
    assert_drafts_clean(result)
    # the shipped clock declares the server's two instances; with other_mimi pruned (no output sees it)
    # it is one instance, the one the draft records (plus the tokens both instances are handed)
    reference = prune_unobserved(shipped("personaplex_mimi_decoder")).program
    missing, extra, scratch = compare(result.check.program, reference)
    assert (missing, extra) == (Counter(), Counter())
    assert scratch == ["embedded", "latent_out", "tokens"]
    # every carry lives in the stock object's dicts keyed by module name ('decoder.model.0'): no
    # attribute path names them, so the draft binds none (the shipped clock binds the adapter's `carries`)
    assert not any(r.bind for r in result.check.program.regions.values())
    # the stock numbers are the storage each carry's view keeps alive, as the shipped clock declares them
    stocks = sorted(r.stock_shape[-1] for r in result.check.program.regions.values() if r.stock_shape and r.clock)
    theirs = sorted(r.stock_shape[-1] for r in reference.regions.values() if r.stock_shape and r.clock and not r.family)
    assert stocks == theirs
    # the kernel-1 convs and the StreamingAdds keep zero-length views: regions that keep 0 units
    assert result.text.count("zero-length every call") == 12
    assert sum(r.retention.describe() == "last 0" for r in result.check.program.regions.values()) == 12
    # moshi's transformer layers count their offsets on the host, +2 a frame: two counters (one per kind)
    assert sorted(result.check.program.counters) == ["attention_carries_offset_cpu", "offset_cpu"]
    assert "# a host int at 8 paths, state.layer_carries.0.offset_cpu ...: 0, 2, 4, ... (+2 a call)" in result.text


@pytest.mark.models
@pytest.mark.slow
def test_qwen3_omni_code2wav_draft_matches_the_shipped_clock():
    pytest.importorskip("transformers")
    from duplexcadence.examples.qwen3omni.model import build_code2wav
    from duplexcadence.examples.qwen3omni.stock import StockSecondDecoder, second_bounds

    stock = StockSecondDecoder(build_code2wav(dtype=torch.float32, device="cpu", seed=1234))
    codes = torch.randint(0, 2048, (1, 16, second_bounds(4)[1]), generator=torch.Generator().manual_seed(2))
    feed = lambda s: {"codes": codes[..., second_bounds(s)[0] : second_bounds(s)[1]]}  # noqa: E731
    loop = StockLoop(stock.model, lambda codes: stock.step(codes), feed, rate=12.5, state=stock, outputs=("wav",))
    result = draft(loop, calls=4, max_calls=4)
    assert result.check.ok, result.text
    # every call is 555 samples short: the draft declares it as the shipped clock does, and is flagged
    assert [d.code.name for d in result.check.diagnostics] == ["boundary-loss"]
    missing, extra, scratch = compare(result.check.program, shipped("qwen3_omni_code2wav"))
    assert (missing, extra, scratch) == (Counter(), Counter(), [])
    assert "region codes : i64[1, 16, time] on frame input retain last 25" in result.text
    assert "    read codes new + 25\n    write wav loses 555" in result.text
    assert "# writes 1920 units per input unit and -555 per call" in result.text
    stage = result.check.program.stages["step"]
    assert result.check.program.clocks[stage.clock].rate == 1


@pytest.mark.models
@pytest.mark.slow
def test_minicpmo45_token2wav_draft_and_what_only_the_shipped_clock_declares():
    missing = [
        m for m in ("stepaudio2", "einops", "onnxruntime", "scipy", "numpy") if importlib.util.find_spec(m) is None
    ]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    from duplexcadence.examples.minicpmo45 import model, stock

    tail = model.build_tail(
        model.TailConfig(encoder_blocks=1, encoder_up_blocks=1, dit_depth=1, hift_base_channels=32), seed=1234
    )
    prompt = model.random_prompt(20, seed=4321)
    token2wav = stock.make_token2wav(tail, prompt, 2)
    with torch.no_grad():
        flow_cache, hift_cache = stock.setup_stream_caches(tail, prompt, 2)
    token2wav.stream_cache, token2wav.hift_cache_dict = flow_cache, hift_cache
    stream = types.MethodType(stock.stock_stream_function(tail.device), token2wav)
    generator = torch.Generator().manual_seed(5)
    tokens = torch.tensor([[model.SILENCE_TOKEN] * 3 + torch.randint(0, 6561, (100,), generator=generator).tolist()])

    def step(tokens: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*CUDA is not available.*Disabling autocast.*")
            return torch.from_numpy(stream(tokens[0].tolist(), None, last_chunk=False, return_waveform=True))

    feed = lambda k: {"tokens": tokens[:, 25 * k : 25 * k + 28].to(torch.int32)}  # noqa: E731
    modules = {"flow": tail.flow, "hift": tail.hift}
    result = draft(StockLoop(modules, step, feed, rate=25, state=token2wav, outputs=("pcm",)), calls=4, max_calls=4)
    assert_drafts_clean(result)
    reference = shipped("step_audio2_token2wav")
    params = {"P": "20", "steps": "2", "layers": "2"}
    reference = load_program(ROOT / "stdlib" / "models" / "step_audio2_token2wav.clock", params)
    missing, extra, scratch = compare(result.check.program, reference)
    f32 = "f32"
    # Declared alike: the tokens (1 s of 25 new + 3 re-read, 3 given), the pcm (24 000 a call, 3840 held
    # back on the first), the conformer K|V (first P + last 100), the DiT K|V in the stock's newest-first
    # order (first P + last 100), the conformer conv carries, HiFT's mel (last 8), source and speech (last 3840).
    assert missing == Counter(
        {
            # The DiT K|V and conv carries: the shipped clock keeps one slot per Euler step used (2); stock
            # carries 16, and drafting declares what stock carries.
            ("state", f32, (2, 16, 2, 8, None, 128), 50, "first 20 + last 100"): 1,
            ("state", f32, (2, 16, 2, 1024, 2), None, "fixed 0"): 1,
            # The speaker embedding and the CFM noise table never change: to drafting they are weights.
            # The shipped clock declares them (given at session start) to size the noise table to what is read.
            ("state", f32, (1, 192), None, "fixed 0"): 1,
            ("state", f32, (1, 80, 174), None, "fixed 0"): 1,
        }
    )
    assert extra == Counter(
        {
            ("state", f32, (16, 16, 2, 8, None, 128), 50, "first 20 + last 100"): 1,
            ("state", f32, (16, 16, 2, 1024, 2), None, "fixed 0"): 1,
            # The CFM and DiT working buffers: rewritten in place every chunk, so drafting declares them as
            # state at stock's 1000 frames; the shipped clock makes them scratch sized to one chunk (P + 154).
            ("state", f32, (16, 16, 2, 8, 1000, 128), None, "fixed 0"): 1,
            ("state", f32, (16, 2, 8, 1000, 128), None, "fixed 0"): 1,
            ("state", f32, (16, 2, 1024, 2), None, "fixed 0"): 1,
        }
    )
    # chunk_mel and spectrum hand tensors between the shipped clock's three stages (flow, HiFT front and
    # back); the working buffers above are scratch there too.
    assert scratch == ["cfm_att", "chunk_mel", "dit_att", "dit_cnn", "spectrum"]
    assert "region tokens : i32[1, time] on frame input retain last 3 start given 3" in result.text
    assert "the last 100 never changed once it was full, the first 20 are the newest" in result.text
