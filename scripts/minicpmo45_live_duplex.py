"""MiniCPM-o 4.5's live duplex unit loop, the token2wav tail stock vs DuplexCadence (examples/minicpmo45/live.py).

    python scripts/minicpmo45_live_duplex.py --device cuda --out out/minicpmo45_live.json
    python scripts/minicpmo45_live_duplex.py --device cuda --n-timesteps 5 --dtype float16 --out out/live_n5.json
    python scripts/minicpmo45_live_duplex.py --device cuda --conversations 2 --out out/live_c2.json
    python scripts/minicpmo45_live_duplex.py --device cuda --ar graphed --out out/minicpmo45_live_graphed.json
    python scripts/minicpmo45_live_duplex.py                                  # CPU check: reduced sizes

One unit per second of user audio: LISTEN (log-mel, Whisper encoder with its KV cache, LLM prefill) then
SPEAK (the LLM's text decisions, the TTS's 25 + 1 speech tokens, the token2wav tail), for a scripted
conversation (--pattern, 64 units by default) at MiniCPM-o 4.5's released sizes with seeded random weights
(--sizes reduced: the same loop with small widths, the default on the CPU). The speech tokens of each
unit are fed to two tails built with the same seed: stock `Token2wav.stream` and the DuplexCadence
runtime. Prints progress, then a table of LISTEN, each SPEAK stage, SPEAK and whole units against the 1 s
cadence, and whether every chunk of audio of the two tails is `torch.equal` (cuDNN deterministic).
--ar graphed runs the LLM and the TTS on static KV caches with their one-token steps replayed from CUDA
graphs (called directly off CUDA; examples/minicpmo45/README.md, "The graphed variant"): close to the
default eager modules, not bit-identical to them; the tails are compared the same way, and the table's
title and the JSON's "autoregressive" field say which variant ran.
Exit status 0 when bit-identical, 1 when not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument(
        "--sizes",
        choices=("released", "reduced"),
        default=None,
        help="released: MiniCPM-o 4.5's sizes (default on CUDA); reduced: small widths, the same loop (default on CPU)",
    )
    parser.add_argument(
        "--pattern",
        default=None,
        help="the conversation: L<n> = n listening units, S<n> = a speaking turn of n units "
        "(default: 'L4 S8 L5 S1 L3 S12 L6 S5 L4 S10 L6', 64 units)",
    )
    parser.add_argument("--text-tokens", default="3-7", help="text tokens per speaking unit, N or LOW-HIGH (3-7)")
    parser.add_argument(
        "--n-timesteps", type=int, default=None, help="token2wav Euler steps (10 released, 2 reduced; the demo: 5)"
    )
    parser.add_argument(
        "--dtype", choices=("float32", "float16"), default="float32", help="the token2wav tail's dtype (float16: CUDA)"
    )
    parser.add_argument("--conversations", type=int, default=1, help="conversations served in turn each second")
    parser.add_argument("--sliding-window", choices=("basic", "off"), default="basic", help="the LLM's KV window")
    parser.add_argument("--window-high", type=int, default=4000, help="basic window: slide above this many tokens")
    parser.add_argument("--window-low", type=int, default=3500, help="basic window: slide down to this many tokens")
    parser.add_argument(
        "--ar",
        choices=("eager", "graphed"),
        default="eager",
        help="the LLM and TTS: eager (transformers' modules op by op, default) or graphed (static KV caches, "
        "one-token steps replayed from CUDA graphs; not bit-identical to eager)",
    )
    parser.add_argument("--warmup-pattern", default="L1 S2", help="a short conversation run first (not measured)")
    parser.add_argument("--seed", type=int, default=0, help="script, audio, sampling and tail sessions")
    parser.add_argument("--model-seed", type=int, default=4242, help="LLM, audio encoder and TTS weights")
    parser.add_argument("--tail-seed", type=int, default=1234, help="token2wav weights (both tails)")
    parser.add_argument("--out", type=Path, help="write the results (with the environment) as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", flush=True)

    import torch

    from duplexcadence.examples.minicpmo45.live import (
        DEFAULT_PATTERN,
        LiveDuplex,
        ScriptError,
        conversation_script,
        result_json,
        table,
        text_tokens_range,
    )
    from duplexcadence.examples.minicpmo45.live_config import SIZES
    from duplexcadence.examples.minicpmo45.live_model import WindowSettings
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    device = torch.device(args.device)
    sizes = SIZES[args.sizes or ("released" if device.type == "cuda" else "reduced")]
    n_timesteps = args.n_timesteps or (10 if sizes.name == "released" else 2)
    pattern = args.pattern or DEFAULT_PATTERN
    try:
        text_tokens = text_tokens_range(args.text_tokens)
        conversation_script(pattern, 0, text_tokens)
        conversation_script(args.warmup_pattern, 0, text_tokens)
        window = WindowSettings(args.sliding_window, args.window_high, args.window_low)
    except (ScriptError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dtype == "float16" and device.type != "cuda":
        print("error: --dtype float16 runs the tail under CUDA autocast: use --device cuda", file=sys.stderr)
        return 2
    if args.conversations < 1:
        print("error: --conversations must be at least 1", file=sys.stderr)
        return 2
    if not 1 <= n_timesteps <= 16:
        print(f"error: --n-timesteps must be 1..16 (the CFM buffers hold 16 steps), got {n_timesteps}", file=sys.stderr)
        return 2

    torch.manual_seed(args.seed)
    say(
        f"MiniCPM-o 4.5 live duplex on {device}: {sizes.name} sizes, tail {args.dtype} n_timesteps={n_timesteps} "
        f"P={sizes.prompt_frames}, {args.conversations} conversation(s), torch {torch.__version__}"
    )
    with torch.no_grad(), deterministic_cudnn():
        live = LiveDuplex(
            sizes,
            device,
            n_timesteps=n_timesteps,
            tail_float16=args.dtype == "float16",
            conversations=args.conversations,
            seed=args.seed,
            model_seed=args.model_seed,
            tail_seed=args.tail_seed,
            window=window,
            progress=say,
            ar=args.ar,
        )
        live.warmup(args.warmup_pattern, progress=say)
        scripts = live.scripts(pattern, text_tokens)
        say(f"conversation: {len(scripts[0])} units ({pattern})")
        run = live.run(scripts, progress=say)
        payload = result_json(live, run, pattern, text_tokens)
    payload["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    payload["wall_s"] = time.perf_counter() - started
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=1, sort_keys=True, default=str))
        say(f"wrote {args.out}")
    setup = ", ".join(f"{k} {v:.1f} s" for k, v in payload["setup_s"].items())
    print(f"set-up: {setup}")
    if "memory" in payload:
        memory = payload["memory"]
        print(
            f"peak allocated {memory['peak_allocated_bytes'] / 2**30:.2f} GiB (model weights "
            f"{payload['config']['parameter_bytes'] / 2**30:.2f} GiB); tails resident: stock "
            f"{memory['resident_bytes']['stock_tail'] / 2**20:.0f} MiB, DuplexCadence "
            f"{memory['resident_bytes']['duplexcadence_tail'] / 2**20:.0f} MiB"
        )
    for stage, graphs in payload.get("autoregressive_graphs", {}).items():
        print(
            f"{stage} steps: {graphs['calls']} calls, {graphs['captures']} graphs captured, {graphs['replays']} "
            f"replays, static cache of {graphs['cache_capacity']} tokens"
        )
    rt = payload["runtime"]
    print(
        f"duplexcadence: {rt['graphs_captured']} graphs, {rt['replays']} replays, "
        f"{rt['eager_planned'] + rt['eager_off_plan']} eager firings"
    )
    if payload["bit_identical"]:
        print(f"bit-identical: all {payload['chunks_compared']} chunks of audio torch.equal")
    else:
        print(
            f"NOT bit-identical: {payload['units_differing']} units differ ({payload['chunks_compared']} chunks); "
            f"first {payload['first_differing_units']}"
        )
    print()
    print(table(payload))
    return 0 if payload["bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
