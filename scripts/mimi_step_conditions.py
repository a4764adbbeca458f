"""A Mimi frame of moshi's whole-step graph and of DuplexCadence, stepped in turn, with and without a stock
eager frame before each (diagnostic, not a benchmark): host time to return from the step, GPU time between
CUDA events around it, and wall time to the end of a synchronisation; medians over frames [--first, --last).
The default is the steady state (the KV ring is full at 125); `--first 13 --last 125` is the warm-up the
bench's ticks mostly fall in.

`--harness` times instead the bench's own runners (`dsl bench moshi`'s "moshi whole-step graph" and
"duplexcadence" variants, built by its subject with its seeds and inputs) stepped in turn, once plainly and
once with the bench's between-tick work (each output compared with `torch.equal` to the other side's):
`dsl bench` shows our step about 0.15 ms a frame behind that the plain measurement does not.

    source scripts/device_setup.sh
    python scripts/mimi_step_conditions.py [--first 150 --last 300] [--harness]
"""
import argparse
import statistics
import time

import torch

from duplexcadence.examples.moshi.cadence import load_runtime
from duplexcadence.examples.moshi.model import build_mimi, random_codes
from duplexcadence.examples.moshi.stock import MoshiStockDecoder


def timed(step, codes: torch.Tensor) -> tuple[float, float, float]:
    """(host us, CUDA-event us, wall us) of one synchronised call."""
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.perf_counter()
    begin.record()
    step(codes)
    returned = time.perf_counter()
    end.record()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (returned - start) * 1e6, begin.elapsed_time(end) * 1e3, (done - start) * 1e6


def harness(first: int, last: int, stock: str = "moshi whole-step graph") -> None:
    """The bench subject's runners (`stock` and DuplexCadence), stepped in turn, without and with the bench's
    between-tick comparison."""
    from duplexcadence.examples.moshi.bench import subject

    seconds = last // 12 + 1
    made = subject(device="cuda", seconds=seconds)
    by_name = {variant.name: variant for variant in made.variants}
    for compare in (False, True):
        runners = {name: by_name[name].make() for name in (stock, "duplexcadence")}
        for runner in runners.values():
            runner.reset()
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runners}
        with torch.no_grad():
            for t in range(last):
                inputs = made.inputs(t)
                outputs = {}
                for name, runner in runners.items():
                    sample = timed(lambda codes: outputs.__setitem__(name, runner.step(codes=codes)), inputs["codes"])
                    if t >= first:
                        samples[name].append(sample)
                if compare and not torch.equal(*outputs.values()):
                    raise SystemExit(f"frame {t}: the two sides differ")
        print("bench runners, " + ("each tick's outputs compared" if compare else "plain"))
        for name, rows in samples.items():
            host, events, wall = (statistics.median(column) for column in zip(*rows))
            print(f"  {name:24s} host {host:7.1f} us  events {events:7.1f} us  wall {wall:7.1f} us")
        for runner in runners.values():
            close = getattr(runner, "close", None)
            if callable(close):
                close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=150)
    parser.add_argument("--last", type=int, default=300)
    parser.add_argument("--harness", action="store_true", help="time the bench subject's own runners instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("mimi_step_conditions: needs a CUDA device (it times CUDA graph replays)")
    torch.backends.cudnn.deterministic = True
    if args.harness:
        harness(args.first, args.last)
        return
    codes = random_codes(1, args.last, seed=3).cuda()
    for after_eager in (False, True):
        eager = MoshiStockDecoder(build_mimi(device="cuda"), 1, mode="eager_compiled_rope")
        whole = MoshiStockDecoder(build_mimi(device="cuda"), 1, mode="graphed_compiled_rope")
        session = load_runtime(build_mimi(device="cuda"), 1, device="cuda").session()
        sides = {"moshi whole-step": whole.step, "duplexcadence": lambda c: session.step(codes=c)}
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
        with torch.no_grad():
            for t in range(args.last):
                frame = codes[:, :, t:t + 1]
                if after_eager:
                    eager.step(frame)
                for name, step in sides.items():
                    sample = timed(step, frame)
                    if t >= args.first:
                        samples[name].append(sample)
        print("after a stock eager frame" if after_eager else "back to back")
        for name, rows in samples.items():
            host, events, wall = (statistics.median(column) for column in zip(*rows))
            print(f"  {name:18s} host {host:7.1f} us  events {events:7.1f} us  wall {wall:7.1f} us")


if __name__ == "__main__":
    main()
