"""PersonaPlex's Mimi tail on DuplexCadence vs PersonaPlex's own stock loop (the reproduction).

CPU, released size, B=1, no reduced config: 130 ticks (the 250-step KV rings are full from tick 124
and wrap at 125, where PersonaPlex's old ring labelling starts to differ from moshi 0.2.13), both
Mimi instances every tick: stock = two `PersonaPlexMimiDecoder`s; DuplexCadence = the clock as the
server runs it, `other_mimi` pruned (`PersonaPlexServerTail`: one session, its main PCM), and the two
instances as two sessions of one runtime over one model (`PersonaPlexCadenceTail`: both PCMs). Every
frame is compared with `torch.equal`. GPU tests (marked `gpu`) add graph capture for every stage and the
stock transformer graphs.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moshi")

from duplexcadence.examples.moshi import model as mimi_model  # noqa: E402
from duplexcadence.examples.personaplex.cadence import (  # noqa: E402
    PersonaPlexCadenceTail,
    PersonaPlexServerTail,
    load_runtime,
)
from duplexcadence.examples.personaplex.stock import PersonaPlexTail  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

FRAMES = 130
RESET_FRAMES = 4
DECLARED_STATE_TENSORS = 36
"""11 non-empty conv/convtr carries + 8 x (KV cache, end_offset, offset) + the transformer offset."""


@dataclasses.dataclass
class Runs:
    mismatches: list[tuple[int, str]]
    stock_first: list[torch.Tensor]
    pointers: dict[str, list[dict[str, int | None]]]
    region_pointers: dict[str, list[dict[str, int]]]
    arena: tuple[int, int]
    stock_carry_storage: dict[str, int]
    reset_mismatches: list[tuple[int, str]]
    pointers_after_reset: dict[str, dict[str, int | None]]
    region_pointers_after_reset: dict[str, dict[str, int]]
    pcm_std: float
    tail: PersonaPlexCadenceTail
    server_mismatches: list[int]
    server: PersonaPlexServerTail


def _pointers(tail: PersonaPlexCadenceTail) -> dict[str, int | None]:
    decoder = tail.runtime.model.mimi.decoder
    return {name: None if tensor is None else tensor.data_ptr() for name, tensor in decoder.state_tensors().items()}


@pytest.fixture(scope="module")
def runs() -> Runs:
    mimi = mimi_model.build_mimi(seed=1234)
    codes = mimi_model.random_codes(1, FRAMES, seed=7)
    stock = PersonaPlexTail(mimi)
    tail = PersonaPlexCadenceTail(mimi)
    server = PersonaPlexServerTail(mimi)
    sessions = {"main": tail.main, "other": tail.other}
    mismatches: list[tuple[int, str]] = []
    server_mismatches: list[int] = []
    stock_first: list[torch.Tensor] = []
    pointers: dict[str, list] = {"main": [], "other": []}
    region_pointers: dict[str, list] = {"main": [], "other": []}
    squares, count = 0.0, 0
    with torch.no_grad():
        for t in range(FRAMES):
            frame = codes[:, :, t : t + 1]
            expected = dict(zip(("main", "other"), stock.step(frame)))
            for name, session in sessions.items():
                actual = session.step(codes=frame)  # binds this session's views: record them now
                pointers[name].append(_pointers(tail))
                region_pointers[name].append(session.data_ptrs())
                if not torch.equal(actual, expected[name]):
                    mismatches.append((t, name))
            main, nothing = server.step(frame)
            if nothing is not None or not torch.equal(main, expected["main"]):
                server_mismatches.append(t)
            if t < RESET_FRAMES:
                stock_first.append(expected["main"].clone())
            squares += float(expected["main"].double().pow(2).sum())
            count += expected["main"].numel()
        stock_carry_storage = {
            name: tensor.untyped_storage().nbytes()
            for name, tensor in stock.mimi.state_tensors().items()
            if tensor is not None
        }
        tail.reset()
        server.reset()
        after_reset = {name: session.data_ptrs() for name, session in sessions.items()}
        reset_mismatches = []
        reset_pointers = {}
        for t in range(RESET_FRAMES):
            for name, session in sessions.items():
                actual = session.step(codes=codes[:, :, t : t + 1])
                reset_pointers[name] = _pointers(tail)
                if not torch.equal(actual, stock_first[t]):
                    reset_mismatches.append((t, name))
            if not torch.equal(server.step(codes[:, :, t : t + 1])[0], stock_first[t]):
                reset_mismatches.append((t, "server"))
    buffer = tail.runtime.arena.buffer
    arena = (buffer.data_ptr(), buffer.data_ptr() + buffer.numel())
    return Runs(
        mismatches,
        stock_first,
        pointers,
        region_pointers,
        arena,
        stock_carry_storage,
        reset_mismatches,
        reset_pointers,
        after_reset,
        (squares / count) ** 0.5,
        tail,
        server_mismatches,
        server,
    )


def test_both_instances_bit_identical_to_personaplex_stock_every_frame(runs: Runs) -> None:
    """130 ticks, past the ring wrap: every frame of main and other_mimi is torch.equal to stock."""
    assert runs.mismatches == []
    assert runs.pcm_std > 1e-3  # the codes decode to audio, not silence
    report = runs.tail.runtime.report()
    assert report.eager_off_plan == 0


def test_pruned_server_tail_bit_identical_to_personaplex_stock_every_frame(runs: Runs) -> None:
    """The clock as the server runs it, `other_mimi` pruned: one session's PCM is torch.equal to stock's
    main PCM on all 130 ticks, and the pruned instance was never built, bound or called."""
    assert runs.server_mismatches == []
    runtime = runs.server.runtime
    assert [s.name for s in runtime.plan.pruning.stages] == ["other_upsample", "other_transformer", "other_seanet"]
    assert "other_mimi" not in vars(runtime.model)
    assert set(runtime.callables) == {"audio_tokens", "mimi_upsample", "mimi_transformer", "mimi_seanet"}
    assert len(runtime.attributes) == DECLARED_STATE_TENSORS
    report = runtime.report()
    assert report.eager_off_plan == 0 and report.session_bytes == 8_251_392


def test_every_state_tensor_lives_in_its_session_slot(runs: Runs) -> None:
    """After a session's step, each non-None state tensor of the reproduction is one of that
    session's regions (at its base address); the always-empty carries are None."""
    low, high = runs.arena
    for name in ("main", "other"):
        for pointers, regions in zip(runs.pointers[name], runs.region_pointers[name]):
            live = {tensor: ptr for tensor, ptr in pointers.items() if ptr is not None}
            assert len(live) == DECLARED_STATE_TENSORS
            bases = set(regions.values())
            for tensor, ptr in live.items():
                assert ptr in bases and low <= ptr < high, tensor
            empty = [tensor for tensor, ptr in pointers.items() if ptr is None]
            assert len(empty) == 12 and all(".add." in t or ".block.3." in t for t in empty)


def test_cat_rebuilt_carries_no_longer_move(runs: Runs) -> None:
    """Stock gives 11 carries a new address every tick; here each stays at one address per session,
    across 130 ticks and a reset, and the two sessions never share one."""
    for name in ("main", "other"):
        first = runs.pointers[name][0]
        for pointers in runs.pointers[name][1:]:
            assert pointers == first
        assert runs.pointers_after_reset[name] == first
        regions = runs.region_pointers[name][0]
        assert all(r == regions for r in runs.region_pointers[name])
        assert runs.region_pointers_after_reset[name] == regions
    main = {p for p in runs.pointers["main"][0].values() if p is not None}
    other = {p for p in runs.pointers["other"][0].values() if p is not None}
    assert not main & other


def test_reset_starts_both_instances_afresh(runs: Runs) -> None:
    assert runs.reset_mismatches == []


def test_declared_stock_sizes_are_what_stock_keeps_alive(runs: Runs) -> None:
    """The `.clock`'s `stock N` of every bound carry = the bytes of the storage the stock carry pins."""
    runtime = runs.tail.runtime
    regions = runtime.plan.schedule.regions
    checked = 0
    for name, region in runtime.program.regions.items():
        if region.bind and region.bind.startswith("mimi.carries."):
            assert regions[name].stock_bytes == runs.stock_carry_storage[region.bind[len("mimi.carries.") :]], name
            checked += 1
    assert checked == 11


def test_load_runtime_serves_one_instance_per_session() -> None:
    """Binding and planning only (no decode): `other_mimi` pruned, ring KV and `[1]` offsets."""
    runtime = load_runtime(mimi_model.build_mimi(seed=1234), sessions=1)
    program = runtime.program
    assert runtime.arena.sessions == 1
    assert program.regions["kv[0]"].retention.kind == "ring"
    assert tuple(program.regions["kv_end[0]"].shape) == (1,)
    assert len(runtime.attributes) == DECLARED_STATE_TENSORS
    assert not any(name.startswith("other_") for name in program.regions)


SERVER_FRAMES = 6


def test_server_tail_without_pruning_decodes_with_both_instances() -> None:
    """`prune=False`: both instances run each tick, `mimi` first; the main PCM is stock's, and `other_mimi`'s
    state, the same weights decoding the same tokens, is bit for bit `mimi`'s."""
    mimi = mimi_model.build_mimi(seed=1234)
    codes = mimi_model.random_codes(1, SERVER_FRAMES, seed=7)
    stock = PersonaPlexTail(mimi)
    server = PersonaPlexServerTail(mimi, prune=False)
    runtime = server.runtime
    assert runtime.plan.pruning.stages == () and len(runtime.attributes) == 2 * DECLARED_STATE_TENSORS
    assert runtime.plan.clocks.stage_order[1:4] == ("mimi_upsample", "mimi_transformer", "mimi_seanet")
    session = server.session
    state = ["upsample_partial", "conv_in", "up8", "res8", "up6", "res6", "up5", "res5", "up4", "res4", "conv_out"]
    state += [f"{family}[{i}]" for family in ("kv", "kv_end", "rope_offset") for i in range(8)]
    with torch.no_grad():
        for t in range(SERVER_FRAMES):
            frame = codes[:, :, t : t + 1]
            main, _ = stock.step(frame)
            assert torch.equal(server.step(frame)[0], main), t
            for name in state:
                assert torch.equal(session.region(f"other_{name}"), session.region(name)), (t, name)
    assert float(session.region("other_kv[3]").abs().sum()) > 0
    assert session.region("other_kv_end[0]").item() == 2 * SERVER_FRAMES


def test_the_capture_probe_leaves_the_compiled_rope_compiled(monkeypatch: pytest.MonkeyPatch, counting_backend) -> None:
    """The probe before each capture runs the transformer stage under a TorchDispatchMode; a compiled rope
    called there by dynamo would be marked skipped for the rest of the process, and graphs captured after it
    would bake the eager rope while a stock reference before them used the compiled kernel. On the CPU the
    rope is compiled here with a backend that counts its calls: after the probes, a tick runs it compiled in
    all 8 layers, and the PCM equals stock's."""
    from duplexcadence.examples.personaplex import stock as stock_module
    from duplexcadence.interpreter.runtime.capture.graphs import probe_stage
    from duplexcadence.interpreter.runtime.session import call_in_session

    counting, compiled_calls = counting_backend
    rope = stock_module.apply_rope_interleaved
    # under moshi's torch_compile_lazy wrapper (the bare function when NO_TORCH_COMPILE is set)
    eager_rope = getattr(rope, "__wrapped__", rope)
    monkeypatch.setattr(stock_module, "apply_rope_interleaved", torch.compile(eager_rope, backend=counting))
    mimi = mimi_model.build_mimi(seed=1234)
    codes = mimi_model.random_codes(1, 2, seed=7)
    stock = PersonaPlexTail(mimi)
    server = PersonaPlexServerTail(mimi)
    session, runtime = server.session, server.runtime
    with torch.no_grad():
        main, _ = stock.step(codes[:, :, :1])
    assert len(compiled_calls) == 16  # both stock instances, 8 layers each
    for graph_plan in runtime.plan.capture.captured:  # capture_slot's probes (the CUDA capture aside)
        firing = runtime.first_firing[graph_plan.signature]
        for storage in session.storage.values():
            storage.fill_zero()
        call_in_session(session, runtime.program.stages[firing.stage].rng, probe_stage, session, firing)
    session.reset()
    before = len(compiled_calls)
    assert torch.equal(server.step(codes[:, :, :1])[0], main)
    assert len(compiled_calls) - before == 8


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("stock_graphs", [False, True], ids=["stock eager", "stock own transformer graphs"])
def test_gpu_graphs_for_every_stage_bit_identical(stock_graphs: bool) -> None:
    """Released size on CUDA, deterministic cuDNN: 6 graphs (the tokens' copy, the first and steady
    firing of upsample and SEANet, one transformer graph) captured per session slot, every firing replayed, both instances
    torch.equal to PersonaPlex stock for 130 ticks. Both sides share moshi's compile setting (the
    rope is compiled on both unless NO_TORCH_COMPILE is set)."""
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    with deterministic_cudnn(), torch.no_grad():
        mimi = mimi_model.build_mimi(seed=1234, device="cuda")
        codes = mimi_model.random_codes(1, FRAMES, seed=7).cuda()
        stock = PersonaPlexTail(mimi, graph_transformers=stock_graphs)
        tail = PersonaPlexCadenceTail(mimi, device="cuda")
        report = tail.runtime.report()
        # the 6 stage graphs of the plan are captured, fused into one graph per distinct tick (first, steady)
        distinct_ticks = len({tuple(f.signature for f in t.firings) for t in tail.runtime.templates})
        assert report.graphs_planned == 6 and report.stage_graphs_covered == 6
        assert report.graphs_captured == distinct_ticks == 2
        assert not report.blocked
        assert _mismatches(stock, tail, codes, FRAMES) == []
        report = tail.runtime.report()
        assert report.replays == 4 * 2 * FRAMES and report.eager_planned == 0 and report.eager_off_plan == 0


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("prune", [True, False], ids=["pruned", "both instances"])
def test_gpu_server_tail_bit_identical(prune: bool) -> None:
    """The clock as the server runs it on CUDA with graphs: the main PCM torch.equal to stock's for 130
    ticks; pruned, 6 graphs and 4 firings a tick, else 11 graphs and 7 firings."""
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    with deterministic_cudnn(), torch.no_grad():
        mimi = mimi_model.build_mimi(seed=1234, device="cuda")
        codes = mimi_model.random_codes(1, FRAMES, seed=7).cuda()
        stock = PersonaPlexTail(mimi, graph_transformers=True)
        server = PersonaPlexServerTail(mimi, device="cuda", prune=prune)
        mismatches = [
            t
            for t in range(FRAMES)
            if not torch.equal(server.step(codes[:, :, t : t + 1])[0], stock.step(codes[:, :, t : t + 1])[0])
        ]
        report = server.runtime.report()
    assert mismatches == []
    assert report.graphs_planned == (6 if prune else 11)
    assert report.replays == (4 if prune else 7) * FRAMES and report.eager_off_plan == 0


@pytest.mark.gpu
@cuda
def test_gpu_bench_subject_runs_and_is_bit_identical() -> None:
    """`dsl bench personaplex --device cuda` in miniature: every variant bit-identical to stock eager."""
    from duplexcadence.examples.personaplex.bench import subject
    from duplexcadence.interpreter import bench

    subj = subject(device="cuda", seconds=2, batch=1)
    results = bench.run(subj, int(subj.ticks_per_second * 2), progress=False)
    assert [r.name for r in results] == [
        "stock eager",
        "personaplex stock",
        "duplexcadence",
        "duplexcadence, 2 lanes",
        "duplexcadence, other_mimi pruned",
        "duplexcadence, both instances in one session",
    ]
    assert all(r.bit_identical for r in results), [(r.name, r.first_mismatch) for r in results]


LANE_FRAMES = 10


def _lanes_mismatches(device: str, frames: int) -> tuple[list, PersonaPlexCadenceTail]:
    mimi = mimi_model.build_mimi(seed=1234, device=device)
    codes = mimi_model.random_codes(1, frames, seed=7).to(device)
    stock = PersonaPlexTail(mimi)
    tail = PersonaPlexCadenceTail(mimi, device=device, lanes=2)
    assert (tail.main.lane, tail.other.lane) == (0, 1)
    return _mismatches(stock, tail, codes, frames), tail


def _mismatches(stock: PersonaPlexTail, tail: PersonaPlexCadenceTail, codes: torch.Tensor, frames: int) -> list:
    """(tick, instance, max abs difference) of every frame where the two tails' outputs differ."""
    mismatches = []
    for t in range(frames):
        frame = codes[:, :, t : t + 1]
        expected = stock.step(frame)
        actual = tail.step(frame)
        for name, a, b in zip(("main", "other"), actual, expected):
            if not torch.equal(a, b):
                mismatches.append((t, name, float((a - b).abs().max())))
    return mismatches


def test_two_lanes_step_both_instances_together_bit_identical_to_stock() -> None:
    """The two instances in two lanes, stepped by `Runtime.step_many` (on CPU: interleaved stage by stage)."""
    with torch.no_grad():
        mismatches, tail = _lanes_mismatches("cpu", LANE_FRAMES)
    assert mismatches == []
    report = tail.runtime.report()
    assert list(tail.runtime.program.stages) == ["audio_tokens", "mimi_upsample", "mimi_transformer", "mimi_seanet"]
    assert report.lanes == 2 and report.arena_bytes == 2 * report.session_bytes + 2 * report.scratch_bytes


@pytest.mark.gpu
@cuda
def test_gpu_two_lanes_concurrent_streams_bit_identical() -> None:
    """Both instances' graphs replayed on two CUDA streams by `step_many`: torch.equal to stock for 130 ticks."""
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    with deterministic_cudnn(), torch.no_grad():
        mismatches, tail = _lanes_mismatches("cuda", FRAMES)
    assert mismatches == []
    report = tail.runtime.report()
    stages = list(tail.runtime.program.stages)  # audio_tokens and mimi's three; other_mimi's are pruned
    assert stages == ["audio_tokens", "mimi_upsample", "mimi_transformer", "mimi_seanet"]
    assert report.replays == len(stages) * 2 * FRAMES and report.eager_planned == 0 and report.eager_off_plan == 0


LOCKSTEP_FRAMES = 130


def _lockstep_vs_reproduction_at_batch_2(device: str, frames: int) -> tuple[list, list, PersonaPlexCadenceTail]:
    """(frames where a row differs from PersonaPlex's decode at B=2, frames where it differs from the
    batch-1 stock instances, the tail): the instances as the rows of one B=2 session."""
    from duplexcadence.examples.personaplex.stock import PersonaPlexMimiDecoder

    mimi = mimi_model.build_mimi(seed=1234, device=device)
    codes = mimi_model.random_codes(1, frames, seed=7).to(device)
    batched = PersonaPlexMimiDecoder(mimi, 2, graph_transformer=False)
    stock = PersonaPlexTail(mimi)
    tail = PersonaPlexCadenceTail(mimi, device=device, lockstep=True)
    against_batch_2, against_stock = [], []
    for t in range(frames):
        frame = codes[:, :, t : t + 1]
        expected = batched.decode(torch.cat([frame, frame]))
        solo = stock.step(frame)
        for row, (name, actual) in enumerate(zip(("main", "other"), tail.step(frame))):
            if not torch.equal(actual, expected[row : row + 1]):
                against_batch_2.append((t, name))
            if not torch.equal(actual, solo[row]):
                against_stock.append((t, name))
    return against_batch_2, against_stock, tail


def test_lockstep_decodes_both_instances_as_the_rows_of_one_batch_2_session() -> None:
    """`lockstep=True`: one B=2 session, one step per tick; each row is PersonaPlex's own decode at B=2
    (past the ring's wrap). Equality with the batch-1 instances is not promised (other kernels may be
    chosen at B=2); the GPU benchmark measures it."""
    with torch.no_grad():
        against_batch_2, _, tail = _lockstep_vs_reproduction_at_batch_2("cpu", LOCKSTEP_FRAMES)
    assert against_batch_2 == []
    report = tail.runtime.report()
    assert report.sessions == 1 and tail.group.session.counters.steps == LOCKSTEP_FRAMES
    tail.close()


def test_lockstep_members_cannot_join_late_since_the_old_offsets_are_shared_by_the_batch() -> None:
    from duplexcadence.interpreter.runtime.lockstep import LockstepError, LockstepGroup

    group = LockstepGroup(load_runtime(mimi_model.build_mimi(seed=1234), 2))
    member = group.join()
    with torch.no_grad():
        group.step({member: mimi_model.random_codes(1, 1, seed=7)})
    with pytest.raises(LockstepError) as error:
        group.join()
    shared = ", ".join(
        [f"kv_end[{i}]" for i in range(8)] + [f"rope_offset[{i}]" for i in range(8)] + ["transformer_offset"]
    )
    assert str(error.value) == (
        f"a member cannot join at instant 1: region(s) {shared} are shared by all rows (no dimension is 'B'), "
        "so one row cannot start over alone; members join at the group's start"
    )
    with pytest.raises(ValueError, match=r"it takes batch_size=1 and lanes=1, not 1 and 2"):
        PersonaPlexCadenceTail(mimi_model.build_mimi(seed=1234), lanes=2, lockstep=True)


@pytest.mark.gpu
@cuda
def test_gpu_lockstep_rows_equal_the_batch_2_decode() -> None:
    """On CUDA with graphs: the rows equal PersonaPlex's B=2 decode; the count of frames that differ from the
    batch-1 stock instances is printed (measured, not asserted)."""
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    with deterministic_cudnn(), torch.no_grad():
        against_batch_2, against_stock, tail = _lockstep_vs_reproduction_at_batch_2("cuda", LOCKSTEP_FRAMES)
    assert against_batch_2 == []
    print(f"lockstep rows vs batch-1 stock: {len(against_stock)} of {2 * LOCKSTEP_FRAMES} frames differ")
    assert tail.runtime.report().eager_off_plan == 0
