"""PersonaPlex's Mimi decoder tail as a benchmark subject (`dsl bench personaplex`).

One tick = one 80 ms frame decoded by BOTH Mimi instances, as PersonaPlex's server does every tick
(`mimi` and `other_mimi`, same weights, same codes); each tick's outputs are `main` and `other`.
Variants, each building its own model(s) from the same seeded weights:

* stock eager: the reproduction of PersonaPlex's loop (`stock.PersonaPlexTail`) with its transformer
  graphs off: every kernel launched from Python, rope compiled as shipped (unless
  `NO_TORCH_COMPILE`); the bit-identity reference;
* personaplex stock (CUDA only; on CPU it is stock eager): the same loop as shipped, moshi's
  `CUDAGraphed` around each instance's decoder transformer, SEANet eager; two copies of the weights,
  as upstream loads Mimi twice;
* duplexcadence: `personaplex_mimi_decoder.clock` bound to one model, the two instances as two
  sessions of one runtime (each the clock's `mimi`), per-stage exact-shape graphs; one copy of the
  weights; all of stock's work, both PCMs compared;
* duplexcadence, 2 lanes: the same with the two sessions in two lanes, stepped together by
  `Runtime.step_many` (on CUDA their graphs replay concurrently on two streams; one more copy of
  the scratch block);
* duplexcadence, other_mimi pruned: the clock as the server runs it, one session; the plan leaves out
  `other_mimi`'s decode, whose PCM nothing reads (`PersonaPlexServerTail`): compared on `main`, the PCM
  the server sends;
* duplexcadence, both instances in one session: the same clock with `prune=False`, both decodes every
  tick, `mimi` first; compared on `main` (`other_mimi`'s PCM is scratch nothing reads);
* duplexcadence, lockstep B=2 (only with `--option lockstep=1`): the two instances as the two rows
  of one B=2 session (`PersonaPlexCadenceTail(..., lockstep=True)`), one replay per tick. Its rows
  are computed by batch-2 kernels: its `== stock eager` column says whether that changed the bits (on
  the H200 it does, so the command exits 1, as for any DuplexCadence variant that is not bit-identical).

With `--compile`: the stock eager loop's `step` (both instances, graphs off) under
`torch.compile(mode="reduce-overhead")`, moshi's python-int offsets made dynamic
(`allow_unspec_int_on_nn_module`, as moshi needs). Not measured before: its carries are rebuilt with
`torch.cat` and reassigned each tick, which cudagraph trees may refuse; a failure is reported.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from duplexcadence.examples.moshi.model import build_mimi, moshi_torch_compile_enabled, random_codes
from duplexcadence.interpreter.bench import Subject, Variant, compiled_variant, option_flag


class _Stock:
    """PersonaPlex's two-instance loop, built inside the variant (so its memory is measured)."""

    def __init__(self, batch: int, device: torch.device, seed: int, graph_transformers: bool):
        from duplexcadence.examples.personaplex.stock import PersonaPlexTail

        self.tail = PersonaPlexTail(
            build_mimi(seed=seed, device=device), batch_size=batch, graph_transformers=graph_transformers
        )

    def reset(self) -> None:
        self.tail.reset()

    def step(self, codes: torch.Tensor) -> dict[str, torch.Tensor]:
        main, other = self.tail.step(codes)
        return {"main": main, "other": other}


def _compile_step(runner: _Stock, compile_fn):
    tail = runner.tail
    vars(tail)["step"] = compile_fn(tail.step)  # shadows the method; the returned undo pops it
    return lambda: vars(tail).pop("step", None)


class _Server:
    """The clock as the server runs it: one session, `other_mimi` pruned unless `prune=False`."""

    def __init__(self, batch: int, device: torch.device, seed: int, prune: bool):
        from duplexcadence.examples.personaplex.cadence import PersonaPlexServerTail

        self.tail = PersonaPlexServerTail(build_mimi(seed=seed, device=device), batch, device=device, prune=prune)
        self.runtime = self.tail.runtime

    def reset(self) -> None:
        self.tail.reset()

    def step(self, codes: torch.Tensor) -> dict[str, torch.Tensor]:
        main, _ = self.tail.step(codes)
        return {"main": main}

    def close(self) -> None:
        self.tail.close()


class _Cadence:
    def __init__(self, batch: int, device: torch.device, seed: int, lanes: int = 1, lockstep: bool = False):
        from duplexcadence.examples.personaplex.cadence import PersonaPlexCadenceTail

        self.tail = PersonaPlexCadenceTail(
            build_mimi(seed=seed, device=device), batch, device=device, lanes=lanes, lockstep=lockstep
        )
        self.runtime = self.tail.runtime

    def reset(self) -> None:
        self.tail.reset()

    def step(self, codes: torch.Tensor) -> dict[str, torch.Tensor]:
        main, other = self.tail.step(codes)
        return {"main": main, "other": other}


def subject(
    device: str | torch.device = "cpu",
    seconds: int = 10,
    batch: int = 1,
    seed: int = 1234,
    dtype: str = "fp32",
    lockstep: str | bool = False,
    **_,
) -> Subject:
    if dtype != "fp32":
        raise ValueError(f"the PersonaPlex tail is benchmarked in fp32 (as PersonaPlex runs Mimi), not {dtype}")
    device = torch.device(device)
    ticks_per_second = Fraction(25, 2)
    # an input for each of the `seconds` of ticks (the GPU-busy profile re-runs the same ticks), and a margin
    frames = int(ticks_per_second * seconds) + 2 * int(ticks_per_second) + 16
    codes = random_codes(batch, frames, seed=seed + 1).to(device)
    compiled = device.type == "cuda" and moshi_torch_compile_enabled()
    variants = [Variant("stock eager", lambda: _Stock(batch, device, seed, graph_transformers=False), reference=True)]
    if device.type == "cuda":
        variants.append(Variant("personaplex stock", lambda: _Stock(batch, device, seed, graph_transformers=True)))

    def info(r) -> dict:
        report = r.runtime.report()
        return {
            "graphs": report.graphs_captured,
            "capture_seconds": report.capture_seconds,
            "arena_bytes": report.arena_bytes,
            "sessions": report.sessions,
            "lanes": report.lanes,
            "lockstep_rows": r.tail.group.rows if getattr(r.tail, "group", None) is not None else None,
            "pruned_stages": [stage.name for stage in r.runtime.plan.pruning.stages],
            "stages": list(r.runtime.plan.clocks.stage_order),
        }

    variants.append(Variant("duplexcadence", lambda: _Cadence(batch, device, seed), info=info))
    variants.append(Variant("duplexcadence, 2 lanes", lambda: _Cadence(batch, device, seed, lanes=2), info=info))
    variants.append(
        Variant(
            "duplexcadence, other_mimi pruned",
            lambda: _Server(batch, device, seed, prune=True),
            info=info,
            outputs=("main",),
        )
    )
    variants.append(
        Variant(
            "duplexcadence, both instances in one session",
            lambda: _Server(batch, device, seed, prune=False),
            info=info,
            outputs=("main",),
        )
    )
    if option_flag(lockstep):
        if batch != 1:
            raise ValueError(
                f"--option lockstep=1 decodes the two instances of one batch-1 stream as one B=2 "
                f"session: run it with --batch 1, not {batch}"
            )
        variants.append(
            Variant("duplexcadence, lockstep B=2", lambda: _Cadence(batch, device, seed, lockstep=True), info=info)
        )
    compile_variants = [
        compiled_variant(
            "stock step, torch.compile reduce-overhead",
            lambda: _Stock(batch, device, seed, graph_transformers=False),
            install=_compile_step,
            dynamo_config={"allow_unspec_int_on_nn_module": True},
            note="PersonaPlexTail.step compiled (both instances), transformer graphs off",
        )
    ]
    rope = "compiled rope" if compiled else "eager rope"
    return Subject(
        "personaplex",
        ticks_per_second,
        lambda t: {"codes": codes[:, :, t : t + 1]},
        variants,
        device,
        description=f"PersonaPlex Mimi decoder (old-moshi state handling on moshi 0.2.13 weights), "
        f"2 instances per tick, fp32, 8 codebooks, B={batch}, {rope}",
        warmup_ticks=13,
        tick_name="frame",
        extra={"batch": batch, "instances": 2, "compiled_rope": compiled},
        compile_variants=compile_variants,
    )
