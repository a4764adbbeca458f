"""Conversations per GPU: MiniCPM-o 4.5's whole duplex second, the conversation engine against the in-turn loop.

    python scripts/conversations_bench.py --device cuda --counts 1,8,12,16,20 --baseline 1,2 --out out/conv.json
    python scripts/conversations_bench.py                        # CPU check: reduced sizes, 2 conversations

Both sides in one process, at MiniCPM-o 4.5's released sizes with seeded random weights (--sizes reduced: small
widths, the default on the CPU), each conversation its own scripted dialogue (--units units of alternating
listening stretches and speaking turns drawn from its own seed) and its own seeded audio:

* the baseline (--baseline counts): the live loop (examples/minicpmo45/live.py with --ar graphed: the LLM and
  TTS one-token steps graphed, batch 1) serving every conversation's unit in turn each second, with the stock
  token2wav tail; a round is the sum of its units;
* the engine (--counts): every conversation's unit of a second in one round of the conversation engine, each
  stage batched across the conversations that need it (interpreter/engine/, examples/minicpmo45/conversation.py).

A round over the cadence (1 s) is a second some conversation's audio came late. For each count: the round's
p50/p99/max, rounds over the cadence, each stage's mean share, rows per batched step, the tail's eager firings,
peak memory. The audio of the first --verify conversations of the largest count is compared with the stock tail
fed their speech tokens (`torch.equal`), and every row-count graph of the engine's steps is compared with the
same step run eagerly on the same rows (`torch.equal`).
Exit status 0 when every comparison holds, 1 when one does not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from duplexcadence.examples.minicpmo45 import live
from duplexcadence.examples.minicpmo45.live_config import SIZES, DecodeSettings
from duplexcadence.interpreter.bench.timing import percentile
from duplexcadence.interpreter.engine.api import Decision, UnitInput

CADENCE_MS = 1000.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--sizes", choices=sorted(SIZES), default=None, help="released (CUDA default) or reduced")
    parser.add_argument("--counts", default=None, help="conversations per engine round, comma-separated")
    parser.add_argument("--baseline", default="", help="conversations served in turn by the live loop (e.g. 1,2)")
    parser.add_argument("--units", type=int, default=None, help="units (seconds) per conversation (64; CPU: 4)")
    parser.add_argument("--warmup-units", type=int, default=3, help="engine rounds run first at the largest count")
    parser.add_argument("--lanes", type=int, default=None, help="the tail's lanes (CUDA default 4)")
    parser.add_argument("--n-timesteps", type=int, default=None, help="token2wav Euler steps (10; CPU: 2)")
    parser.add_argument("--verify", type=int, default=2, help="conversations whose audio is compared with stock")
    parser.add_argument("--seed", type=int, default=0, help="scripts, audio and sampling")
    parser.add_argument("--out", type=Path, help="write the results (with the environment) as JSON here")
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.sizes = args.sizes or ("released" if cuda else "reduced")
    args.counts = [int(n) for n in (args.counts or ("1,8,16" if cuda else "2")).split(",")]
    args.baseline = [int(n) for n in args.baseline.split(",") if n]
    args.units = args.units or (64 if cuda else 4)
    args.lanes = args.lanes or (4 if cuda else 1)
    args.n_timesteps = args.n_timesteps or (10 if cuda else 2)
    if min(args.counts) < 1 or (args.baseline and min(args.baseline) < 1):
        parser.error("conversation counts must be at least 1")
    return args


def random_pattern(units: int, seed: int) -> str:
    """A dialogue of ``units`` units: listening stretches of 2-6 units and speaking turns of 1-12, from ``seed``."""
    generator = np.random.default_rng(seed)
    items, total, speak = [], 0, bool(generator.integers(0, 2))
    while total < units:
        count = int(generator.integers(1, 13) if speak else generator.integers(2, 7))
        count = min(count, units - total)
        items.append(f"{'S' if speak else 'L'}{count}")
        total += count
        speak = not speak
    return " ".join(items)


def scripts(count: int, units: int, seed: int) -> list[list[live.UnitPlan]]:
    return [live.conversation_script(random_pattern(units, seed + c), seed + c) for c in range(count)]


def decision(plan: live.UnitPlan) -> Decision:
    if plan.kind == "listen":
        return Decision("listen")
    return Decision("speak", text=plan.text, end_of_turn=plan.turn_end)


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean_ms": statistics.fmean(values),
        "p50_ms": percentile(values, 0.5),
        "p99_ms": percentile(values, 0.99),
        "max_ms": max(values),
        "over_cadence": sum(value > CADENCE_MS for value in values),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def baseline(args: argparse.Namespace, device: torch.device, say) -> dict[str, Any]:
    """The live loop (graphed AR, batch 1), every conversation's unit in turn, stock tail vs DuplexCadence."""
    results: dict[str, Any] = {}
    for count in args.baseline:
        say(f"baseline: {count} conversation(s) in turn, live loop with graphed AR steps")
        loop = live.LiveDuplex(
            SIZES[args.sizes], device, n_timesteps=args.n_timesteps, conversations=count, seed=args.seed, ar="graphed"
        )
        loop.warmup()
        run = loop.run(scripts(count, args.units, args.seed))
        rounds = {side: [0.0] * run.ticks for side in live.SIDES}
        for record in run.records:
            for side in live.SIDES:
                rounds[side][record.plan.index] += record.unit_ms(side)
        results[str(count)] = {
            "round_stock_tail": stats(rounds["stock"]),
            "round_duplexcadence_tail": stats(rounds["duplexcadence"]),
            "tails_equal": not run.mismatches(),
            "peak_allocated_bytes": run.peak_allocated_bytes,
            "peak_reserved_bytes": run.peak_reserved_bytes,
        }
        say(
            f"baseline {count}: round p99 {results[str(count)]['round_stock_tail'].get('p99_ms', 0):.0f} ms stock tail, "
            f"{results[str(count)]['round_duplexcadence_tail'].get('p99_ms', 0):.0f} ms DuplexCadence tail"
        )
        del loop, run
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def engine_rounds(engine: Any, count: int, units: int, seed: int, say) -> dict[str, Any]:
    plans = scripts(count, units, seed)
    generator = np.random.default_rng(seed + 7)
    ids = [engine.open(seed=seed + c) for c in range(count)]
    model = engine.model
    before = model.tail.runtime.report()
    rounds: list[float] = []
    stages: dict[str, list[float]] = {}
    outputs: dict[int, list[Any]] = {cid: [] for cid in ids}
    speaking_rows: list[int] = []
    try:
        for unit in range(units):
            audio = (0.1 * generator.standard_normal((count, engine.unit_samples))).astype(np.float32)
            inputs = {cid: UnitInput(audio[c], decision(plans[c][unit])) for c, cid in enumerate(ids)}
            sync(model.device)
            started = time.perf_counter()
            out = engine.step(inputs)
            sync(model.device)
            rounds.append((time.perf_counter() - started) * 1000)
            first = next(iter(out.values()))
            for stage, ms in first.timing_ms.items():
                stages.setdefault(stage, []).append(ms)
            speaking_rows.append(sum(o.kind == "speak" for o in out.values()))
            for cid in ids:
                outputs[cid].append(out[cid])
            if (unit + 1) % 16 == 0:
                say(f"  {count} conversations: unit {unit + 1}/{units}, last round {rounds[-1]:.0f} ms")
    finally:
        for cid in ids:
            engine.close(cid)
    after = model.tail.runtime.report()
    total = sum(rounds)
    return {
        "round": stats(rounds),
        "stage_ms": {stage: stats(values) for stage, values in stages.items()},
        "stage_share": {stage: sum(values) / total for stage, values in stages.items()} if total else {},
        "speaking_rows": {"mean": statistics.fmean(speaking_rows), "max": max(speaking_rows)},
        "tail_eager_firings": (after.eager_planned - before.eager_planned)
        + (after.eager_off_plan - before.eager_off_plan),
        "tail_replays": after.replays - before.replays,
        "outputs": outputs,
        "seeds": [seed + c for c in range(count)],
    }


def verify_tail(
    sizes: Any, prompt: Any, n_timesteps: int, device: torch.device, run: dict[str, Any], conversations: int
) -> dict[str, Any]:
    """The audio of the first ``conversations`` conversations against the stock tail fed their speech tokens (run
    after the engine is gone: the stock tail's buffers are large)."""
    from duplexcadence.examples.minicpmo45.model import build_tail
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    tail = build_tail(sizes.tail, seed=1234, device=device)
    compared = differing = 0
    for seed, outputs in list(zip(run["seeds"], run["outputs"].values()))[:conversations]:
        stock = StockToken2wavSession(tail, prompt, n_timesteps, session_seed=seed, own_caches=True)
        turn_start = True
        for output in outputs:
            if output.kind != "speak":
                continue
            chunks = stock.push_tokens(output.speech_tokens, flush=turn_start, end_of_turn=output.end_of_turn)
            expected = torch.cat([c.reshape(-1) for c in chunks]).numpy() if chunks else np.zeros(0, np.float32)
            compared += len(chunks)
            differing += int(not np.array_equal(output.audio, expected))
            turn_start = output.end_of_turn
            if output.end_of_turn:
                stock.reset()
    del tail
    return {"conversations": conversations, "chunks_compared": compared, "units_differing": differing}


def verify_graphs(engine: Any) -> dict[str, Any]:
    """Each row-count graph of the engine's steps against the same step run eagerly on the same rows."""
    model = engine.model
    checked = differing = 0
    if not model.capture:
        return {"checked": 0, "differing": 0, "note": "no graphs captured on this device"}
    outputs = model.step_outputs()
    for graphs in model.step_graphs():
        for rows, graph in sorted(graphs.graphs.items()):
            model.rows[:rows].copy_(torch.arange(rows, device=model.device))
            graph.replay()
            replayed = [t[:rows].clone() for t in outputs[graphs.name]]
            graphs.step(rows)
            sync(model.device)
            checked += 1
            differing += int(not all(torch.equal(a, t[:rows]) for a, t in zip(replayed, outputs[graphs.name])))
    return {"checked": checked, "differing": differing}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", flush=True)

    device = torch.device(args.device)
    payload: dict[str, Any] = {
        "command": "python scripts/conversations_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "what": "MiniCPM-o 4.5 conversations per GPU: the conversation engine (every stage batched across "
        "conversations) against the live loop serving them in turn",
        "environment": live.environment(device),
        "config": {
            "sizes": args.sizes,
            "units": args.units,
            "counts": args.counts,
            "baseline": args.baseline,
            "lanes": args.lanes,
            "n_timesteps": args.n_timesteps,
            "decode": attrs.asdict(DecodeSettings()),
            "seed": args.seed,
        },
    }

    def save() -> None:  # after every phase: a run cut short keeps what it measured
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(payload, indent=1, default=str) + "\n")

    payload["baseline"] = baseline(args, device, say) if args.baseline else {}
    save()
    from duplexcadence.interpreter.engine import registry

    slots = max(args.counts)
    say(f"engine: {slots} slots, {args.lanes} lane(s), {args.sizes} sizes")
    engine = registry.load_engine(
        "minicpmo45",
        device=args.device,
        sizes=args.sizes,
        conversations=slots,
        lanes=args.lanes,
        n_timesteps=args.n_timesteps,
        progress=say,
    )
    model = engine.model
    load_s = time.perf_counter() - started
    model.capture_steps()
    say(f"row-count graphs captured: {sum(g.counters.captures for g in model.step_graphs())}")
    engine_rounds(engine, slots, args.warmup_units, args.seed + 999, say)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    payload["engine"] = {
        "load_s": load_s,
        "plan_bytes_per_conversation": model.bytes_per_conversation(),
        "allocated_per_conversation": model.allocated_per_conversation,
        "counts": {},
    }
    largest = None
    for count in args.counts:
        say(f"engine: {count} conversation(s), {args.units} units")
        run = engine_rounds(engine, count, args.units, args.seed, say)
        round_stats = run["round"]
        say(
            f"engine {count}: round p50 {round_stats['p50_ms']:.0f} ms, p99 {round_stats['p99_ms']:.0f} ms, "
            f"{round_stats['over_cadence']} over 1 s, tail eager firings {run['tail_eager_firings']}"
        )
        largest = run
        payload["engine"]["counts"][str(count)] = {k: v for k, v in run.items() if k not in ("outputs", "seeds")}
        save()
    if device.type == "cuda":
        payload["engine"]["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        payload["engine"]["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    payload["engine"]["graphs"] = {
        g.name: {"captures": g.counters.captures, "replays": g.counters.replays, "direct": g.counters.direct}
        for g in model.step_graphs()
    }
    assert largest is not None
    say(f"verifying the audio of {args.verify} conversation(s) against the stock tail")
    payload["graphs_vs_eager"] = verify_graphs(engine)
    sizes, prompt = model.sizes, model.prompt
    del engine, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    payload["tail_vs_stock"] = verify_tail(sizes, prompt, args.n_timesteps, device, largest, args.verify)
    ok = payload["tail_vs_stock"]["units_differing"] == 0 and payload["graphs_vs_eager"]["differing"] == 0
    payload["all_equal"] = ok
    save()
    print(table(payload))
    return 0 if ok else 1


def table(payload: dict[str, Any]) -> str:
    lines = [f"{'side':<36} {'n':>3} {'p50':>7} {'p99':>7} {'max':>7} {'>1s':>4}  stage shares"]
    for count, entry in payload["baseline"].items():
        for key, label in (
            ("round_stock_tail", "in turn, stock tail"),
            ("round_duplexcadence_tail", "in turn, DC tail"),
        ):
            r = entry[key]
            lines.append(
                f"{label:<36} {count:>3} {r['p50_ms']:>7.0f} {r['p99_ms']:>7.0f} {r['max_ms']:>7.0f} {r['over_cadence']:>4}"
            )
    for count, entry in payload["engine"]["counts"].items():
        r = entry["round"]
        shares = ", ".join(f"{stage} {share:.0%}" for stage, share in entry["stage_share"].items())
        lines.append(
            f"{'engine, batched':<36} {count:>3} {r['p50_ms']:>7.0f} {r['p99_ms']:>7.0f} {r['max_ms']:>7.0f} "
            f"{r['over_cadence']:>4}  {shares}"
        )
    tail = payload["tail_vs_stock"]
    lines.append(
        f"tail vs stock: {tail['chunks_compared']} chunks of {tail['conversations']} conversations, "
        f"{tail['units_differing']} units differ; graphs vs eager: {payload['graphs_vs_eager']['checked']} checked, "
        f"{payload['graphs_vs_eager']['differing']} differ"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
