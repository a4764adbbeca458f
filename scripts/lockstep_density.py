"""Sessions per GPU for Moshi's Mimi decoder tail with lockstep groups (sessions batched into one replay).

N independent conversations (each its own codes and state) join at staggered rounds: every step of
the sweep adds sessions while the earlier ones keep going, so some are in warm-up (the first 125
frames fill the KV ring) while others are steady. A round is one second of audio for every session
(13 frames, then 12); the largest N whose p99 round stays under 1 s is reported for:

* moshi stock, in turn: one moshi Mimi per session (moshi keeps the streaming state in the module),
  as shipped (its `CUDAGraphed` + compiled rope), each session its whole second, then the next;
* moshi stock, batched B=R: moshi's own batched streaming, R sessions per Mimi as the rows of one
  batch, a joining session's row reset with `reset_streaming(mask)`; idle rows decode zeros;
* duplexcadence, in turn: one runtime at B=1 with N session slots (`Session.step`);
* duplexcadence, lockstep B=R: `LockstepGroup`s of R rows (one runtime at B=R, one slot per group),
  a joining session zeroes its row; one replay per group per frame.

Bits: the lockstep rows are compared with moshi's batched rows (same batch, same joins: they must be
equal) and with the same sessions decoded in turn at B=1 (reported: batch-R kernels may differ); the
in-turn runtime with moshi in turn. `peak_allocated_bytes`: the peak of each kind above what was allocated
before it (its weights, state, arena and graph pools; the base model every kind copies from is not
counted). JSON to --out.

    source scripts/device_setup.sh
    python scripts/lockstep_density.py --rows 32 --out mimi_lockstep_density.json
    python scripts/lockstep_density.py --cpu-dry-run --out /tmp/lockstep.json   # a smoke test, times mean nothing
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import sys
import time
from pathlib import Path

import torch

from duplexcadence.examples.moshi.cadence import load_runtime
from duplexcadence.examples.moshi.model import build_mimi
from duplexcadence.examples.moshi.stock import MoshiStockDecoder
from duplexcadence.interpreter.runtime.lockstep import LockstepGroup
from duplexcadence.interpreter.runtime.verify import count_unequal, deterministic_cudnn

_spec = importlib.util.spec_from_file_location("sessions_density", Path(__file__).with_name("sessions_density.py"))
density = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(density)  # Served, sweep, log: the same rounds and statistics as sessions_density.py
log = density.log


class StockBatch:
    """moshi's batched streaming decode as a group of rows: `join()` resets a free row."""

    def __init__(self, mimi, rows: int, mode: str):
        self.decoder = MoshiStockDecoder(mimi, rows, mode=mode)
        self.rows = rows
        self.members: list[object | None] = [None] * rows
        self.device = next(mimi.parameters()).device

    def join(self, member) -> int:
        row = self.members.index(None)
        mask = torch.zeros(self.rows, dtype=torch.bool)
        mask[row] = True
        self.decoder.reset(mask.to(self.device))
        self.members[row] = member
        return row

    def step(self, frames: dict) -> dict:
        batch = None
        for member, codes in frames.items():
            if batch is None:
                batch = torch.zeros((self.rows,) + tuple(codes.shape[1:]), dtype=codes.dtype, device=codes.device)
            batch[self.members.index(member)] = codes[0]
        pcm = self.decoder.step(batch)
        return {member: pcm[self.members.index(member)].unsqueeze(0) for member in frames}


class Batched:
    """Sessions spread over groups of `rows`: make(i) joins the first group with a free row (a new group
    when all are full); step_all steps every group once with its members' frames."""

    def __init__(self, new_group, join):
        self.new_group, self.join = new_group, join
        self.groups: list = []
        self.group_of: dict = {}

    def make(self, index: int):
        group = next((g for g in self.groups if None in g.members), None)
        if group is None:
            group = self.new_group(len(self.groups))
            self.groups.append(group)
        member = self.join(group, index)
        self.group_of[member] = group
        return member

    def step_all(self, steps: dict) -> dict:
        by_group: dict = {}
        for member, codes in steps.items():
            by_group.setdefault(id(self.group_of[member]), (self.group_of[member], {}))[1][member] = codes
        outputs: dict = {}
        for group, frames in by_group.values():
            outputs.update(group.step(frames))
        return outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32, help="R: sessions per batched replay")
    parser.add_argument("--in-turn-sessions", default="16,24,32,40,48", help="counts for the in-turn kinds")
    parser.add_argument("--batched-sessions", default="64,128,192,256,320,384", help="counts for the batched kinds")
    parser.add_argument("--stock-mode", default="stock", help="MoshiStockDecoder mode of the moshi kinds")
    density.add_round_arguments(
        parser, 4, "1 then 3 sessions (a late join), rows 2, rounds of 2 frames", "mimi_lockstep_density.json"
    )
    args = parser.parse_args()
    if args.cpu_dry_run:
        density.DEVICE, density.DRY_RUN = "cpu", True
        args.rows, args.in_turn_sessions, args.batched_sessions, args.rounds = 2, "1,3", "1,3", 1
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --cpu-dry-run)", file=sys.stderr)
        return 2
    device = density.DEVICE
    in_turn, batched = density.parse_counts(args.in_turn_sessions), density.parse_counts(args.batched_sessions)
    codes_of = density.session_codes([in_turn, batched], args.rounds, args.warmup_rounds)

    payload: dict = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "tail": "Moshi's Mimi decoder (moshi 0.2.13), fp32, 8 codebooks, one conversation per session",
        "rows": args.rows,
        "stock_mode": args.stock_mode,
        "frames_per_round": "13, 12 alternating (12.5 Hz)",
        "results": [],
    }
    started = time.perf_counter()
    outputs: dict[str, list] = {}
    base = build_mimi(seed=1234, device=device)

    def record(result: dict, served, kind: str, compare_with: list[str], peak_from: int) -> None:
        result["peak_allocated_bytes"] = (torch.cuda.max_memory_allocated() - peak_from) if device == "cuda" else None
        for name in compare_with:
            compared, mismatched = count_unequal(served.outputs, outputs[name])
            result[f"frames_compared_with_{name}"] = compared
            result[f"frames_not_equal_to_{name}"] = mismatched
            log(f"{kind} vs {name}: {compared} frames compared, {mismatched} differ")
        outputs[kind] = served.outputs
        payload["results"].append(result)

    def start_peak() -> int:
        """Collect the previous kind's garbage first (moshi's streaming state holds cycles): otherwise it
        is freed during this kind's sweep and hides this kind's allocations from the peak."""
        gc.collect()
        if device != "cuda":
            return 0
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def measure(kind: str, lanes: int, make, step_one, step_all, counts: list[int], peak_from: int | None = None):
        peak_from = start_peak() if peak_from is None else peak_from
        served = density.Served(kind, lanes, make, step_one, step_all, codes_of)
        return density.sweep(served, counts, args.rounds, args.warmup_rounds), served, peak_from

    with deterministic_cudnn(), torch.no_grad():
        kind = "moshi stock, in turn"
        result, served, peak_from = measure(
            kind,
            0,
            lambda i: MoshiStockDecoder(copy.deepcopy(base), 1, mode=args.stock_mode),
            lambda decoder, codes: decoder.step(codes),
            None,
            in_turn,
        )
        record(result, served, kind, [], peak_from)
        del served

        kind = "duplexcadence, in turn"
        peak_from = start_peak()  # the peak counts the runtime's weights and arena
        runtime = load_runtime(copy.deepcopy(base), 1, device=device, sessions=max(in_turn))
        result, served, peak_from = measure(
            kind,
            1,
            lambda i, runtime=runtime: runtime.session(),
            lambda s, codes: s.step(codes=codes),
            None,
            in_turn,
            peak_from,
        )
        report = runtime.report()
        result.update(
            {
                "arena_bytes": report.arena_bytes,
                "session_bytes": report.session_bytes,
                "graphs_captured": report.graphs_captured,
                "eager_off_plan": report.eager_off_plan,
            }
        )
        record(result, served, kind, ["moshi stock, in turn"], peak_from)
        del served, runtime

        kind = f"moshi stock, batched B={args.rows}"
        groups = Batched(
            lambda g: StockBatch(copy.deepcopy(base), args.rows, args.stock_mode),
            lambda group, index: (group.join(index), index)[1],
        )
        # a stock member is its session index (StockBatch keys rows by it)
        result, served, peak_from = measure(kind, 0, groups.make, None, groups.step_all, batched)
        result["groups"] = len(groups.groups)
        record(result, served, kind, [], peak_from)
        del served, groups

        kind = f"duplexcadence, lockstep B={args.rows}"
        group_count = -(-max(batched) // args.rows)
        peak_from = start_peak()
        runtime = load_runtime(copy.deepcopy(base), args.rows, device=device, sessions=group_count)
        groups = Batched(lambda g, runtime=runtime: LockstepGroup(runtime), lambda group, index: group.join())
        result, served, peak_from = measure(kind, 1, groups.make, None, groups.step_all, batched, peak_from)
        report = runtime.report()
        result.update(
            {
                "groups": len(groups.groups),
                "arena_bytes": report.arena_bytes,
                "session_bytes_per_group": report.session_bytes,
                "graphs_captured": report.graphs_captured,
                "eager_off_plan": report.eager_off_plan,
            }
        )
        record(result, served, kind, [f"moshi stock, batched B={args.rows}", "duplexcadence, in turn"], peak_from)
        del served, groups, runtime

    density.write_results(payload, "moshi stock, in turn", "ratio_to_moshi_stock_in_turn", started, args.out)
    must_equal = [r.get(f"frames_not_equal_to_moshi stock, batched B={args.rows}", 0) for r in payload["results"]]
    must_equal += [r.get("frames_not_equal_to_moshi stock, in turn", 0) for r in payload["results"]]
    return 0 if sum(must_equal) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
