"""Where a DuplexCadence Mimi step spends its time, against moshi's whole-step graph (diagnostic, not a benchmark).

Per frame, median over 100 steady frames, in one process: the host time of a step (no synchronisation),
the synchronised time of a step, the same for a bare replay of our fused graph after feeding the codes,
and for moshi's `CUDAGraphed` around the whole `decode`; then the step's host path under cProfile.

    source scripts/device_setup.sh
    python scripts/mimi_overhead.py
"""

import cProfile
import pstats
import time

import torch

from duplexcadence.examples.moshi.cadence import load_runtime
from duplexcadence.examples.moshi.model import build_mimi, random_codes
from duplexcadence.examples.moshi.stock import MoshiStockDecoder


def median_us(step, first: int, frames: int = 100, synced: bool = True) -> float:
    torch.cuda.synchronize()  # nothing queued before the first frame: a full launch queue blocks the host
    times = []
    for t in range(first, first + frames):
        if synced:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(t)
        if synced:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return sorted(times)[frames // 2] * 1e6


def main() -> None:
    torch.backends.cudnn.deterministic = True
    session = load_runtime(build_mimi(device="cuda"), 1, device="cuda").session()
    stock = MoshiStockDecoder(build_mimi(device="cuda"), 1, mode="graphed_compiled_rope")
    codes = random_codes(1, 800, seed=3).cuda()
    ours = lambda t: session.step(codes=codes[:, :, t : t + 1])  # noqa: E731
    theirs = lambda t: stock.step(codes[:, :, t : t + 1])  # noqa: E731
    with torch.no_grad():
        for t in range(150):
            ours(t)
            theirs(t)
        graph = next(iter(session.graphs.values())).graph
        # The codes' scratch bytes are reused by later stages' scratch regions within the instant (the arena
        # shares scratch by liveness), so every bare replay is fed valid codes first, as a step feeds them.
        feed = session.storage["codes"].view(1)

        def bare(t):
            feed.copy_(codes[:, :, t : t + 1])
            graph.replay()

        rows = [("duplexcadence step", ours), ("bare fused replay + feed", bare), ("moshi whole-step graph", theirs)]
        first = 150
        host = {name: median_us(step, first + 30 * i, frames=30, synced=False) for i, (name, step) in enumerate(rows)}
        first += 90
        # Synchronised frames interleaved (one of each row in turn), so that clock drift is shared by the rows.
        synced: dict[str, list[float]] = {name: [] for name, _ in rows}
        for t in range(first, first + 200):
            for name, step in rows:
                torch.cuda.synchronize()
                start = time.perf_counter()
                step(t)
                torch.cuda.synchronize()
                synced[name].append(time.perf_counter() - start)
        first += 200
        print(f"{'per frame, median us':28s} {'host':>8s} {'synced':>8s}")
        for name, _ in rows:
            print(f"{name:28s} {host[name]:8.1f} {sorted(synced[name])[100] * 1e6:8.1f}")
        profiler = cProfile.Profile()
        profiler.enable()
        for t in range(first, first + 200):
            ours(t)
            torch.cuda.synchronize()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
