"""Inference with MiniCPM-o 4.5's token2wav tail: stock ``Token2wav.stream`` and the DuplexCadence runtime side by side.

    python -m duplexcadence.examples.minicpmo45.infer [--device cuda] [--seconds N] [--steps 10] [--released]

Two workloads, each run through stock and through the runtime, every chunk compared with
``torch.equal``:

1. an utterance of N seconds: speech tokens arrive in irregular pieces, as MiniCPM-o's TTS emits
   them; every 25 new tokens make one 1 s chunk; the end of the turn streams what is left;
2. a conversation of three turns with ``reset`` between them (a new turn starts from the voice's
   set-up state), with a forced flush (chunk end-of-speech) in the middle of a turn.

Stock and the runtime run on two tails built with the same seed (the runtime takes its tail over).
Prints per-chunk wall times, peak memory (CUDA) and the runtime's memory report. On the CPU the
default is the reduced CI tail (1 + 1 conformer layers, a 1-layer DiT, HiFT with 32 channels,
P = 20) so it finishes in minutes on 2 cores; ``--released`` builds the released sizes (seconds per
chunk on a CPU). On a GPU the released tail is the default, with graphs captured for the planned
chunks and deterministic cuDNN (which bit-identity needs).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from duplexcadence.examples.minicpmo45.cadence import load_runtime
from duplexcadence.examples.minicpmo45.model import RELEASED, TailConfig, build_tail, random_prompt
from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession
from duplexcadence.interpreter.bench import fresh_peak, sync
from duplexcadence.interpreter.plans.plan_text import human_bytes
from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

REDUCED = TailConfig(encoder_blocks=1, encoder_up_blocks=1, dit_depth=1, hift_base_channels=32)


@dataclass
class Push:
    """One call of MiniCPM-o's token feeding: new tokens, and whether it flushes or ends the turn."""

    tokens: list[int]
    flush: bool = False
    end_of_turn: bool = False


@dataclass
class ChunkResult:
    audio: torch.Tensor
    milliseconds: float
    kind: str


def utterance(seconds: int, seed: int) -> list[list[Push]]:
    """One turn of `seconds` seconds of speech (+ 12 tokens), pushed in pieces of 3..19 tokens."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 6561, (25 * seconds + 12,), generator=generator).tolist()
    pushes, position = [], 0
    while position < len(tokens):
        size = int(torch.randint(3, 20, (1,), generator=generator))
        pushes.append(Push(tokens[position : position + size]))
        position += size
    pushes[-1].end_of_turn = True
    return [pushes]


def conversation(seed: int) -> list[list[Push]]:
    """Three turns: 2 s + a flush of 10 tokens + 2 s more; 1 s + 24 tokens; a 7-token answer."""
    tokens = torch.randint(0, 6561, (400,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [
        [Push(tokens[0:50]), Push(tokens[50:60], flush=True), Push(tokens[60:110], end_of_turn=True)],
        [Push(tokens[200:249], end_of_turn=True)],
        [Push(tokens[300:307], end_of_turn=True)],
    ]


def run_turns(session, turns: list[list[Push]], device: torch.device) -> list[ChunkResult]:
    """Feed every turn (``reset`` before each but the first); time each ``push_tokens`` call per chunk."""
    results: list[ChunkResult] = []
    for turn_index, pushes in enumerate(turns):
        if turn_index:
            session.reset()
        turn_chunks = 0
        for push in pushes:
            sync(device)
            start = time.perf_counter()
            chunks = session.push_tokens(push.tokens, flush=push.flush, end_of_turn=push.end_of_turn)
            sync(device)
            elapsed = (time.perf_counter() - start) * 1000
            for index, chunk in enumerate(chunks):
                last = push.end_of_turn and index == len(chunks) - 1
                kind = (
                    "last"
                    if last
                    else "flush"
                    if push.flush
                    else ("first", "second")[turn_chunks]
                    if turn_chunks < 2
                    else "steady"
                )
                results.append(ChunkResult(chunk, elapsed / len(chunks), kind))
                turn_chunks += 1
    return results


@dataclass
class Side:
    name: str
    results: dict[str, list[ChunkResult]]
    peak_bytes: int | None
    setup_seconds: float


def run_side(name: str, make_session: Callable, workloads: dict[str, list[list[Push]]], device: torch.device) -> Side:
    fresh_peak(device)
    start = time.perf_counter()
    session = make_session()
    setup = time.perf_counter() - start
    results = {}
    for label, turns in workloads.items():
        session.reset()
        results[label] = run_turns(session, turns, device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Side(name, results, peak, setup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="MiniCPM-o 4.5 token2wav: stock vs DuplexCadence, chunk by chunk")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=int, default=6, help="length of the utterance in duplex seconds")
    parser.add_argument("--steps", type=int, default=10, help="Euler steps (n_timesteps: 10 or 5)")
    parser.add_argument("--released", action="store_true", help="released sizes on the CPU too")
    parser.add_argument("--float16", action="store_true", help="the float16 tail (CUDA only)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt mel frames P (150 released, 20 reduced)")
    parser.add_argument("--seed", type=int, default=0, help="session seed")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    released = args.released or device.type == "cuda"
    config = RELEASED if released else REDUCED
    prompt_frames = args.prompt or (150 if released else 20)
    if args.float16 and device.type != "cuda":
        parser.error("--float16 runs under CUDA autocast: use --device cuda")
    print(
        f"MiniCPM-o 4.5 token2wav on {device}: {'released' if released else 'reduced (CI)'} sizes, "
        f"{'float16' if args.float16 else 'float32'}, n_timesteps={args.steps}, P={prompt_frames}, "
        f"torch {torch.__version__}"
    )
    prompt = random_prompt(prompt_frames, seed=4321, device=device)
    workloads = {
        f"utterance of {args.seconds} s": utterance(args.seconds, seed=2024),
        "conversation of 3 turns": conversation(seed=7),
    }

    with deterministic_cudnn(), torch.no_grad():
        started = time.perf_counter()
        stock_tail = build_tail(config, seed=1234, device=device, float16=args.float16)
        print(f"built the stock tail in {time.perf_counter() - started:.1f} s")
        stock = run_side(
            "stock",
            functools.partial(
                StockToken2wavSession, stock_tail, prompt, n_timesteps=args.steps, session_seed=args.seed
            ),
            workloads,
            device,
        )
        del stock_tail  # free its buffers before the runtime side
        bound_holder = {}

        def make_runtime():
            tail = build_tail(config, seed=1234, device=device, float16=args.float16)
            bound_holder["bound"] = load_runtime(tail, prompt_frames, args.steps)
            return bound_holder["bound"].session(prompt, seed=args.seed)

        cadence = run_side("duplexcadence", make_runtime, workloads, device)

    all_equal = True
    for label in workloads:
        print(f"\n{label}")
        print(f"  {'chunk':>5}  {'kind':<6}  {'samples':>7}  {'stock ms':>9}  {'runtime ms':>10}  equal")
        for index, (mine, theirs) in enumerate(zip(cadence.results[label], stock.results[label], strict=True)):
            equal = torch.equal(mine.audio, theirs.audio)
            all_equal &= equal
            print(
                f"  {index:>5}  {theirs.kind:<6}  {theirs.audio.shape[-1]:>7}  {theirs.milliseconds:>9.1f}  "
                f"{mine.milliseconds:>10.1f}  {'yes' if equal else 'NO'}"
            )
        steady = [
            (s.milliseconds, c.milliseconds)
            for s, c in zip(stock.results[label], cadence.results[label])
            if s.kind == "steady"
        ]
        if steady:
            stock_ms = sorted(s for s, _ in steady)[len(steady) // 2]
            cadence_ms = sorted(c for _, c in steady)[len(steady) // 2]
            print(
                f"  steady chunks, median ms per 1 s chunk: stock {stock_ms:.1f}, runtime {cadence_ms:.1f} "
                f"({stock_ms / cadence_ms:.2f}x)"
            )

    report = bound_holder["bound"].runtime.report()
    print(
        f"\nset-up: stock {stock.setup_seconds:.1f} s, runtime {cadence.setup_seconds:.1f} s (tail build, voice "
        f"set-up, graph capture)"
    )
    if stock.peak_bytes is not None and cadence.peak_bytes is not None:  # measured on CUDA
        print(
            f"peak GPU memory allocated (weights included): stock {human_bytes(stock.peak_bytes)}, runtime "
            f"{human_bytes(cadence.peak_bytes)} ({1 - cadence.peak_bytes / stock.peak_bytes:.0%} lower)"
        )
    print(report)
    chunks = sum(len(results) for results in cadence.results.values())
    print(f"\n{'all' if all_equal else 'NOT all'} {chunks} chunks torch.equal to stock")
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
