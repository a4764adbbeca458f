"""Chunk boundaries of every shipped tail: each streaming variant run for T seconds against one offline call.

For each tail, every streaming variant (the stock loop, the DuplexCadence runtime on the tail's clock, and
Qwen3-Omni's opt-in streaming clock) decodes the same input for a session of T seconds, the session the
plan's sample accounting counts: its instants, then, where the clock holds units back, the end of the
stream with no new input (`finish`); its outputs, concatenated, are compared with
one offline call of the stock model over the whole input (the tail's `Tail.offline`, on a model with the
same weights that no stream has touched) by `interpreter.runtime.offline.verify_offline`: the lengths,
`torch.equal`, and the largest absolute difference within a window around each boundary against away
from every boundary. Beside each run, the plan's sample accounting of the variant's clock over the same
session (`dsl plan --seconds T`): its total and offline length must be what the run measured, and
`dsl check` flags a clock that loses units at every boundary (boundary-loss).

    source scripts/device_setup.sh
    python scripts/boundary_report.py --device cuda --seconds 60 --json boundaries.json
    python scripts/boundary_report.py --device cpu --seconds 2 --json /tmp/boundaries.json  # CPU: reduced sizes

On the CPU, Qwen3-Omni's chunked loop and MiniCPM-o 4.5 run reduced configurations (the clocks do not
depend on their widths); Mimi (Moshi, PersonaPlex) and Qwen3-Omni's streaming clock bind every layer's
state at its released shape, so they run at the released size. Lengths and `torch.equal` hold at any
size; differences are those of the random weights, on the device and dtype given.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import torch

from duplexcadence.dsl.frontend import check_file, load_program
from duplexcadence.dsl.loader import stdlib_path
from duplexcadence.interpreter.plans.plan import make_plan
from duplexcadence.interpreter.runtime.offline import OfflineReport, verify_offline
from duplexcadence.interpreter.tails import TailUnavailable, get

TAILS = ("qwen3omni", "moshi", "personaplex", "minicpmo45")
SAMPLE_RATE = 24_000


@attrs.frozen
class Variant:
    """One streaming variant of a tail: what steps it, over which clock, against which offline call."""

    tail: str
    name: str
    clock: str  # the stdlib module the plan counts with
    make_stream: Callable[[], Any]
    offline: Callable[[torch.Tensor], torch.Tensor]
    whole: torch.Tensor  # the whole input; split into steps by the clock's plan
    params: dict[str, str] = attrs.field(factory=dict)
    output: str | int | None = None


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def step_inputs(variant: Variant, seconds: Fraction) -> tuple[list[torch.Tensor], Any]:
    """The whole input cut into the units each instant of the session feeds (from the clock's plan)."""
    plan = make_plan(load_program(stdlib_path(variant.clock), variant.params), seconds=seconds)
    trace = plan.trace
    by_instant = trace.by_instant()
    steps, start = [], 0
    for instant in range(plan.samples.instants):
        repeated = trace.planned_index(instant)
        units = sum(v.length for f in by_instant[repeated] for v in f.views if v.kind == "feed")
        steps.append(variant.whole[..., start : start + units])
        start += units
    if start > variant.whole.shape[-1]:
        raise ValueError(f"{variant.tail}: the session needs {start} input units, {variant.whole.shape[-1]} given")
    return steps, plan


def flagged(clock: str) -> bool:
    result = check_file(stdlib_path(clock))
    return any(d.code.name == "boundary-loss" for d in result.diagnostics)


# --- the tails ---------------------------------------------------------------------------------------


def qwen3omni_variants(device: str, seconds: Fraction, small: bool) -> list[Variant]:
    from duplexcadence.examples.qwen3omni.cadence import load_runtime
    from duplexcadence.examples.qwen3omni.model import Qwen3OmniMoeCode2WavConfig, build_code2wav
    from duplexcadence.examples.qwen3omni.stock import StockSecondDecoder
    from duplexcadence.examples.qwen3omni.streaming_cadence import load_streaming_runtime

    offline = get("qwen3omni").offline
    codes = torch.randint(0, 2048, (1, 16, int(seconds * 25 / 2) + 13), generator=torch.Generator().manual_seed(7))
    codes = codes.to(device)
    # the chunked loop's clock holds only codes and samples: a reduced network runs it on the CPU
    config = (
        Qwen3OmniMoeCode2WavConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            decoder_dim=32,
        )
        if small
        else None
    )

    def chunked() -> torch.nn.Module:
        return build_code2wav(torch.float32, device, config=config)

    def released() -> torch.nn.Module:
        return build_code2wav(torch.float32, device)

    # the offline call's own model (same weights), built when a variant first needs it
    reference_chunked, reference_released = functools.cache(chunked), functools.cache(released)
    return [
        Variant(
            "qwen3omni",
            "stock chunked loop (chunked_decode per second)",
            "models.qwen3_omni_code2wav",
            lambda: StockSecondDecoder(chunked()),
            lambda whole: offline(reference_chunked(), whole),
            codes,
        ),
        Variant(
            "qwen3omni",
            "DuplexCadence, models.qwen3_omni_code2wav",
            "models.qwen3_omni_code2wav",
            lambda: load_runtime(chunked(), device=device),
            lambda whole: offline(reference_chunked(), whole),
            codes,
        ),
        Variant(
            "qwen3omni",
            "DuplexCadence, models.qwen3_omni_code2wav_streaming",
            "models.qwen3_omni_code2wav_streaming",
            lambda: load_streaming_runtime(released(), device=device),
            lambda whole: offline(reference_released(), whole),
            codes,
        ),
    ]


def mimi_codes(seconds: Fraction, device: str) -> torch.Tensor:
    from duplexcadence.examples.moshi.model import random_codes

    return random_codes(1, int(seconds * 25 / 2) + 2, seed=7).to(device)


def moshi_variants(device: str, seconds: Fraction, small: bool) -> list[Variant]:
    from duplexcadence.examples.moshi.cadence import load_runtime
    from duplexcadence.examples.moshi.model import build_mimi
    from duplexcadence.examples.moshi.stock import MoshiStockDecoder

    offline = get("moshi").offline
    reference = functools.cache(lambda: build_mimi(seed=1234, device=device))
    codes = mimi_codes(seconds, device)
    return [
        Variant(
            "moshi",
            "stock streaming decode (eager)",
            "models.mimi_decoder",
            lambda: MoshiStockDecoder(build_mimi(seed=1234, device=device), 1, mode="eager"),
            lambda whole: offline(reference(), whole),
            codes,
        ),
        Variant(
            "moshi",
            "DuplexCadence, models.mimi_decoder",
            "models.mimi_decoder",
            lambda: load_runtime(build_mimi(seed=1234, device=device), 1),
            lambda whole: offline(reference(), whole),
            codes,
        ),
    ]


def personaplex_variants(device: str, seconds: Fraction, small: bool) -> list[Variant]:
    from duplexcadence.examples.moshi.model import build_mimi
    from duplexcadence.examples.personaplex.cadence import load_runtime
    from duplexcadence.examples.personaplex.stock import PersonaPlexTail

    offline = get("personaplex").offline
    reference = functools.cache(lambda: build_mimi(seed=1234, device=device))
    codes = mimi_codes(seconds, device)
    return [
        Variant(
            "personaplex",
            "stock decode (old moshi state handling)",
            "models.personaplex_mimi_decoder",
            lambda: PersonaPlexTail(build_mimi(seed=1234, device=device), build_mimi(seed=1234, device=device)),
            lambda whole: offline(reference(), whole),
            codes,
            output=0,
        ),
        Variant(
            "personaplex",
            "DuplexCadence, models.personaplex_mimi_decoder",
            "models.personaplex_mimi_decoder",
            lambda: load_runtime(build_mimi(seed=1234, device=device), 1),
            lambda whole: offline(reference(), whole),
            codes,
        ),
    ]


def minicpmo45_variants(device: str, seconds: Fraction, small: bool) -> list[Variant]:
    from duplexcadence.examples.minicpmo45 import cadence, model, stock

    config = (
        model.TailConfig(encoder_blocks=1, encoder_up_blocks=1, dit_depth=1, hift_base_channels=32)
        if small
        else model.RELEASED
    )
    prompt_frames, steps = (20, 2) if small else (150, 10)
    prompt = model.random_prompt(prompt_frames, seed=4321, device=device)
    offline = get("minicpmo45").offline
    reference = functools.cache(lambda: model.build_tail(config, seed=1234, device=device))
    tokens = torch.randint(0, 6561, (1, int(seconds) * 25 + 25), generator=torch.Generator().manual_seed(7))
    silence = torch.full((1, stock.PRE_LOOKAHEAD_TOKENS), model.SILENCE_TOKEN, dtype=tokens.dtype)
    params = {
        "P": str(prompt_frames),
        "steps": str(steps),
        "layers": str(config.encoder_blocks + config.encoder_up_blocks),
    }

    def whole_turn(new_tokens: torch.Tensor) -> torch.Tensor:  # the turn is primed with 3 silence tokens
        return offline(reference(), prompt, torch.cat([silence, new_tokens.cpu().to(silence.dtype)], dim=-1), steps)

    def runtime_session() -> Any:
        bound = cadence.load_runtime(model.build_tail(config, seed=1234, device=device), prompt_frames, steps)
        return bound.session(prompt, seed=7).session

    def stock_turn() -> Any:
        session = stock.StockToken2wavSession(
            model.build_tail(config, seed=1234, device=device), prompt, n_timesteps=steps, session_seed=7
        )
        return stock.StockTurnStream(session)

    return [
        Variant(
            "minicpmo45",
            "stock Token2wav.stream, one turn",
            "models.step_audio2_token2wav",
            stock_turn,
            whole_turn,
            tokens,
            params,
        ),
        Variant(
            "minicpmo45",
            "DuplexCadence, models.step_audio2_token2wav",
            "models.step_audio2_token2wav",
            runtime_session,
            whole_turn,
            tokens.to(device=device, dtype=torch.int32),
            params,
        ),
    ]


VARIANTS = {
    "qwen3omni": qwen3omni_variants,
    "moshi": moshi_variants,
    "personaplex": personaplex_variants,
    "minicpmo45": minicpmo45_variants,
}


# --- running and reporting ---------------------------------------------------------------------------


def run_variant(variant: Variant, seconds: Fraction, window: int) -> dict:
    steps, plan = step_inputs(variant, seconds)
    log(f"{variant.tail}: {variant.name}: {len(steps)} steps")
    began = time.perf_counter()
    stream = variant.make_stream()
    # the session the plan counts: its instants, then, where units are held back, the end of the stream
    end = "flush" if plan.samples.flush else "step"
    report: OfflineReport = verify_offline(
        stream, variant.offline, steps, output=variant.output, window=window, end=end
    )
    close = getattr(stream, "close", None)
    if callable(close) and not hasattr(stream, "plan"):  # a runtime's own sessions are closed by verify_offline
        close()
    [accounted] = plan.samples.outputs.values()
    return {
        "tail": variant.tail,
        "variant": variant.name,
        "clock": variant.clock,
        "params": variant.params,
        "boundary_loss_flagged": flagged(variant.clock),
        "end": end,
        "plan": {
            "seconds": str(plan.samples.seconds),
            "instants": plan.samples.instants,
            "total": accounted.total,
            "offline": accounted.offline,
            "dropped": accounted.dropped,
            "loss_per_boundary": accounted.loss,
            "boundaries": accounted.boundaries,
        },
        "plan_matches_run": accounted.total == report.stream_length and accounted.offline == report.offline_length,
        "measured": report.to_json(),
        "wall_s": round(time.perf_counter() - began, 3),
    }


def environment(device: str) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info


def table(rows: list[dict]) -> str:
    header = (
        "tail",
        "variant",
        "steps",
        "stream",
        "offline",
        "short",
        "plan short",
        "equal",
        "offline rms",
        "max diff",
        "near",
        "away",
    )
    lines = [header]
    for row in rows:
        m = row["measured"]

        def number(value: float | None) -> str:
            return "-" if value is None else f"{value:.3g}"

        lines.append(
            (
                row["tail"],
                row["variant"],
                str(m["steps"]),
                str(m["stream_length"]),
                str(m["offline_length"]),
                str(m["length_difference"]),
                str(row["plan"]["offline"] - row["plan"]["total"]),
                "yes" if m["equal"] else "no",
                number(m["offline_rms"]),
                number(m["max_abs_diff"]),
                number(m["near_boundaries"]),
                number(m["away_from_boundaries"]),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=Fraction, default=None, help="session length (default: 60 on CUDA, 2 on CPU)")
    parser.add_argument("--tails", default=",".join(TAILS), help=f"comma-separated, of {', '.join(TAILS)}")
    parser.add_argument("--window-ms", type=Fraction, default=Fraction(10), help="a boundary's window on each side")
    parser.add_argument(
        "--small",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reduced Qwen3-Omni chunked network and MiniCPM-o tail (default: on the CPU)",
    )
    parser.add_argument("--json", required=True, type=Path, help="where the results go")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else Fraction(60 if args.device.startswith("cuda") else 2)
    small = args.small if args.small is not None else not args.device.startswith("cuda")
    window = int(args.window_ms * SAMPLE_RATE / 1000)
    rows, skipped = [], {}
    torch.manual_seed(0)
    for name in args.tails.split(","):
        if name not in VARIANTS:
            parser.error(f"unknown tail {name!r}; the tails are {', '.join(TAILS)}")
        try:
            get(name).require()
            variants = VARIANTS[name](args.device, seconds, small)
        except TailUnavailable as error:
            skipped[name] = str(error)
            log(f"{name}: skipped: {error}")
            continue
        for variant in variants:
            rows.append(run_variant(variant, seconds, window))
    command = "python scripts/boundary_report.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {
        "command": command,
        "environment": environment(args.device),
        "seconds": str(seconds),
        "window_samples": window,
        "small": small,
        "rows": rows,
        "skipped": skipped,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(table(rows))
    return 0 if all(row["plan_matches_run"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
