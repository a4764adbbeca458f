"""Decode N seconds of random codes with moshi's stock Mimi loop and with DuplexCadence; compare every frame.

    python -m duplexcadence.examples.moshi.infer [--device cuda] [--seconds N] [--batch B] [--no-compile]

Both sides build Mimi at its released size with the same seeded weights and decode the same codes,
one 80 ms frame per tick. Stock is moshi 0.2.13's streaming decode, by default with its CUDA graphs off (mode
`eager_compiled_rope`: every kernel from Python, rope compiled as shipped on CUDA; `--stock-mode stock`
runs it as shipped, with moshi's own graphs); DuplexCadence is
`stdlib/models/mimi_decoder.clock` bound to the model (per-stage CUDA graphs on CUDA). Every output
frame is compared with `torch.equal` (cuDNN deterministic). Printed per side: set-up time, ms per
frame and per second of audio (median, p90), the state and peak memory. The default (11 s = 137
frames, past the KV ring's wrap at frame 125) takes a minute or two on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.bench import fresh_peak, sync

FRAMES_PER_SECOND = 12.5


@attrs.define
class SideResult:
    """One side's run: its outputs (on CPU), per-frame wall times, set-up time and memory."""

    name: str
    outputs: list[Any]
    frame_ms: list[float]
    setup_s: float
    state_bytes: int | None
    peak_bytes: int | None
    note: str = ""


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return tuple(_on_cpu(v) for v in value)


def run_side(
    name: str,
    device: torch.device,
    make: Callable[[], Any],
    step: Callable[[Any, torch.Tensor], Any],
    state_bytes: Callable[[Any], int | None],
    codes: torch.Tensor,
) -> SideResult:
    """Build with `make()`, then decode every frame of `codes` [B, K, T] with `step(runner, frame)`."""
    base = fresh_peak(device)
    started = time.perf_counter()
    runner = make()
    sync(device)
    setup = time.perf_counter() - started
    outputs, frame_ms = [], []
    with torch.no_grad():
        for t in range(codes.shape[-1]):
            frame = codes[:, :, t : t + 1]
            sync(device)
            begin = time.perf_counter()
            output = step(runner, frame)
            sync(device)
            frame_ms.append((time.perf_counter() - begin) * 1000)
            outputs.append(_on_cpu(output))
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
    result = SideResult(name, outputs, frame_ms, setup, state_bytes(runner), peak)
    del runner
    return result


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def report(sides: list[SideResult], device: torch.device, frames_per_tick: int = 1) -> None:
    """Print timing and memory per side (ms per second of audio counts every instance of a tick)."""
    print(f"{'side':<16} {'setup s':>8} {'ms/tick':>9} {'p90':>7} {'ms/s audio':>11} {'state':>11} {'peak alloc':>11}")
    for side in sides:
        steady = side.frame_ms[1:] or side.frame_ms
        median = statistics.median(steady)
        p90 = sorted(steady)[max(0, int(0.9 * len(steady)) - 1)]
        print(
            f"{side.name:<16} {side.setup_s:>8.2f} {median:>9.2f} {p90:>7.2f} "
            f"{median * FRAMES_PER_SECOND:>11.1f} {_mib(side.state_bytes):>11} {_mib(side.peak_bytes):>11}"
            + (f"  {side.note}" if side.note else "")
        )
    if device.type != "cuda":
        print(f"process max RSS (both sides, CPU): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print(
        "ms/tick: wall time of one tick (first excluded); ms/s audio = ms/tick x 12.5 ticks"
        + (f"; one tick decodes {frames_per_tick} instances" if frames_per_tick > 1 else "")
    )


def compare(expected: list[Any], actual: list[Any], names: tuple[str, ...] = ("pcm",)) -> list[str]:
    """Every output frame `torch.equal`? Returns one line per differing frame and output."""
    problems = []
    for t, (a, b) in enumerate(zip(expected, actual)):
        a = a if isinstance(a, tuple) else (a,)
        b = b if isinstance(b, tuple) else (b,)
        for name, x, y in zip(names, a, b):
            if x.shape != y.shape or not torch.equal(x, y):
                diff = float((x - y).abs().max()) if x.shape == y.shape else float("nan")
                problems.append(f"frame {t} {name}: max abs diff {diff:.3g}")
    return problems


def parse_args(
    description: str, argv: list[str] | None, extra: list[tuple[str, dict]] | None = None
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--seconds",
        type=float,
        default=11.0,
        help="seconds of audio (12.5 frames each); default 11 passes the KV ring's wrap",
    )
    parser.add_argument("--batch", type=int, default=1, help="streams decoded together (B)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--no-compile", action="store_true", help="set NO_TORCH_COMPILE (moshi's rope eager on CUDA), on both sides"
    )
    for flag, options in extra or []:
        parser.add_argument(flag, **options)
    return parser.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.Tensor, bool]:
    """Fix moshi's compile switch (before moshi is imported), the device, and the codes."""
    from duplexcadence.examples.moshi.model import configure_torch_compile, moshi_torch_compile_enabled, random_codes

    if args.no_compile:  # otherwise the environment decides (NO_TORCH_COMPILE=1 works as well)
        configure_torch_compile(False)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    frames = max(1, round(args.seconds * FRAMES_PER_SECOND))
    codes = random_codes(args.batch, frames, seed=args.seed + 1).to(device)
    return device, codes, device.type == "cuda" and moshi_torch_compile_enabled()


def main(argv: list[str] | None = None) -> int:
    modes = ("eager_compiled_rope", "stock", "eager", "graphed", "graphed_compiled_rope")
    args = parse_args(
        "Mimi (moshi 0.2.13): stock streaming decode vs DuplexCadence, frame by frame.",
        argv,
        [
            (
                "--stock-mode",
                {
                    "default": "eager_compiled_rope",
                    "choices": modes,
                    "help": "moshi loop variant (default: its graphs off, the bit-identity "
                    "reference; 'stock' = as shipped)",
                },
            )
        ],
    )
    device, codes, compiled = setup(args)
    from duplexcadence.examples.moshi.cadence import load_runtime
    from duplexcadence.examples.moshi.model import build_mimi
    from duplexcadence.examples.moshi.state import state_bytes
    from duplexcadence.examples.moshi.stock import MoshiStockDecoder

    print(
        f"Mimi decoder, released size, fp32, 8 codebooks, B={args.batch}, {codes.shape[-1]} frames "
        f"({codes.shape[-1] / FRAMES_PER_SECOND:g} s) on {device}, rope {'compiled' if compiled else 'eager'}"
    )
    stock = run_side(
        "moshi stock",
        device,
        lambda: MoshiStockDecoder(build_mimi(args.seed, device), args.batch, mode=args.stock_mode),
        lambda runner, frame: runner.step(frame),
        lambda runner: state_bytes(runner.mimi),
        codes,
    )
    stock.note = f"mode {args.stock_mode}"

    def make_cadence():
        runtime = load_runtime(build_mimi(args.seed, device), args.batch, device=device)
        return runtime, runtime.session()

    cadence = run_side(
        "duplexcadence",
        device,
        make_cadence,
        lambda runner, frame: runner[1].step(codes=frame),
        lambda runner: runner[0].report().arena_bytes,
        codes,
    )
    cadence.note = "graphs per stage" if device.type == "cuda" else "eager (no graphs on CPU)"
    report([stock, cadence], device)
    problems = compare(stock.outputs, cadence.outputs)
    if problems:
        print(f"NOT bit-identical: {len(problems)} of {len(stock.outputs)} frames differ; first: {problems[0]}")
        return 1
    print(f"bit-identical: all {len(stock.outputs)} frames torch.equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
