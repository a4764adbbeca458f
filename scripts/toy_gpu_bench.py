"""Toy tail on the GPU: stock eager vs DuplexCadence (graphs), ms per tick, same process."""

import json
import time
from pathlib import Path

import torch

from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.runtime.runtime import Runtime

torch.backends.cudnn.deterministic = True
clock = Path(__file__).resolve().parents[1] / "examples" / "toy" / "toy.clock"
model = build_toy(device="cuda")
prompt = make_prompt(model, 6).cuda()
stock = ToyStockStream(build_toy(device="cuda"), prompt, 20)
rt = Runtime.load(clock, model, device="cuda")
t0 = time.perf_counter()
session = rt.session(initial={"cache": prompt})
capture = time.perf_counter() - t0
codes = torch.randint(0, 64, (1, 400), device="cuda")


def run(fn, n=400):
    times = []
    for t in range(n):
        torch.cuda.synchronize()
        s = time.perf_counter()
        fn(codes[:, t : t + 1])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - s) * 1000)
    steady = sorted(times[100:])
    return steady[len(steady) // 2]


with torch.no_grad():
    stock.reset()
    stock_ms = run(lambda c: stock.step(c))
    cadence_ms = run(lambda c: session.step(codes=c))
print(
    json.dumps(
        {
            "toy_stock_ms_per_tick": stock_ms,
            "toy_cadence_ms_per_tick": cadence_ms,
            "speedup": stock_ms / cadence_ms,
            "capture_s": capture,
            "graphs": rt.report().graphs_captured,
        }
    )
)
print(rt.report())
