"""The transformers VibeVoice decoder at a toy size (duplexcadence.examples.toy.hf_decoder) on one device: its stock
loop and DuplexCadence with its shipped `.clock` (no hook, no factory), every frame compared with `torch.equal`.

    python scripts/hf_decoder_gpu.py --device cuda --frames 300 --out hf_decoder_gpu.json
    python scripts/hf_decoder_gpu.py --device cpu --frames 8 --out /tmp/hf_decoder.json  # smoke

The comparison runs twice: under the process's own cuDNN settings (as the stock loop runs: `runtime.verify`'s
default) and under deterministic cuDNN (`verify(..., deterministic=True)`). Then each side decodes the frames
again, one frame a step, timed per frame with CUDA events on CUDA (the host clock elsewhere), the first
`--warmup` frames left out: the median and p90 milliseconds per frame. The JSON also gives the runtime's
graphs (planned, captured, replays, eager firings) and the environment. Exit status 0 when both comparisons
are equal on every frame, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from duplexcadence.examples.toy.hf_decoder import DecoderStockStream, build_decoder, make_latents
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = Path(__file__).resolve().parents[1] / "examples" / "toy" / "hf_decoder.clock"


def timed(step, frames: int, device: torch.device) -> list[float]:
    """Milliseconds of each of `frames` calls of `step(t)`."""
    times = []
    for t in range(frames):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(t)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            step(t)
            times.append((time.perf_counter() - began) * 1000)
    return times


def summary(times: list[float], warmup: int) -> dict:
    kept = sorted(times[warmup:]) or sorted(times)
    return {"median_ms": statistics.median(kept), "p90_ms": kept[int(0.9 * (len(kept) - 1))], "frames": len(kept)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20, help="frames left out of the timings")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "hf_decoder_gpu.json"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model = build_decoder(device=device)
    latents = make_latents(args.frames, seed=3, device=device)

    def feed(t: int) -> dict:
        return {"latents": latents[:, t : t + 1]}

    began = time.perf_counter()
    runtime = Runtime.load(CLOCK, model, device=device, sessions=2)
    load_s = time.perf_counter() - began
    reports = {
        mode: runtime.verify(DecoderStockStream(model), feed, ticks=args.frames, deterministic=mode == "deterministic")
        for mode in ("stock settings", "deterministic")
    }
    stock = DecoderStockStream(model)
    session = runtime.session()
    with torch.no_grad():
        stock_times = timed(lambda t: stock.step(**feed(t)), args.frames, device)
    runtime_times = timed(lambda t: session.step(**feed(t)), args.frames, device)
    report = runtime.report()
    result = {
        "command": "python scripts/hf_decoder_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": {
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        },
        "frames": args.frames,
        "equal": {mode: r.equal for mode, r in reports.items()},
        "first_mismatch": {mode: str(r) for mode, r in reports.items() if not r.equal},
        "stock": summary(stock_times, args.warmup),
        "duplexcadence": summary(runtime_times, args.warmup),
        "load_s": load_s,
        "graphs": {
            "planned": report.graphs_planned,
            "stage_graphs_covered": report.stage_graphs_covered,
            "captured": report.graphs_captured,
            "capture_s": report.capture_seconds,
            "replays": report.replays,
            "eager_planned": report.eager_planned,
            "eager_off_plan": report.eager_off_plan,
            "blocked": [d.message for d in report.blocked],
        },
    }
    result["speedup"] = result["stock"]["median_ms"] / max(result["duplexcadence"]["median_ms"], 1e-9)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("equal", "stock", "duplexcadence", "speedup")}))
    return 0 if all(result["equal"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
