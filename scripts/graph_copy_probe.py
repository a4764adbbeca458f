"""How the CUDA driver runs the device-to-device copies in captured graphs, and what each costs (diagnostic,
not a benchmark).

Several graphs of one shape are captured in turn in one process: a chain of `--units` units, each an
elementwise kernel, a contiguous `copy_` into a state tensor (a memcpy node) and a kernel that reads the
state back, as moshi's streaming convolutions do. Some are captured plainly, one with each copy made an
ATen elementwise kernel instead (the bytes read as signed integers and written as unsigned ones of the
same width: a dtype conversion, which ATen never turns into a memcpy, that keeps every bit), and one
chain has no copies at all. All are timed first (CUDA events around each replay, rounds interleaved),
then each is replayed once under torch.profiler (which stays attached afterwards, so it comes last) to count how
its copies ran: as the driver's copy kernels (`memcpy32_post`), on a copy engine (`Memcpy DtoD`), or
as ATen copy kernels.

    source scripts/device_setup.sh
    python scripts/graph_copy_probe.py [--units 30] [--numel 4096] [--replays 300]
    python scripts/graph_copy_probe.py --many 130 --units 150

`--many N` captures N graphs of the chain instead, one after another, and times the first, second, middle
and last of them: whether a graph's replay depends on how many graphs the process captured before it.
"""

import argparse
import statistics

import torch


def copy_as_kernel(destination: torch.Tensor, source: torch.Tensor) -> None:
    """`destination.copy_(source)` for float32, bit for bit, as an elementwise conversion kernel."""
    destination.view(torch.uint32).copy_(source.view(torch.int32))


def make_chain(units: int, numel: int, with_copies: bool, kernel_copies: bool = False):
    """A step function over fresh tensors: `units` times kernel, copy into a state, kernel reading it."""
    source = torch.randn(numel, device="cuda")
    states = [torch.zeros(numel, device="cuda") for _ in range(units)]

    def step() -> torch.Tensor:
        value = source
        for state in states:
            value = value.mul(0.5).add_(1.0)
            if kernel_copies:
                copy_as_kernel(state, value)
                value = state.add(value)
            elif with_copies:
                state.copy_(value)
                value = state.add(value)
            else:
                value = value.add(value)
        return value

    return step


def capture(step) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    return graph


def replay_times(graph: torch.cuda.CUDAGraph, count: int) -> list[float]:
    """Microseconds of GPU time per replay, each between CUDA events and synchronised."""
    times = []
    for _ in range(count):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return times


def copy_kinds(graph: torch.cuda.CUDAGraph) -> dict[str, int]:
    """How one replay's copies ran, by kind, from a profiler trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        graph.replay()
        torch.cuda.synchronize()
    kinds = {"driver copy kernel": 0, "copy engine": 0, "ATen copy kernel": 0, "other kernels": 0}
    for event in profile.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = event.name
        if "memcpy32" in name:
            kinds["driver copy kernel"] += 1
        elif name.startswith("Memcpy"):
            kinds["copy engine"] += 1
        elif "copy" in name.lower():
            kinds["ATen copy kernel"] += 1
        else:
            kinds["other kernels"] += 1
    return kinds


def many(count: int, units: int, numel: int, replays: int) -> None:
    with torch.no_grad():
        graphs = [capture(make_chain(units, numel, True)) for _ in range(count)]
        picked = sorted({0, 1, count // 2, count - 1})
        times: dict[int, list[float]] = {index: [] for index in picked}
        for _ in range(3):
            for index in picked:
                times[index] += replay_times(graphs[index], replays // 3)
        kinds = {index: copy_kinds(graphs[index]) for index in picked}
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {count} graphs of {units} units of {numel} floats"
    )
    for index in picked:
        ran = ", ".join(f"{kind} {n}" for kind, n in kinds[index].items() if n)
        print(f"graph {index + 1:4d} of {count}: replay {statistics.median(times[index]):8.1f} us  ({ran})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=30)
    parser.add_argument("--numel", type=int, default=4096)
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--many", type=int, default=0, metavar="N", help="capture N graphs and time a few of them")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("graph_copy_probe: needs a CUDA device (it captures and replays CUDA graphs)")
    if min(args.units, args.numel, args.replays) < 1 or args.many < 0:
        parser.error("--units, --numel and --replays must be at least 1, --many at least 0")
    if args.many:
        many(args.many, args.units, args.numel, args.replays)
        return
    order = [
        ("1st, memcpy copies", True, False),
        ("2nd, memcpy copies", True, False),
        ("3rd, copy kernels", True, True),
        ("4th, memcpy copies", True, False),
        ("5th, no copies", False, False),
    ]
    graphs = {}
    with torch.no_grad():
        for name, with_copies, kernel_copies in order:
            graphs[name] = capture(make_chain(args.units, args.numel, with_copies, kernel_copies))
        times: dict[str, list[float]] = {name: [] for name in graphs}
        for _ in range(3):
            for name, graph in graphs.items():
                times[name] += replay_times(graph, args.replays // 3)
        kinds = {name: copy_kinds(graph) for name, graph in graphs.items()}
    baseline = statistics.median(times["5th, no copies"])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.units} units of {args.numel} floats")
    print(f"{'graph (capture order)':22s} {'replay us':>10s} {'us/copy over no-copy':>21s}  copies ran as")
    for name in graphs:
        median = statistics.median(times[name])
        per_copy = (median - baseline) / args.units if name != "5th, no copies" else 0.0
        ran = ", ".join(f"{kind} {count}" for kind, count in kinds[name].items() if count)
        print(f"{name:22s} {median:10.1f} {per_copy:21.2f}  {ran}")


if __name__ == "__main__":
    main()
