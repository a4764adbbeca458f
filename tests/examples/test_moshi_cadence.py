"""Moshi's Mimi decoder tail on DuplexCadence vs moshi 0.2.13's own streaming decode.

CPU, released size, B=1, no reduced config: 130 frames (the 250-step KV rings wrap at frame 125),
every frame `torch.equal` to moshi's eager decode; the state moshi keeps lives in the arena at
stable addresses. GPU tests (marked `gpu`) capture the three stages' graphs and compare with moshi's
eager run of the same op set (compiled rope on both sides, or eager on both with NO_TORCH_COMPILE=1).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moshi")

from duplexcadence.examples.moshi import model as mimi_model  # noqa: E402
from duplexcadence.examples.moshi import state  # noqa: E402
from duplexcadence.examples.moshi.cadence import load_runtime  # noqa: E402
from duplexcadence.examples.moshi.stock import MoshiStockDecoder  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

FRAMES = 130
RESET_FRAMES = 4


@dataclasses.dataclass
class Run:
    mismatches: list[int]
    region_pointers: list[dict[str, int]]
    state_pointers: list[dict[str, int]]
    bound_paths: dict[str, str]
    reset_mismatches: list[int]
    region_pointers_after_reset: dict[str, int]
    state_pointers_after_reset: dict[str, int]
    arena: tuple[int, int]


def _state_pointers(mimi) -> dict[str, int]:
    return {entry.path: entry.tensor.data_ptr() for entry in state.decode_state_tensors(mimi)}


@pytest.fixture(scope="module")
def run() -> Run:
    codes = mimi_model.random_codes(1, FRAMES, seed=7)
    mimi = mimi_model.build_mimi(seed=1234)
    runtime = load_runtime(mimi, 1)
    session = runtime.session()
    mismatches, region_pointers, state_pointers, stock_first = [], [], [], []
    with torch.no_grad(), MoshiStockDecoder(mimi_model.build_mimi(seed=1234), 1, mode="eager") as stock:
        for t in range(FRAMES):
            frame = codes[:, :, t : t + 1]
            expected = stock.step(frame)
            actual = session.step(codes=frame)
            if not torch.equal(expected, actual):
                mismatches.append(t)
            if t < RESET_FRAMES:
                stock_first.append(expected.clone())
            region_pointers.append(session.data_ptrs())
            state_pointers.append(_state_pointers(mimi))
        session.reset()
        after_reset = session.data_ptrs()
        reset_mismatches = [
            t
            for t in range(RESET_FRAMES)
            if not torch.equal(session.step(codes=codes[:, :, t : t + 1]), stock_first[t])
        ]
    bound = {region.bind: name for name, region in runtime.program.regions.items() if region.bind}
    buffer = runtime.arena.buffer
    return Run(
        mismatches,
        region_pointers,
        state_pointers,
        bound,
        reset_mismatches,
        after_reset,
        _state_pointers(mimi),
        (buffer.data_ptr(), buffer.data_ptr() + buffer.numel()),
    )


def test_bit_identical_to_moshi_eager_every_frame(run: Run) -> None:
    assert run.mismatches == []
    assert run.reset_mismatches == []


def test_region_addresses_stable_across_ticks_and_reset(run: Run) -> None:
    first = run.region_pointers[0]
    assert all(pointers == first for pointers in run.region_pointers)
    assert run.region_pointers_after_reset == first


def test_every_carried_state_tensor_is_a_region_at_a_stable_address(run: Run) -> None:
    """moshi's decode state tensors that carry values (88 minus the 38 exec masks, 10 unused `first`
    flags and 4 zero-size carries = 36) are bound: each is its region's view, inside the arena."""
    low, high = run.arena
    assert len(run.bound_paths) == 36
    unbound = set(run.state_pointers[0]) - set(run.bound_paths)
    assert all(p.endswith(("exec_mask", "first", "block.3._streaming_state.previous")) for p in unbound)
    assert len(unbound) == 88 - 36
    for pointers, regions in zip(run.state_pointers, run.region_pointers):
        for path, region in run.bound_paths.items():
            assert pointers[path] == regions[region] and low <= pointers[path] < high, path
    assert all(p == run.state_pointers[0] for p in run.state_pointers)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
def test_gpu_graphs_for_three_stages_bit_identical() -> None:
    """Released size on CUDA, deterministic cuDNN, 130 frames: 3 stage graphs captured, every firing a
    replay, every frame torch.equal to moshi's eager decode of the same op set (`eager_compiled_rope`
    when moshi compiles its rope, `eager` under NO_TORCH_COMPILE=1)."""
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    mode = "eager_compiled_rope" if mimi_model.moshi_torch_compile_enabled() else "eager"
    with deterministic_cudnn(), torch.no_grad():
        codes = mimi_model.random_codes(1, FRAMES, seed=7).cuda()
        runtime = load_runtime(mimi_model.build_mimi(seed=1234, device="cuda"), 1, device="cuda")
        session = runtime.session()
        report = runtime.report()
        # the 3 stage graphs of the plan are captured, fused into one graph per frame
        assert report.graphs_planned == 3 and report.stage_graphs_covered == 3 and report.graphs_captured == 1
        assert not report.blocked
        mismatches = []
        with MoshiStockDecoder(mimi_model.build_mimi(seed=1234, device="cuda"), 1, mode=mode) as stock:
            for t in range(FRAMES):
                frame = codes[:, :, t : t + 1]
                expected, actual = stock.step(frame), session.step(codes=frame)
                if not torch.equal(expected, actual):
                    mismatches.append((t, float((expected - actual).abs().max())))
        assert mismatches == []
        report = runtime.report()
        assert report.replays == 3 * FRAMES and report.eager_planned == 0 and report.eager_off_plan == 0


@pytest.mark.gpu
@cuda
def test_gpu_bench_subject_duplexcadence_bit_identical() -> None:
    """`dsl bench moshi --device cuda` in miniature: the DuplexCadence variant equals stock eager."""
    from duplexcadence.examples.moshi.bench import subject
    from duplexcadence.interpreter import bench

    subj = subject(device="cuda", seconds=2, batch=1)
    results = bench.run(subj, int(subj.ticks_per_second * 2), progress=False)
    cadence = next(r for r in results if r.name == "duplexcadence")
    assert cadence.bit_identical, cadence.first_mismatch
