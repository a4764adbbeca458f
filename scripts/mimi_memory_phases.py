"""Peak allocated memory of each phase of setting up and running a Mimi decode, DuplexCadence against moshi's
whole-step graph (diagnostic, not a benchmark): build, streaming state, runtime load, capture, steps.

    source scripts/device_setup.sh
    python scripts/mimi_memory_phases.py
"""

import gc

import torch

from duplexcadence.examples.moshi.cadence import load_runtime
from duplexcadence.examples.moshi.model import build_mimi, random_codes
from duplexcadence.examples.moshi.stock import MoshiStockDecoder

MIB = 2**20


class Phases:
    def __init__(self, side: str):
        self.side = side
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()

    def mark(self, phase: str) -> None:
        torch.cuda.synchronize()
        now = torch.cuda.memory_allocated() - self.base
        peak = torch.cuda.max_memory_allocated() - self.base
        print(f"{self.side:12s} {phase:34s} allocated {now / MIB:8.1f} MiB   peak so far {peak / MIB:8.1f} MiB")


def main() -> None:
    torch.backends.cudnn.deterministic = True
    codes = random_codes(1, 200, seed=3).cuda()
    with torch.no_grad():
        phases = Phases("moshi graph")
        stock = MoshiStockDecoder(build_mimi(device="cuda"), 1, mode="graphed_compiled_rope")
        phases.mark("built + streaming")
        for t in range(3):
            stock.step(codes[:, :, t : t + 1])
            phases.mark(f"step {t}")
        for t in range(3, 160):
            stock.step(codes[:, :, t : t + 1])
        phases.mark("160 steps")
        del stock
        phases = Phases("duplexcadence")
        mimi = build_mimi(device="cuda")
        phases.mark("built")
        runtime = load_runtime(mimi, 1, device="cuda")
        phases.mark("runtime loaded (streaming, arena)")
        session = runtime.session()
        phases.mark("session (graphs captured)")
        for t in range(3):
            session.step(codes=codes[:, :, t : t + 1])
            phases.mark(f"step {t}")
        for t in range(3, 160):
            session.step(codes=codes[:, :, t : t + 1])
        phases.mark("160 steps")
        snapshot = torch.cuda.memory_snapshot()
        blocks = sorted(
            (
                (b["size"], s["stream"], s["segment_type"])
                for s in snapshot
                for b in s["blocks"]
                if b["state"] == "active_allocated"
            ),
            reverse=True,
        )[:12]
        print("largest live blocks (bytes, stream, segment):", blocks)


if __name__ == "__main__":
    main()
