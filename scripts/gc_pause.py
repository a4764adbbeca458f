"""What a full garbage collection costs over a loaded pool, with and without the pool's freeze.

A pool holds its model, runtime and graphs for as long as it serves; Python's cyclic collector walks every
tracked object on each full collection, holding the GIL, so every thread of the server (the event loop, the
device thread, the lanes) waits for it. `PoolConfig.freeze_gc` (the default) moves what is alive once the
pool has started out of the collector's generations. This loads a pool of TAIL with the freeze off, then
times full collections (`gc.collect()`) as they are, and again after `gc.freeze()`, alternating.

    python scripts/gc_pause.py --tail moshi --device cpu
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.tail import served_tail


def collection_ms() -> float:
    started = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - started) * 1000


async def measure(tail: str, device: str, repeats: int) -> None:
    pool = SessionPool(served_tail(tail, device=device), PoolConfig(tick_model=TickModel(0, 0), freeze_gc=False))
    await pool.start()
    try:
        tracked = len(gc.get_objects())
        unfrozen, frozen = [], []
        for _ in range(repeats):
            unfrozen.append(collection_ms())
            gc.freeze()
            frozen.append(collection_ms())
            gc.unfreeze()
        print(f"a pool of '{tail}' on {device}: {tracked} objects tracked by the collector")
        print(
            f"full collection, median of {repeats}: {statistics.median(unfrozen):.1f} ms as loaded, "
            f"{statistics.median(frozen):.3f} ms frozen"
        )
    finally:
        await pool.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tail", default="moshi")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(measure(args.tail, args.device, args.repeats))


if __name__ == "__main__":
    main()
