"""A Mimi frame of moshi's whole-step graph and of DuplexCadence, stepped in turn, with and without a stock
eager frame before each (diagnostic, not a benchmark): host time to return from the step, GPU time between
CUDA events around it, and wall time to the end of a synchronisation; medians over frames [--first, --last).
The default is the steady state (the KV ring is full at 125); `--first 13 --last 125` is the warm-up the
bench's ticks mostly fall in.

`--harness` times instead the bench's own runners (`dsl bench moshi`'s "moshi whole-step graph" and
"duplexcadence" variants, built by its subject with its seeds and inputs) stepped in turn, once plainly and
once with the bench's between-tick work (each output compared with `torch.equal` to the other side's):
it found no gap: the 0.15 ms a frame that `dsl bench` showed came from its profiler and its order
(docs/benchmarks.md, Moshi, fifth session).

`--profiler-aftereffect` times both sides in turn, then runs a torch.profiler session with CUDA activity
around a few steps of each (as `dsl bench` used to for its GPU-busy column after each variant's timed run),
then times them again over as many frames: CUPTI stays attached after the profiler stops.

    source scripts/device_setup.sh
    python scripts/mimi_step_conditions.py [--first 150 --last 300] [--harness | --profiler-aftereffect]
    python scripts/mimi_step_conditions.py --builds 6 [--ours-first] [--private-pools] [--eager-first N] \
        --first 13 --last 250
    python scripts/mimi_step_conditions.py --graph-phases [--theirs-first] --first 150 --last 300
    python scripts/mimi_step_conditions.py --state-flips [WORD ...] --first 13 --last 250
    python scripts/mimi_step_conditions.py --graph-count 8 --first 13 --last 250

`--builds` times each side built again and again, alone; `--graph-phases` splits each side's frame around
its one graph replay. They found the whole-step graph's fast first capture (docs/benchmarks.md, Moshi, fifth
session). `--state-flips` times the whole-step graph, built first, again after each thing DuplexCadence's
build does: it found what ends the fast state, eager work on a side stream (sixth session). `--graph-count`
times it after each of several DuplexCadence runtimes is loaded: the fourth Mimi-sized graph alive in the
process ends it too (seventh session).
"""

import argparse
import contextlib
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


def print_medians(title: str, samples: dict[str, list[tuple[float, float, float]]]) -> None:
    print(title)
    for name, rows in samples.items():
        host, events, wall = (statistics.median(column) for column in zip(*rows))
        print(f"  {name:24s} host {host:7.1f} us  events {events:7.1f} us  wall {wall:7.1f} us")


def profiler_aftereffect(first: int, last: int) -> None:
    """Both sides stepped in turn over frames [first, last), a CUDA-activity profiler session around 8
    frames of each, then as many frames again, timed the same way."""
    frames = 2 * last - first + 8
    codes = random_codes(1, frames, seed=3).cuda()
    whole = MoshiStockDecoder(build_mimi(device="cuda"), 1, mode="graphed_compiled_rope")
    session = load_runtime(build_mimi(device="cuda"), 1, device="cuda").session()
    sides = {"moshi whole-step": whole.step, "duplexcadence": lambda c: session.step(codes=c)}

    def stepped(begin: int, end: int, keep_from: int) -> dict[str, list[tuple[float, float, float]]]:
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
        for t in range(begin, end):
            for name, step in sides.items():
                sample = timed(step, codes[:, :, t : t + 1])
                if t >= keep_from:
                    samples[name].append(sample)
        return samples

    with torch.no_grad():
        print_medians("before any profiler", stepped(0, last, first))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            for t in range(last, last + 8):
                for step in sides.values():
                    step(codes[:, :, t : t + 1])
            torch.cuda.synchronize()
        print_medians("after a torch.profiler session (CUDA activity) has stopped", stepped(last + 8, frames, last + 8))


def graph_phases(first: int, last: int, stock: str = "moshi whole-step graph", theirs_first: bool = False) -> None:
    """The bench subject's runners, each alone (as `dsl bench` times them one after the other) and then in
    turn: per frame, CUDA events before and after every `CUDAGraph.replay` (both sides replay one graph
    per steady frame) split the frame's GPU time into before the replay (the input copy), the replay,
    and after it (the output copy), with the host's offset of the replay call from the step's start.
    DuplexCadence captures when it is built; with `theirs_first` the whole-step graph is captured (three
    steps) before that, the order in which it runs ~180 us a frame faster (docs/benchmarks.md)."""
    from duplexcadence.examples.moshi.bench import subject

    marks: list[tuple[float, torch.cuda.Event, torch.cuda.Event]] = []
    replay = torch.cuda.CUDAGraph.replay

    def marked_replay(graph):
        entered = time.perf_counter()
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        replay(graph)
        after.record()
        marks.append((entered, before, after))

    made = subject(device="cuda", seconds=last // 12 + 1)
    by_name = {variant.name: variant for variant in made.variants}
    runners = {stock: by_name[stock].make()}
    if theirs_first:
        with torch.no_grad():
            for t in range(3):
                runners[stock].step(**made.inputs(t))
        torch.cuda.synchronize()
    runners["duplexcadence"] = by_name["duplexcadence"].make()
    torch.cuda.CUDAGraph.replay = marked_replay
    try:
        for arrangement in ("alone", "in turn"):
            rows: dict[str, list[tuple[float, ...]]] = {name: [] for name in runners}
            order = [[name] for name in runners] if arrangement == "alone" else [list(runners)]
            for names in order:
                for name in names:
                    runners[name].reset()
                with torch.no_grad():
                    for t in range(last):
                        inputs = made.inputs(t)
                        for name in names:
                            marks.clear()
                            torch.cuda.synchronize()
                            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            began = time.perf_counter()
                            start.record()
                            runners[name].step(**inputs)
                            returned = time.perf_counter()
                            end.record()
                            torch.cuda.synchronize()
                            done = time.perf_counter()
                            if t >= first and len(marks) == 1:
                                entered, before, after = marks[0]
                                rows[name].append(
                                    (
                                        (entered - began) * 1e6,
                                        start.elapsed_time(before) * 1e3,
                                        before.elapsed_time(after) * 1e3,
                                        after.elapsed_time(end) * 1e3,
                                        (returned - began) * 1e6,
                                        (done - began) * 1e6,
                                    )
                                )
            print(
                f"{arrangement}: medians over frames [{first}, {last}) with one replay "
                "(replay called at host us; GPU us before / in / after the replay; host us; wall us)"
            )
            for name, frames in rows.items():
                if not frames:
                    print(f"  {name:24s} no frame with exactly one replay")
                    continue
                called, before, during, after, host, wall = (statistics.median(c) for c in zip(*frames))
                print(
                    f"  {name:24s} called {called:6.1f}  GPU {before:6.1f} / {during:7.1f} / {after:6.1f}  "
                    f"host {host:6.1f}  wall {wall:7.1f}  ({len(frames)} frames)"
                )
    finally:
        torch.cuda.CUDAGraph.replay = replay


@contextlib.contextmanager
def private_pools():
    """Every `torch.cuda.graph` capture inside gets a fresh private memory pool (the `pool` argument is
    dropped): DuplexCadence's captures of one lane otherwise share one pool."""
    original = torch.cuda.graph.__init__

    def without_pool(self, cuda_graph, pool=None, *args, **kwargs):
        original(self, cuda_graph, None, *args, **kwargs)

    torch.cuda.graph.__init__ = without_pool
    try:
        yield
    finally:
        torch.cuda.graph.__init__ = original


def median_wall_us(runner, made, first: int, last: int) -> float:
    """`runner` reset, then stepped through the subject's frames [0, last), each step synchronised: the
    median wall time in microseconds of frames [first, last)."""
    runner.reset()
    frames = []
    with torch.no_grad():
        for t in range(last):
            inputs = made.inputs(t)
            torch.cuda.synchronize()
            began = time.perf_counter()
            runner.step(**inputs)
            torch.cuda.synchronize()
            if t >= first:
                frames.append((time.perf_counter() - began) * 1e6)
    return statistics.median(frames)


def run_frames(step, made, count: int) -> None:
    """`step(**inputs)` for the subject's first `count` frames, then a synchronisation."""
    with torch.no_grad():
        for t in range(count):
            step(**made.inputs(t))
    torch.cuda.synchronize()


def builds(
    first: int,
    last: int,
    count: int,
    stock: str = "moshi whole-step graph",
    ours_first: bool = False,
    ours_in_private_pools: bool = False,
    eager_first: int = 0,
) -> None:
    """Each side of the bench subject built `count` times in turn, each build freed before the next and
    timed alone (synchronised per frame, as `dsl bench` does): how much a variant's time moves from one
    build to the next, at the same clocks, with the same kernels, on other addresses. With
    `ours_in_private_pools`, DuplexCadence's graphs are captured each into a pool of its own; with
    `eager_first`, that many frames of the stock eager variant run before the first build."""
    import gc

    from duplexcadence.examples.moshi.bench import subject

    made = subject(device="cuda", seconds=last // 12 + 1)
    by_name = {variant.name: variant for variant in made.variants}
    sides = ["duplexcadence", stock] if ours_first else [stock, "duplexcadence"]
    walls: dict[str, list[float]] = {name: [] for name in sides}
    if eager_first:
        eager = by_name["stock eager"].make()
        eager.reset()
        run_frames(eager.step, made, eager_first)
        del eager
        gc.collect()
    for build in range(count):
        for name in walls:
            pools = private_pools() if ours_in_private_pools and name == "duplexcadence" else contextlib.nullcontext()
            with pools:
                runner = by_name[name].make()
            walls[name].append(median_wall_us(runner, made, first, last))
            print(
                f"build {build}: {name:30s} wall {walls[name][-1]:7.1f} us (median of frames [{first}, {last}))",
                flush=True,
            )
            close = getattr(runner, "close", None)
            if callable(close):
                close()
            del runner
            gc.collect()
            torch.cuda.empty_cache()
    for name, values in walls.items():
        print(
            f"{name:30s} over {count} builds: min {min(values):7.1f}  median {statistics.median(values):7.1f}  "
            f"max {max(values):7.1f} us"
        )


def state_flips(first: int, last: int, only: list[str], stock: str = "moshi whole-step graph") -> None:
    """The whole-step graph, built first in the process (its fast state), timed alone again after each of
    the things DuplexCadence's build does, in turn (their effects add up, and what they build is kept
    alive until the last action frees it): which of them ends the fast state. `only`: the actions whose
    label holds one of these words, in their order (all when empty)."""
    import gc

    from duplexcadence.examples.moshi.bench import subject
    from duplexcadence.interpreter.bench import fresh_peak
    from duplexcadence.interpreter.runtime.runtime import _sync_debug

    kept = []

    def timed_alone(label: str) -> None:
        print(f"{label:60s} whole-step wall {median_wall_us(whole, made, first, last):7.1f} us", flush=True)

    def sync_debug_probe():
        with _sync_debug("error"):
            torch.ones(4, device="cuda").add_(1)

    def side_stream():
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.ones(4, device="cuda").add_(1)
        torch.cuda.synchronize()
        kept.append(stream)

    def small_graph():
        graph, static = torch.cuda.CUDAGraph(), torch.ones(4, device="cuda")
        with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle()):
            static.add_(1)
        graph.replay()
        kept.append((graph, static))

    def eager_frames():
        eager = by_name["stock eager"].make()
        eager.reset()
        run_frames(eager.step, made, 13)

    def no_compile_frames():
        eager = by_name["moshi fully eager (no compile)"].make()
        eager.reset()
        run_frames(eager.step, made, 13)

    def own_graphs_frames_freed():
        own = by_name["moshi stock (own graphs)"].make()
        own.reset()
        run_frames(own.step, made, 13)
        del own
        gc.collect()

    def between_variants():
        fresh_peak(torch.device("cuda"))

    def runtime_loaded():
        kept.append(load_runtime(build_mimi(device="cuda"), 1, device="cuda"))

    def many_slots_captured():
        runtime = load_runtime(build_mimi(device="cuda"), 1, device="cuda", sessions=16)
        kept.append((runtime, [runtime.session() for _ in range(16)]))

    def session_captured():
        kept.append(kept[-1].session())

    def duplexcadence():
        runner = by_name["duplexcadence"].make()
        runner.reset()
        kept.append(runner)

    def duplexcadence_freed():
        kept.clear()
        gc.collect()
        torch.cuda.empty_cache()

    def eager_session():
        runtime = load_runtime(build_mimi(device="cuda"), 1, device="cuda", graphs=False)
        session = runtime.session()
        run_frames(session.step, made, 13)
        kept.append((runtime, session))

    def second_whole_step():
        other = by_name[stock].make()
        other.reset()
        run_frames(other.step, made, 3)
        kept.append(other)

    def session_captured_as_moshi():
        import duplexcadence.interpreter.runtime.runtime as runtime_module

        runtime = load_runtime(build_mimi(device="cuda"), 1, device="cuda")
        runtime_module._CAPTURE_STREAMS[runtime.device] = torch.cuda.graph.default_capture_stream
        runtime.pools = [None]
        kept.append(runtime.session())

    def session_captured_without_probe():
        import duplexcadence.interpreter.runtime.runtime as runtime_module

        probe = runtime_module._sync_debug
        runtime_module._sync_debug = lambda mode: contextlib.nullcontext()
        try:
            kept.append(load_runtime(build_mimi(device="cuda"), 1, device="cuda").session())
        finally:
            runtime_module._sync_debug = probe

    def eager_frames_on_side_stream():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            eager_frames()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        kept.append(stream)

    actions = {
        "after a sync-debug probe": sync_debug_probe,
        "after work on a new side stream": side_stream,
        "after a small graph captured into a new pool": small_graph,
        "after 13 stock eager frames": eager_frames,
        "after 13 stock eager frames on a new side stream": eager_frames_on_side_stream,
        "after 13 frames of moshi fully eager (no compile)": no_compile_frames,
        "after 13 frames of an eager DuplexCadence session (graphs=False)": eager_session,
        "after 13 frames of moshi stock (own graphs), freed": own_graphs_frames_freed,
        "after dsl bench's reset between variants (cuBLAS workspaces cleared, cache emptied)": between_variants,
        "after a second whole-step graph captured": second_whole_step,
        "after a DuplexCadence runtime loaded (no session)": runtime_loaded,
        "after its session captured its graphs": session_captured,
        "after a DuplexCadence session captured without its sync-debug probe": session_captured_without_probe,
        "after a DuplexCadence session captured as moshi captures (its stream and pool)": session_captured_as_moshi,
        "after 16 DuplexCadence sessions captured, one runtime of 16 slots": many_slots_captured,
        "after the bench's DuplexCadence runner built": duplexcadence,
        "after everything above freed": duplexcadence_freed,
    }
    chosen = list(actions) if not only else [label for label in actions if any(word in label for word in only)]
    if not chosen:
        raise SystemExit(
            f"--state-flips: no action's label holds {', '.join(map(repr, only))}; the actions are:\n  "
            + "\n  ".join(actions)
        )
    made = subject(device="cuda", seconds=last // 12 + 1)  # the actions above read these three when they run
    by_name = {variant.name: variant for variant in made.variants}
    whole = by_name[stock].make()
    timed_alone("built first")
    for label in chosen:
        actions[label]()
        timed_alone(label)


def graph_count(first: int, last: int, count: int, stock: str = "moshi whole-step graph") -> None:
    """The whole-step graph built first, timed alone again after each of `count` DuplexCadence runtimes of
    one session is loaded (each captures its own frame graph, all kept alive): after how many Mimi-sized
    graphs in the process the slow state begins (seventh session: the fourth)."""
    from duplexcadence.examples.moshi.bench import subject

    made = subject(device="cuda", seconds=last // 12 + 1)
    whole = {variant.name: variant for variant in made.variants}[stock].make()
    print(f"{'built first':45s} whole-step wall {median_wall_us(whole, made, first, last):7.1f} us", flush=True)
    kept = []
    for loaded in range(1, count + 1):
        session = load_runtime(build_mimi(device="cuda"), 1, device="cuda").session()
        kept.append(session)
        label = f"after {loaded} runtime(s), {sum(len(s.graphs) for s in kept)} graph(s) of ours"
        print(f"{label:45s} whole-step wall {median_wall_us(whole, made, first, last):7.1f} us", flush=True)


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
        print_medians("bench runners, " + ("each tick's outputs compared" if compare else "plain"), samples)
        for runner in runners.values():
            close = getattr(runner, "close", None)
            if callable(close):
                close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=150)
    parser.add_argument("--last", type=int, default=300)
    parser.add_argument("--harness", action="store_true", help="time the bench subject's own runners instead")
    parser.add_argument(
        "--builds", type=int, default=0, metavar="N", help="build each side N times in turn, each timed alone"
    )
    parser.add_argument("--ours-first", action="store_true", help="with --builds: build DuplexCadence first")
    parser.add_argument(
        "--private-pools",
        action="store_true",
        help="with --builds: capture each of DuplexCadence's graphs into a pool of its own",
    )
    parser.add_argument(
        "--eager-first",
        type=int,
        default=0,
        metavar="N",
        help="with --builds: run N frames of stock eager before the first build",
    )
    parser.add_argument(
        "--state-flips",
        nargs="*",
        metavar="WORD",
        help="time the whole-step graph built first, again after each thing DuplexCadence's build "
        "does (only the actions whose label holds one of the WORDs, if given)",
    )
    parser.add_argument(
        "--graph-count",
        type=int,
        default=0,
        metavar="N",
        help="time the whole-step graph built first, again after each of N DuplexCadence runtimes "
        "(one session each) is loaded",
    )
    parser.add_argument(
        "--theirs-first",
        action="store_true",
        help="with --graph-phases: capture the whole-step graph before DuplexCadence is built",
    )
    parser.add_argument(
        "--graph-phases", action="store_true", help="split each side's frame around its graph replay, alone and in turn"
    )
    parser.add_argument(
        "--profiler-aftereffect", action="store_true", help="time both sides before and after a torch.profiler session"
    )
    args = parser.parse_args()
    counts = {"--builds": args.builds, "--graph-count": args.graph_count, "--eager-first": args.eager_first}
    for flag, count in counts.items():
        if count < 0:
            parser.error(f"{flag} {count}: give a count of 0 or more")
    if not torch.cuda.is_available():
        raise SystemExit("mimi_step_conditions: needs a CUDA device (it times CUDA graph replays)")
    torch.backends.cudnn.deterministic = True
    if args.harness:
        harness(args.first, args.last)
        return
    if args.state_flips is not None:
        state_flips(args.first, args.last, args.state_flips)
        return
    if args.graph_count:
        graph_count(args.first, args.last, args.graph_count)
        return
    if args.builds:
        builds(
            args.first,
            args.last,
            args.builds,
            ours_first=args.ours_first,
            ours_in_private_pools=args.private_pools,
            eager_first=args.eager_first,
        )
        return
    if args.graph_phases:
        graph_phases(args.first, args.last, theirs_first=args.theirs_first)
        return
    if args.profiler_aftereffect:
        profiler_aftereffect(args.first, args.last)
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
                frame = codes[:, :, t : t + 1]
                if after_eager:
                    eager.step(frame)
                for name, step in sides.items():
                    sample = timed(step, frame)
                    if t >= args.first:
                        samples[name].append(sample)
        print_medians("after a stock eager frame" if after_eager else "back to back", samples)


if __name__ == "__main__":
    main()
