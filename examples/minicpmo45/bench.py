"""MiniCPM-o 4.5's token2wav tail as a benchmark subject (`dsl bench minicpmo45`): stock eager vs DuplexCadence.

One tick is one MiniCPM-o duplex second: 25 new speech tokens in (the 3 held lookahead tokens make
the 28-token window), one chunk of 24 kHz audio out (20 160 samples first, then 24 000), returned on
the host by both variants (stock ends with ``speech.cpu()``). Both variants drive one tail (the
weights are built once and counted in ``weights_bytes``); each variant allocates its own state when
it is made, so its peak memory shows it: stock's CFM / DiT buffers (1000 frames x 16 ODE slots) and
noise table, or the runtime's arena.

Variants: "stock eager" (the reference), "duplexcadence", and "duplexcadence, voice base on host"
(the set-up state every turn starts from kept in pinned host memory: the same chunks, less GPU memory).

With ``--compile``: stock eager with the flow's ``inference_chunk`` (the conformer encoder and the
CFM / DiT Euler loop, most of a chunk's GPU time) under ``torch.compile(mode="reduce-overhead")``;
HiFT stays eager (its iSTFT syncs with the host). Its outputs (the mel chunk and the new caches) are
cloned as they leave the compiled function, so the caches fed back next second are not graph-owned.
Note that importing the package's ``upsample_encoder_v2`` sets ``torch._dynamo.config.suppress_errors
= True`` for the whole process: a frame that fails to compile runs eagerly; the variant reports
``frames_failed`` and ``suppress_errors``. Never measured before; a failure is reported, not raised.

Options (``--option KEY=VALUE``): ``steps`` (Euler steps, 10 or 5), ``prompt`` (P mel frames, 150),
``seed`` (the session seed), ``reduced=1`` (the CI test tail, for a quick CPU run).
"""

from __future__ import annotations

from fractions import Fraction

import torch

from duplexcadence.examples.minicpmo45.cadence import load_runtime
from duplexcadence.examples.minicpmo45.model import RELEASED, TailConfig, Token2wavTail, build_tail, random_prompt
from duplexcadence.examples.minicpmo45.patches import estimator_cache_frames
from duplexcadence.examples.minicpmo45.stock import CHUNK_TOKENS, StockToken2wavSession
from duplexcadence.interpreter.bench import Subject, Variant, compiled_variant

STOCK_BUFFERS = (
    ("decoder", "att_cache_buffer"),
    ("decoder", "cnn_cache_buffer"),
    ("estimator", "att_cache_buffer"),
    ("estimator", "cnn_cache_buffer"),
)
REDUCED = TailConfig(encoder_blocks=1, encoder_up_blocks=1, dit_depth=1, hift_base_channels=32)


class StockBufferStore:
    """Takes the stock CFM / DiT buffers and the full noise table off the device and puts them back.

    Stock's buffers are zeros of fixed shapes; the noise table's values are kept on the host.
    """

    def __init__(self, tail: Token2wavTail):
        self.tail = tail
        decoder = tail.flow.decoder
        self.owners = {"decoder": decoder, "estimator": decoder.estimator}
        self.specs = {
            key: (getattr(self.owners[key[0]], key[1]).shape, getattr(self.owners[key[0]], key[1]).dtype)
            for key in STOCK_BUFFERS
        }
        self.noise = decoder.rand_noise.cpu()
        self.release()

    def release(self) -> None:
        for (owner, name), (shape, dtype) in self.specs.items():
            self.owners[owner]._buffers[name] = torch.empty(shape, dtype=dtype, device="meta")
        self.owners["decoder"]._buffers["rand_noise"] = torch.empty(
            self.noise.shape, dtype=self.noise.dtype, device="meta"
        )

    def install(self) -> None:
        """Stock's buffers and its whole noise table, on the device."""
        device = self.tail.device
        for (owner, name), (shape, dtype) in self.specs.items():
            self.owners[owner]._buffers[name] = torch.zeros(shape, dtype=dtype, device=device)
        self.owners["decoder"]._buffers["rand_noise"] = self.noise.to(device)

    def install_noise_head(self, frames: int) -> None:
        """Only the noise table's first `frames` frames, on the device (what `load_runtime` reads)."""
        self.owners["decoder"]._buffers["rand_noise"] = self.noise[:, :, :frames].to(self.tail.device)


class Runner:
    """The bench protocol (`reset()`, `step(tokens=...)`, `close()`) over a stock or a runtime MiniCPM-o
    session; `on_close` gives the variant's state back (stock's CFM / DiT buffers leave the device, so the
    next variant's peaks do not hold them)."""

    def __init__(self, session, bound=None, on_close=None):
        self.session = session
        self.bound = bound
        self.on_close = on_close

    @property
    def runtime(self):
        """The DuplexCadence runtime (None for stock): the bench reads its report."""
        return None if self.bound is None else self.bound.runtime

    def reset(self) -> None:
        self.session.reset()

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
            self.on_close = None

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        (chunk,) = self.session.push_tokens(tokens[0].tolist())
        return chunk


def _clone_tree(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_tree(v) for v in value)
    return value


def _compile_flow(tail: Token2wavTail):
    def install(runner: Runner, compile_fn):
        flow = tail.flow
        compiled = compile_fn(flow.inference_chunk)
        flow.inference_chunk = lambda *args, **kwargs: _clone_tree(compiled(*args, **kwargs))
        return lambda: vars(flow).pop("inference_chunk", None)

    return install


def _runtime_info(runner: Runner) -> dict:
    report = runner.bound.runtime.report()
    return {
        "graphs_captured": report.graphs_captured,
        "graphs_planned": report.graphs_planned,
        "capture_seconds": report.capture_seconds,
        "blocked": [d.message for d in report.blocked],
        "replays": report.replays,
        "eager_planned": report.eager_planned,
        "eager_off_plan": report.eager_off_plan,
        "arena_bytes": report.arena_bytes,
        "session_bytes": report.session_bytes,
        "scratch_bytes": report.scratch_bytes,
        "stock_bytes_of_declared_regions": report.stock_bytes,
    }


def subject(
    device: str | torch.device = "cuda",
    seconds: int = 10,
    batch: int = 1,
    dtype: str = "fp32",
    steps: int | str = 10,
    prompt: int | str = 150,
    seed: int | str = 0,
    reduced: int | str = 0,
    **_,
) -> Subject:
    """The bench subject; `batch` must be 1 (one session per chunk; sessions in turn: scripts/minicpmo45_gpu_bench.py)."""
    steps, prompt_frames, seed = int(steps), int(prompt), int(seed)
    if int(batch) != 1:
        raise ValueError(
            "the token2wav tail streams one session per call (batch 1); sessions served in turn are "
            "measured by scripts/minicpmo45_gpu_bench.py"
        )
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"the token2wav tail runs in fp32 or fp16 (flow.half()), not {dtype}")
    device = torch.device(device)
    float16 = dtype == "fp16"
    config = REDUCED if int(reduced) else RELEASED
    tail = build_tail(config, seed=1234, device=device, float16=float16)
    buffers = StockBufferStore(tail)
    # the conformers' positional tables go to the device on the first forward: move them now, so that
    # neither variant's peak counts these constants (they are added to the weights instead)
    tables = [tail.flow.encoder.embed.pos_enc, tail.flow.encoder.up_embed.pos_enc]
    for table in tables:
        table.extend_pe(torch.zeros(1, 1, device=device))  # float32: they follow the LayerNorm output
    conditioning = random_prompt(prompt_frames, seed=4321, device=device)
    ticks = int(seconds) * 2 + 32  # the bench also profiles steady ticks after the measured ones
    tokens = torch.randint(
        0, 6561, (1, CHUNK_TOKENS * ticks), generator=torch.Generator().manual_seed(2024 + seed), dtype=torch.int32
    )
    weights_bytes = sum(p.numel() * p.element_size() for module in (tail.flow, tail.hift) for p in module.parameters())
    weights_bytes += sum(table.pe.numel() * table.pe.element_size() for table in tables)

    def stock() -> Runner:
        buffers.install()
        session = StockToken2wavSession(tail, conditioning, n_timesteps=steps, session_seed=seed)
        return Runner(session, on_close=buffers.release)

    def cadence(base_on_host: bool = False) -> Runner:
        buffers.install_noise_head(estimator_cache_frames(prompt_frames))  # load_runtime keeps this much
        bound = load_runtime(tail, prompt_frames, steps)
        return Runner(bound.session(conditioning, seed=seed, base_on_host=base_on_host), bound)

    description = (
        f"Step-Audio2 token2wav ({'released' if config == RELEASED else 'reduced'} sizes), {dtype}, "
        f"n_timesteps={steps}, P={prompt_frames}"
    )
    return Subject(
        "minicpmo45",
        Fraction(1),
        lambda t: {"tokens": tokens[:, CHUNK_TOKENS * t : CHUNK_TOKENS * (t + 1)]},
        [
            Variant("stock eager", stock, reference=True),
            Variant("duplexcadence", cadence, info=_runtime_info),
            Variant("duplexcadence, voice base on host", lambda: cadence(base_on_host=True), info=_runtime_info),
        ],
        device,
        description=description,
        warmup_ticks=2,
        tick_name="chunk",
        weights_bytes=weights_bytes,
        extra={
            "dtype": dtype,
            "n_timesteps": steps,
            "prompt_frames": prompt_frames,
            "seed": seed,
            "released": config == RELEASED,
        },
        compile_variants=[
            compiled_variant(
                "stock step, torch.compile reduce-overhead",
                stock,
                install=_compile_flow(tail),
                note="flow.inference_chunk compiled, HiFT eager",
            )
        ],
    )
