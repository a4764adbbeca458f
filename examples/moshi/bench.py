"""Moshi's Mimi decoder tail as a benchmark subject (`dsl bench moshi`).

Variants, each with its own Mimi (same seeded weights), all decoding the same codes:

* stock eager: `mimi.decode` with moshi's CUDA graphs off and its rope compiled as shipped (unless
  `NO_TORCH_COMPILE` is set): the eager run of the stock op set, the bit-identity reference;
* moshi stock: `mimi.decode` as shipped (moshi's `CUDAGraphed` around the decoder transformer and
  SEANet, compiled rope; the codebook lookup and the upsample stay eager);
* moshi whole-step graph: moshi's `CUDAGraphed` around the whole `decode` (compiled rope inside);
* moshi fully eager: no graphs, no compile (another op set: not compared bit for bit when moshi
  compiles its rope);
* duplexcadence: the stdlib clock bound to Mimi, per-stage exact-shape graphs.

With `--compile` (`Subject.compile_variants`): the stock eager step's `mimi.decode` (moshi's graphs
off, its rope compiled as shipped) under `torch.compile(mode="reduce-overhead")` with
`torch._dynamo.config.allow_unspec_int_on_nn_module=True`. Without that setting dynamo guards on
moshi's python-int `offset_cpu`, recompiles every frame and falls back to eager after 8; with it there
is one recompile and no graph break, and the result is not bit-identical to eager (~5e-5).
"""

from __future__ import annotations

from fractions import Fraction

import torch

from duplexcadence.examples.moshi.model import build_mimi, moshi_torch_compile_enabled, random_codes
from duplexcadence.interpreter.bench import Subject, Variant, compiled_variant


class _Decoder:
    """A MoshiStockDecoder built lazily inside the variant (so its memory is measured)."""

    def __init__(self, batch: int, mode: str, device: torch.device, seed: int):
        from duplexcadence.examples.moshi.stock import MoshiStockDecoder

        self.decoder = MoshiStockDecoder(build_mimi(seed=seed, device=device), batch, mode=mode)

    def reset(self):
        self.decoder.reset()

    def step(self, codes):
        return self.decoder.step(codes)


def _compile_decode(runner: _Decoder, compile_fn):
    """Compile `mimi.decode` (the whole per-frame decode; `step` calls it inside `no_cuda_graph()`)."""
    mimi = runner.decoder.mimi
    mimi.decode = compile_fn(mimi.decode)
    return lambda: vars(mimi).pop("decode", None)


def compile_variants(batch: int, device: torch.device, seed: int) -> list[Variant]:
    return [
        compiled_variant(
            "stock step, torch.compile reduce-overhead",
            lambda: _Decoder(batch, "eager_compiled_rope", device, seed),
            install=_compile_decode,
            dynamo_config={"allow_unspec_int_on_nn_module": True},
            note="mimi.decode compiled, moshi's CUDAGraphed off; offset_cpu ints dynamic",
        )
    ]


class _Cadence:
    def __init__(self, batch: int, device: torch.device, seed: int):
        from duplexcadence.examples.moshi.cadence import load_runtime

        self.runtime = load_runtime(build_mimi(seed=seed, device=device), batch, device=device)
        self.session = self.runtime.session()

    def reset(self):
        self.session.reset()

    def step(self, codes):
        return self.session.step(codes=codes)


def _cadence_info(runner: _Cadence) -> dict:
    report = runner.runtime.report()
    return {
        "graphs": report.graphs_captured,
        "stage_graphs": report.stage_graphs_covered,
        "capture_seconds": report.capture_seconds,
        "arena_bytes": report.arena_bytes,
        "steps": runner.session.counters.steps,
        "short_path_steps": report.short_path_steps,
        "eager_planned": report.eager_planned,
        "eager_off_plan": report.eager_off_plan,
    }


def subject(device: str | torch.device = "cpu", seconds: int = 10, batch: int = 1, seed: int = 1234, **_) -> Subject:
    device = torch.device(device)
    # an input for each of the `seconds` of ticks (the GPU-busy profile re-runs the same ticks), and a margin
    frames = int(Fraction(25, 2) * seconds) + 2 * 13 + 16
    codes = random_codes(batch, frames, seed=seed + 1).to(device)
    compiled = device.type == "cuda" and moshi_torch_compile_enabled()
    variants = [Variant("stock eager", lambda: _Decoder(batch, "eager_compiled_rope", device, seed), reference=True)]
    if device.type == "cuda":
        variants += [
            Variant("moshi stock (own graphs)", lambda: _Decoder(batch, "stock", device, seed)),
            Variant("moshi whole-step graph", lambda: _Decoder(batch, "graphed_compiled_rope", device, seed)),
        ]
    variants.append(Variant("duplexcadence", lambda: _Cadence(batch, device, seed), info=_cadence_info))
    if device.type == "cuda":
        # last: a reference point, not a serving path (what slows the graph variants built after others is a
        # process's fourth large graph, not this one; docs/benchmarks.md, Moshi)
        variants.append(
            Variant(
                "moshi fully eager (no compile)", lambda: _Decoder(batch, "eager", device, seed), compare=not compiled
            )
        )
    rope = "compiled rope" if compiled else "eager rope"
    return Subject(
        "moshi",
        Fraction(25, 2),
        lambda t: {"codes": codes[:, :, t : t + 1]},
        variants,
        device,
        description=f"Mimi decoder (moshi 0.2.13), fp32, 8 codebooks, B={batch}, {rope}",
        warmup_ticks=13,
        tick_name="frame",
        extra={"batch": batch, "compiled_rope": compiled},
        compile_variants=compile_variants(batch, device, seed),
    )
