"""Moshi's live duplex loop, stock vs DuplexCadence on the decode tail (see examples/moshi/live.py).

    python scripts/moshi_live_duplex.py --device cuda --seconds 30 --out out/moshi_live.json
    python scripts/moshi_live_duplex.py --device cpu --lm-config tiny --seconds 2      # CPU check, < 1 min

Per 80 ms frame: Mimi encode of 1920 samples -> LMGen.step (the 7B LM in bf16 at its released config,
seeded random weights, or a tiny config of the same architecture) -> Mimi decode of the 8 generated
audio codebooks, once with moshi's `mimi.decode` as shipped and once with the DuplexCadence runtime,
on the same tokens. Prints progress, a table of mean / p99 per frame and per second of audio for
LISTEN, THINK, SPEAK and the whole frame loop against the 1 s cadence, and whether every decoded frame
of the two sides is `torch.equal` (cuDNN deterministic). Exit status 0 when bit-identical, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of conversation (12.5 frames each)")
    parser.add_argument(
        "--lm-config",
        default="released",
        choices=("released", "tiny"),
        help="released: moshi's 7B config (loaders._lm_kwargs); tiny: same architecture, ~11 M parameters (for CPU)",
    )
    parser.add_argument(
        "--sampling",
        default="moshi",
        choices=("moshi", "greedy"),
        help="moshi: LMGen's defaults as the server uses them (temp 0.8 / top-k 250 audio, "
        "0.7 / 25 text); greedy: argmax",
    )
    parser.add_argument(
        "--warmup-frames", type=int, default=4, help="frames of zeros before the conversation (the server's warm-up: 4)"
    )
    parser.add_argument("--seed", type=int, default=1234, help="Mimi weights, input audio and sampling")
    parser.add_argument("--lm-seed", type=int, default=4242, help="LM weights")
    parser.add_argument(
        "--compile",
        dest="compile",
        action="store_true",
        default=None,
        help="moshi's torch.compile of rope / rms_norm / gating on (default on CUDA, as shipped)",
    )
    parser.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="set NO_TORCH_COMPILE (default on CPU, where moshi would only compile the LM's "
        "out_norm, an inductor C++ build of about 20 s)",
    )
    parser.add_argument("--out", type=Path, help="write the results (with the environment) as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", flush=True)

    from duplexcadence.examples.moshi.model import configure_torch_compile

    compile_on = args.compile if args.compile is not None else args.device.startswith("cuda")
    configure_torch_compile(compile_on)  # before moshi is imported

    import torch

    from duplexcadence.examples.moshi.live import FRAME_RATE, LiveDuplex, listen_pcm, result_json, table
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    device = torch.device(args.device)
    frames = max(2, math.ceil(args.seconds * FRAME_RATE - 1e-9))  # every frame starting within --seconds
    say(
        f"moshi live duplex loop on {device}: LM {args.lm_config}, sampling {args.sampling}, {frames} frames "
        f"({frames / FRAME_RATE:g} s), torch {torch.__version__}, moshi compile {'on' if compile_on else 'off'}"
    )
    torch.manual_seed(args.seed)  # as moshi's server seeds everything once at start (sampling RNG)
    with torch.no_grad(), deterministic_cudnn():
        live = LiveDuplex(
            device, lm_config=args.lm_config, seed=args.seed, lm_seed=args.lm_seed, sampling=args.sampling, progress=say
        )
        say(
            f"built; warm-up ({args.warmup_frames} frames of zeros, as the server; moshi captures its graphs"
            + (", torch.compile builds its kernels" if compile_on and device.type == "cuda" else "")
            + ")"
        )
        live.warmup(args.warmup_frames, progress=say)
        say(f"conversation: {frames} frames")
        run = live.run(listen_pcm(frames, seed=args.seed), progress=say)
        payload = result_json(live, run, frames / FRAME_RATE)
    payload["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    payload["wall_s"] = time.perf_counter() - started
    print()
    print(table(payload))
    setup = ", ".join(f"{k} {v:.1f} s" for k, v in payload["setup_s"].items())
    print(f"set-up: {setup}")
    if "memory" in payload:
        print(
            f"peak allocated {payload['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB, reserved "
            f"{payload['memory']['peak_reserved_bytes'] / 2**30:.2f} GiB (LM weights "
            f"{payload['config']['lm_bytes'] / 2**30:.2f} GiB)"
        )
    rt = payload["runtime"]
    print(
        f"duplexcadence: {rt['graphs_captured']} graphs, {rt['replays']} replays, "
        f"{rt['eager_planned'] + rt['eager_off_plan']} eager firings, arena {rt['arena_bytes']} B"
    )
    if payload["bit_identical"]:
        print(
            f"bit-identical: all {payload['frames_compared']} decoded frames torch.equal "
            f"(PCM RMS {payload['pcm_rms']:.4f})"
        )
    else:
        print(
            f"NOT bit-identical: {payload['frames_differing']} of {payload['frames_compared']} frames differ; "
            f"first {payload['first_differing_frames']}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=1, sort_keys=True, default=str))
        print(f"wrote {args.out}")
    say("done")
    return 0 if payload["bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
