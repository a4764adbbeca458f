"""moshi 0.2.13's own streaming decode loop for Mimi, in the variants the bench compares.

``MoshiStockDecoder`` enters ``mimi.streaming(batch_size)`` once and keeps it entered (as moshi's
server does with ``streaming_forever``); ``step`` decodes one frame, ``reset`` calls
``mimi.reset_streaming()`` (in place, so graphs captured before stay valid).

Variants (``mode``):

- ``"stock"``: ``mimi.decode`` exactly as shipped. On CUDA that is not eager: ``MimiModel``'s
  streaming state wraps the decoder transformer and the SEANet decoder each in moshi's
  ``CUDAGraphed`` (eager first call, capture on the second), and ``apply_rope`` is
  torch-compiled unless ``NO_TORCH_COMPILE`` was set. On CPU both are off, so stock == eager.
- ``"eager"``: ``mimi.decode`` inside moshi's ``no_cuda_graph()`` and ``no_compile()``.
- ``"eager_compiled_rope"``: ``mimi.decode`` inside ``no_cuda_graph()`` only: every kernel launched
  from Python, with the shipped (compiled, unless ``NO_TORCH_COMPILE``) rope: the eager run of the
  stock op set, the bit-identity reference for anything that keeps the compiled rope.
- ``"graphed"``: moshi's ``CUDAGraphed`` around the whole ``mimi.decode`` inside ``no_compile()``:
  one graph replay per frame, eager kernels, bit-identical to ``"eager"`` (CUDA only).
- ``"graphed_compiled_rope"``: the same, keeping moshi's compiled rope inside the graph (the stock
  op set in one graph; CUDA only).

moshi's ``CUDAGraphed`` returns the same static output tensor on every replay; the graphed
variants return a clone so that outputs of successive frames do not alias.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from moshi.utils.compile import CUDAGraphed, no_compile, no_cuda_graph

MODES = ("stock", "eager", "eager_compiled_rope", "graphed", "graphed_compiled_rope")


class MoshiStockDecoder:
    """moshi's streaming Mimi decode, kept in streaming mode, one frame per :meth:`step`."""

    def __init__(self, mimi, batch_size: int = 1, mode: str = "stock") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mimi = mimi
        self.batch_size = batch_size
        self.mode = mode
        self.device = next(mimi.parameters()).device
        if mode.startswith("graphed") and self.device.type != "cuda":
            raise ValueError(f"mode {mode!r} needs a CUDA device, Mimi is on {self.device}")
        self._streaming = mimi.streaming(batch_size)
        self._graphed: CUDAGraphed | None = None
        if mode == "graphed":
            self._graphed = CUDAGraphed(self._decode_without_compile)
        elif mode == "graphed_compiled_rope":
            self._graphed = CUDAGraphed(self.mimi.decode)

    def _decode_without_compile(self, codes: torch.Tensor) -> torch.Tensor:
        with no_compile():
            return self.mimi.decode(codes)

    @torch.no_grad()
    def step(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode one frame: codes int64 ``[B, 8, 1]`` -> PCM ``[B, 1, 1920]``."""
        if self.mode == "stock":
            return self.mimi.decode(codes)
        if self.mode == "eager":
            with no_cuda_graph(), no_compile():
                return self.mimi.decode(codes)
        if self.mode == "eager_compiled_rope":
            with no_cuda_graph():
                return self.mimi.decode(codes)
        assert self._graphed is not None
        return self._graphed(codes).clone()

    @torch.no_grad()
    def reset(self, rows: torch.Tensor | None = None) -> None:
        """Start a new conversation on the same streaming state (moshi's ``reset_streaming``): every
        batch row, or only those where the bool mask ``rows`` [B] is True."""
        self.mimi.reset_streaming(rows)

    def close(self) -> None:
        """Leave streaming mode (drops the state)."""
        self._streaming.close()

    def __enter__(self) -> MoshiStockDecoder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@torch.no_grad()
def decode_frames(step: Callable[[torch.Tensor], torch.Tensor], codes: torch.Tensor) -> list[torch.Tensor]:
    """Run ``step`` on each frame of codes ``[B, K, T]``; return the T per-frame outputs."""
    return [step(codes[:, :, t : t + 1]) for t in range(codes.shape[-1])]


@contextlib.contextmanager
def eager_moshi() -> Iterator[None]:
    """moshi's CUDA graphs and torch.compile both off inside the block."""
    with no_cuda_graph(), no_compile():
        yield


@torch.no_grad()
def offline_decode(mimi, codes: torch.Tensor) -> torch.Tensor:
    """moshi's non-streaming ``mimi.decode`` of a whole code tensor, eager (no graphs, no compile): codes
    ``[B, 8, T]`` -> PCM ``[B, 1, T * 1920]``, the offline call a stream is compared with. ``mimi`` must
    not be in streaming mode: use another instance (same seed) than a streaming loop's or a runtime's."""
    with no_cuda_graph(), no_compile():
        return mimi.decode(codes)
