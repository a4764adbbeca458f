"""Graph capture and device memory (GPU only): no cuBLAS workspace outlives a capture outside its graphs'
pool, two runtimes' graphs interleaved on one device, one of them dropped half-way, stay `torch.equal` to
their stock loops with tensors allocated around them untouched, and the report's reserved bytes.

PyTorch keeps a cuBLAS workspace per (handle, stream) and a graph bakes in the one its capture used; it
frees a stream's workspaces when a graph captured on that stream is destroyed (torch >= 2.11). A graph whose
workspace lived outside its own pool would then replay into memory the allocator hands out again: the guard
tensors below take every block the allocator has cached, and the second runtime keeps replaying after the
first one (whose capture stream it shares) is gone.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.bench.memory import cublas_workspace_bytes
from duplexcadence.interpreter.runtime.runtime import Runtime

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
PROMPT, WINDOW, TICKS = 6, 20, 60
SIZES = ({"C": 512, "H": 4}, {"C": 1024, "H": 8})
"""Two toys wide enough for cuBLAS to choose kernels that use its workspace (a 1 x C by C x C product)."""


def toy(params: dict[str, int], seed: int):
    model = build_toy(seed=seed, device="cuda", channels=params["C"], heads=params["H"])
    runtime = Runtime.load(CLOCK, model, params=params, device="cuda")
    prompt = make_prompt(model, PROMPT).to("cuda")
    stock = ToyStockStream(build_toy(seed=seed, device="cuda", channels=params["C"], heads=params["H"]), prompt, WINDOW)
    return runtime, prompt, stock


def codes(seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (1, TICKS), generator=torch.Generator().manual_seed(seed)).to("cuda")


@pytest.fixture(autouse=True)
def deterministic_cudnn():
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn as scope

    with scope():
        yield


def test_a_capture_leaves_no_cublas_workspace_allocated_beside_the_eager_one():
    workspace = cublas_workspace_bytes(torch.device("cuda"))  # the caller's stream holds one from here on
    assert workspace
    runtime, prompt, _ = toy(SIZES[1], seed=0)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    session = runtime.session(initial={"cache": prompt})
    torch.cuda.synchronize()
    # the warm-up ran cuBLAS on the caller's stream and every capture on the lane's: neither workspace is held
    # now (the capture's is free in the graphs' pool, the caller's stream allocates its own again when next used)
    assert torch.cuda.memory_allocated() - before < workspace
    report = runtime.report()
    assert report.graphs_captured > 0 and not runtime.blocked
    assert report.graph_pool_bytes >= workspace  # the capture's workspace lives in the pool, with its working memory
    assert report.arena_reserved_bytes == runtime.plan.arena.reserved_bytes(1) >= report.arena_bytes
    session.close()


def test_two_runtimes_interleaved_and_one_dropped_stay_equal_to_stock_and_touch_nothing_else():
    first, first_prompt, first_stock = toy(SIZES[0], seed=1)
    second, second_prompt, second_stock = toy(SIZES[1], seed=2)
    a = first.session(initial={"cache": first_prompt}, seed=5)
    b = second.session(initial={"cache": second_prompt}, seed=6)
    streams = {"a": codes(11), "b": codes(12)}
    guards = take_cached_blocks()
    got: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    with torch.random.fork_rng(devices=[torch.device("cuda")]):
        for tick in range(TICKS):
            if tick == TICKS // 2:  # the first runtime goes: its graphs are destroyed, its pool released
                a.close()
                del a, first
                gc.collect()
                torch.cuda.synchronize()
                guards += take_cached_blocks()  # what the released pool gave back among them
            if tick < TICKS // 2:
                got["a"].append(a.step(codes=streams["a"][:, tick : tick + 1]).clone())
            got["b"].append(b.step(codes=streams["b"][:, tick : tick + 1]).clone())
    torch.cuda.synchronize()
    assert all(bool((guard == 7.0).all()) for guard in guards)
    for name, stock, session_seed, ticks in (("a", first_stock, 5, TICKS // 2), ("b", second_stock, 6, TICKS)):
        expected = _stock_outputs(stock, streams[name], session_seed, ticks)
        for tick, (mine, theirs) in enumerate(zip(got[name], expected, strict=True)):
            assert torch.equal(mine, theirs), f"runtime {name}, tick {tick}"
    assert second.report().replays > 0 and second.report().eager_off_plan == 0


def take_cached_blocks() -> list[torch.Tensor]:
    """Guard tensors of a known value (7.0) in every block the allocator holds free outside the graphs'
    pools, largest first: memory a graph would write into if its workspace had been freed there."""
    torch.cuda.synchronize()
    sizes = [
        block["size"]
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment.get("segment_pool_id", (0, 0))) == (0, 0)
        for block in segment["blocks"]
        if block["state"] == "inactive" and block["size"] >= 512
    ]
    return [torch.full((size // 4,), 7.0, device="cuda") for size in sorted(sizes, reverse=True)]


def _stock_outputs(stock: ToyStockStream, stream: torch.Tensor, seed: int, ticks: int) -> list[torch.Tensor]:
    """The stock loop's outputs for `stream`, drawing from the generator state a session of `seed` starts
    with (as `Runtime.verify` seeds its stock side)."""
    from duplexcadence.interpreter.runtime.rng import seeded_rng_state, set_rng_state

    device = torch.device("cuda")
    with torch.random.fork_rng(devices=[device]):
        set_rng_state(device, seeded_rng_state(seed, device))
        return [stock.step(codes=stream[:, tick : tick + 1]).clone() for tick in range(ticks)]


def test_two_tails_graphs_interleaved_and_the_first_dropped_stay_equal_to_stock():
    """The toy and Qwen3-Omni's Code2Wav (released size, bf16: its `dsl bench` subject) on one device, their
    sessions stepped in turn; the toy's runtime, which captured first on the capture stream they share, is
    dropped half-way, its graphs destroyed and its pool released, and Code2Wav's keep replaying: every output
    `torch.equal` to its stock loop's, the tensors in every block the allocator held untouched."""
    pytest.importorskip("transformers")
    from duplexcadence.interpreter import tails

    device = torch.device("cuda")
    rounds, per_round = 6, 12  # Code2Wav's 1 s chunks, and 12 toy frames beside each
    subjects = {
        "toy": tails.get("toy").subject.resolve()(device=device, seconds=rounds),
        "qwen3omni": tails.get("qwen3omni").subject.resolve()(device=device, seconds=rounds, dtype="bf16"),
    }
    ticks = {"toy": rounds * per_round, "qwen3omni": rounds}
    expected = {name: _subject_outputs(subject, "stock eager", ticks[name]) for name, subject in subjects.items()}
    runners = {name: _made(subject, "duplexcadence") for name, subject in subjects.items()}
    guards = take_cached_blocks()
    got: dict[str, list] = {name: [] for name in subjects}
    for round_ in range(rounds):
        if round_ == rounds // 2:
            dropped = runners.pop("toy")
            close = getattr(dropped, "close", None)
            if callable(close):
                close()
            del dropped, close
            gc.collect()
            guards += take_cached_blocks()
        if "toy" in runners:
            for tick in range(round_ * per_round, (round_ + 1) * per_round):
                got["toy"].append(_cloned(runners["toy"].step(**subjects["toy"].inputs(tick))))
        got["qwen3omni"].append(_cloned(runners["qwen3omni"].step(**subjects["qwen3omni"].inputs(round_))))
    torch.cuda.synchronize()
    assert all(bool((guard == 7.0).all()) for guard in guards)
    assert len(got["toy"]) == rounds // 2 * per_round and len(got["qwen3omni"]) == rounds
    for name, outputs in got.items():
        for tick, (mine, theirs) in enumerate(zip(outputs, expected[name])):
            assert torch.equal(mine, theirs), f"{name}, tick {tick}"


def _made(subject, name: str):
    runner = next(variant for variant in subject.variants if variant.name == name).make()
    runner.reset()
    return runner


def _cloned(output):
    return output["output"].clone() if isinstance(output, dict) else output.clone()


def _subject_outputs(subject, name: str, ticks: int) -> list[torch.Tensor]:
    """`ticks` outputs of the subject's variant `name`, which is then closed."""
    runner = _made(subject, name)
    outputs = [_cloned(runner.step(**subject.inputs(tick))) for tick in range(ticks)]
    close = getattr(runner, "close", None)
    if callable(close):
        close()
    return outputs
