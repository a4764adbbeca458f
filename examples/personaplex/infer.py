"""Decode N seconds of random codes with PersonaPlex's stock loop and with DuplexCadence; compare every frame.

    python -m duplexcadence.examples.personaplex.infer [--device cuda] [--seconds N] [--batch B]
        [--no-compile] [--stock-graphs]

Every tick decodes one 80 ms frame with BOTH Mimi instances, as PersonaPlex's server does (`mimi`,
whose PCM is sent, and `other_mimi`). Stock is the reproduction of PersonaPlex's old-moshi loop
(`stock.PersonaPlexTail`: two instances, two copies of the weights), by default with its
transformer graphs off (every kernel from Python; `--stock-graphs` runs it as shipped, moshi's
`CUDAGraphed` around each decoder transformer on CUDA). DuplexCadence is
`stdlib/models/personaplex_mimi_decoder.clock` bound to ONE model, both instances' work as two
sessions (`cadence.PersonaPlexCadenceTail`, each session the clock's `mimi`). Every frame of both instances is compared with
`torch.equal` (cuDNN deterministic). Printed per side: set-up time, ms per tick and per second of
audio (both instances), the state and peak memory. The default (11 s = 137 ticks, past the KV
ring's wrap at tick 125) takes a couple of minutes on a 2-core CPU.
"""

from __future__ import annotations

import sys

from duplexcadence.examples.moshi.infer import compare, parse_args, report, run_side, setup


def stock_state_bytes(tail) -> int:
    """Bytes of every storage the two stock instances' state tensors keep alive (each counted once)."""
    storages = {}
    for decoder in (tail.mimi, tail.other_mimi):
        for tensor in decoder.state_tensors().values():
            if tensor is not None:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(
        "PersonaPlex's Mimi tail (two instances per tick): stock loop vs DuplexCadence.",
        argv,
        [
            (
                "--stock-graphs",
                {"action": "store_true", "help": "stock as shipped: its transformer CUDA graphs on (CUDA)"},
            )
        ],
    )
    device, codes, compiled = setup(args)
    from duplexcadence.examples.moshi.model import build_mimi
    from duplexcadence.examples.personaplex.cadence import PersonaPlexCadenceTail
    from duplexcadence.examples.personaplex.stock import PersonaPlexTail

    print(
        f"PersonaPlex Mimi tail, released size, fp32, 8 codebooks, 2 instances per tick, B={args.batch}, "
        f"{codes.shape[-1]} ticks ({codes.shape[-1] / 12.5:g} s) on {device}, rope {'compiled' if compiled else 'eager'}"
    )
    stock = run_side(
        "personaplex",
        device,
        lambda: PersonaPlexTail(
            build_mimi(args.seed, device),
            batch_size=args.batch,
            graph_transformers=args.stock_graphs and device.type == "cuda",
        ),
        lambda tail, frame: tail.step(frame),
        stock_state_bytes,
        codes,
    )
    stock.note = "transformer graphs on" if args.stock_graphs and device.type == "cuda" else "eager"
    cadence = run_side(
        "duplexcadence",
        device,
        lambda: PersonaPlexCadenceTail(build_mimi(args.seed, device), args.batch, device=device),
        lambda tail, frame: tail.step(frame),
        lambda tail: tail.runtime.report().arena_bytes,
        codes,
    )
    cadence.note = "2 sessions of one runtime, " + (
        "graphs per stage" if device.type == "cuda" else "eager (no graphs on CPU)"
    )
    report([stock, cadence], device, frames_per_tick=2)
    problems = compare(stock.outputs, cadence.outputs, names=("main", "other"))
    if problems:
        print(f"NOT bit-identical: {len(problems)} differing outputs of {2 * len(stock.outputs)}; first: {problems[0]}")
        return 1
    print(f"bit-identical: all {len(stock.outputs)} ticks x 2 instances torch.equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
