"""Mimi at its released size with seeded random weights, and control of moshi's compile switch.

No weights can be downloaded, so :func:`build_mimi` builds the released architecture with
``moshi.models.loaders.get_mimi(None, num_codebooks=8)`` (the ``_seanet_kwargs``,
``_quantizer_kwargs`` and ``_transformer_kwargs`` of moshi 0.2.13) under a fixed seed.

Without a checkpoint every codebook starts with ``embedding_sum = 0`` and ``cluster_usage = 1``
(moshi ``quantization/core_vq.py``, ``EuclideanCodebook.__init__``), so every code would decode
to a zero latent. :func:`fill_codebooks` fills each ``embedding_sum`` with seeded standard normal
values so that the decoder sees non-trivial activations.

moshi wraps ``apply_rope``, ``_rms_norm`` and the gating kernel in ``torch_compile_lazy``
(moshi ``utils/compile.py``). That wrapper reads the environment variable ``NO_TORCH_COMPILE``
once, when the decorated function is defined, i.e. when ``moshi.modules`` is first imported:
any non-empty value (even ``"0"``) leaves the plain eager function in place. A process therefore
has one setting for stock and runtime alike; :func:`configure_torch_compile` sets it before
moshi is imported and refuses to pretend afterwards. On CPU moshi never compiles anyway
(``StreamingTransformerLayer.forward`` enters ``no_compile()`` for non-CUDA inputs).
"""

from __future__ import annotations

import os
import sys

import torch

SAMPLE_RATE = 24_000
FRAME_RATE = 12.5
FRAME_SIZE = 1920
"""PCM samples produced per Mimi frame (80 ms at 24 kHz)."""
LATENT_STEPS_PER_FRAME = 2
"""Decoder-transformer steps per Mimi frame (12.5 Hz frames upsampled to 25 Hz)."""
NUM_CODEBOOKS = 8
"""Codebooks Moshi feeds to the Mimi decoder (``get_mimi`` default; the quantizer holds 32)."""
CARDINALITY = 2048
LATENT_DIM = 512
KV_CONTEXT = 250
"""Ring capacity of every decoder-transformer KV cache (``_transformer_kwargs['context']``)."""

_COMPILE_ENV = "NO_TORCH_COMPILE"


def moshi_is_imported() -> bool:
    """Whether moshi's compile-wrapped modules have already been imported in this process."""
    return "moshi.modules.rope" in sys.modules


def moshi_torch_compile_enabled() -> bool:
    """Whether moshi's ``apply_rope`` (and siblings) are wrapped in ``torch_compile_lazy``.

    ``torch_compile_lazy`` returns the function itself when ``NO_TORCH_COMPILE`` is set, and a
    ``functools.wraps`` wrapper (which has ``__wrapped__``) otherwise. Imports moshi.
    """
    from moshi.modules import rope

    return hasattr(rope.apply_rope, "__wrapped__")


def configure_torch_compile(enabled: bool) -> None:
    """Set moshi's ``NO_TORCH_COMPILE`` switch; call before anything imports moshi.

    If moshi is already imported, the setting is fixed for the process: this checks that it
    matches ``enabled`` and raises :class:`RuntimeError` otherwise.
    """
    if moshi_is_imported():
        actual = moshi_torch_compile_enabled()
        if actual != enabled:
            raise RuntimeError(
                f"moshi was already imported with torch compile {'on' if actual else 'off'}; "
                f"{_COMPILE_ENV} must be set before the first import of moshi"
            )
        return
    if enabled:
        os.environ.pop(_COMPILE_ENV, None)
    else:
        os.environ[_COMPILE_ENV] = "1"


def fill_codebooks(mimi: torch.nn.Module, seed: int) -> int:
    """Fill every codebook's ``embedding_sum`` with seeded N(0, 1) values; return how many.

    Also drops any cached ``_embedding`` table so that the next ``.embedding`` access recomputes
    it from the new sums (moshi caches it lazily on first use).
    """
    from moshi.quantization.core_vq import EuclideanCodebook

    generator = torch.Generator(device="cpu").manual_seed(seed)
    filled = 0
    for module in mimi.modules():
        if isinstance(module, EuclideanCodebook):
            values = torch.randn(module.embedding_sum.shape, generator=generator, dtype=torch.float32)
            module.embedding_sum.copy_(values.to(module.embedding_sum.dtype))
            module.register_buffer("_embedding", None, persistent=False)  # as moshi's own reset does
            filled += 1
    return filled


@torch.no_grad()
def build_mimi(
    seed: int = 1234,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    num_codebooks: int = NUM_CODEBOOKS,
):
    """Mimi (``moshi.models.compression.MimiModel``) at the released size with seeded random weights.

    The model is always built on CPU under ``torch.manual_seed(seed)`` (the global RNG is restored
    afterwards), its codebooks filled by :func:`fill_codebooks`, then moved to ``device`` and
    cast to ``dtype``, so every device gets the same weights. Returned in eval mode.
    """
    from moshi.models import loaders

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mimi = loaders.get_mimi(None, device="cpu", num_codebooks=num_codebooks)
    fill_codebooks(mimi, seed)
    mimi.to(device=device, dtype=dtype)
    mimi.eval()
    return mimi


def materialize_codebook_tables(mimi) -> int:
    """Create the lazily cached ``_embedding`` table of every codebook the decoder will read.

    moshi's ``EuclideanCodebook.embedding`` registers ``_embedding`` as a new buffer on first
    access (``embedding_sum / cluster_usage.clamp(min=epsilon)``). Done inside a CUDA-graph
    capture, that allocation would land in the graph's private pool; a runtime calls this once,
    eagerly, before capturing. Same arithmetic as the lazy path. Returns the number of tables.
    """
    quantizer = mimi.quantizer
    count = 0
    with torch.no_grad():
        for rvq, used in (
            (quantizer.rvq_first, quantizer.rvq_first.n_q),
            (quantizer.rvq_rest, quantizer.rvq_rest.n_q),
        ):
            for layer in list(rvq.vq.layers)[:used]:
                _ = layer._codebook.embedding  # the property registers the table on first access
                count += 1
    return count


def random_codes(batch_size: int, frames: int, seed: int = 0, num_codebooks: int = NUM_CODEBOOKS) -> torch.Tensor:
    """Seeded uniform codes, int64 ``[batch_size, num_codebooks, frames]`` in ``[0, 2048)``, on CPU."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, CARDINALITY, (batch_size, num_codebooks, frames), generator=generator)
