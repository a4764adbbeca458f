"""Stock Code2Wav streaming at the one-second duplex cadence.

transformers' ``Qwen3OmniMoeCode2Wav.chunked_decode(codes, chunk_size=300, left_context_size=25)``
(``modeling_qwen3_omni_moe.py``, 5.17.0) decodes an utterance chunk by chunk: each chunk is
re-decoded together with up to 25 codes of left context (``context = 25 if start - 25 > 0 else
start``, i.e. ``min(25, start)``) and the context's ``context * 1920`` samples are dropped. Nothing
is carried between the forwards. ``StockSecondDecoder`` applies exactly that arithmetic per second:
second k brings codes ``[floor(12.5 k), floor(12.5 (k + 1)))`` (12, 13, 12, 13, ...), so the
forwards see 12, 25, then 37 and 38 codes alternating.

The boundary gap: one forward on T codes returns ``T * 1920 - 555`` samples (see
``model.forward_sample_deficit``), so each stock chunk after the first delivers ``n * 1920 - 555``
samples and the stream loses 555 samples (23 ms) at every boundary, the next chunk being placed
early. ``chunked_decode`` has the same gap at its 300-code boundaries. ``corrected=True`` drops
``context * 1920 - 555`` samples instead, which makes the stream continuous (chunk 0 delivers
``n * 1920 - 555``, every later chunk ``n * 1920``) at 555 samples of extra latency.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from duplexcadence.examples.qwen3omni.model import Qwen3OmniMoeCode2Wav, forward_sample_deficit, samples_per_code

__all__ = ["LEFT_CONTEXT_CODES", "StockSecondDecoder", "offline_decode", "second_bounds", "split_into_seconds"]

LEFT_CONTEXT_CODES = 25


def second_bounds(second: int) -> tuple[int, int]:
    """Code indices ``[floor(12.5 k), floor(12.5 (k + 1)))`` that arrive in second ``k``."""
    return (25 * second) // 2, (25 * (second + 1)) // 2


def split_into_seconds(codes: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield ``codes[..., start:end]`` for each whole second of a ``[B, 16, T]`` code tensor."""
    second = 0
    while True:
        start, end = second_bounds(second)
        if end > codes.shape[-1]:
            return
        yield codes[..., start:end]
        second += 1


class StockSecondDecoder:
    """The stock 1 s streaming loop: one eager forward per second on [context + new codes].

    ``step(new_codes)`` appends the new codes to the code history, decodes the last
    ``context + n`` codes with ``context = min(left_context, codes seen before this chunk)`` and
    returns the samples after the context: ``wav[..., context * 1920:]`` (stock) or
    ``wav[..., context * 1920 - 555:]`` (``corrected``; the first chunk, without context, is returned
    whole in both modes). ``input_lengths`` records the number of codes each forward received.

    The history kept is the last ``left_context`` codes, reassigned by ``torch.cat`` each step,
    which is the slice ``chunked_decode`` would take from the whole code tensor.
    """

    def __init__(
        self,
        model: Qwen3OmniMoeCode2Wav,
        *,
        left_context: int = LEFT_CONTEXT_CODES,
        corrected: bool = False,
    ) -> None:
        self.model = model
        self.left_context = left_context
        self.corrected = corrected
        self.samples_per_code = samples_per_code(model)
        self.sample_deficit = forward_sample_deficit(model)
        self.reset()

    def reset(self) -> None:
        """Forget the code history and the record of input lengths (a new utterance)."""
        self.history: torch.Tensor | None = None
        self.codes_seen = 0
        self.input_lengths: list[int] = []

    def samples_to_drop(self, context: int) -> int:
        """Leading samples of a forward with ``context`` codes of left context that are not emitted."""
        if context == 0:
            return 0
        dropped = context * self.samples_per_code
        return dropped - self.sample_deficit if self.corrected else dropped

    @torch.no_grad()
    def step(self, new_codes: torch.Tensor) -> torch.Tensor:
        """Decode one chunk of new codes ``[B, 16, n]``; return its waveform ``[B, 1, samples]``."""
        context = min(self.left_context, self.codes_seen)
        if context == 0:
            window = new_codes
        else:
            assert self.history is not None  # codes were seen, so a step kept them
            window = torch.cat([self.history[..., -context:], new_codes], dim=-1)
        wav = self.model(window)
        self.input_lengths.append(window.shape[-1])
        self.history = window[..., -self.left_context :]
        self.codes_seen += new_codes.shape[-1]
        return wav[..., self.samples_to_drop(context) :]


@torch.no_grad()
def offline_decode(model: Qwen3OmniMoeCode2Wav, codes: torch.Tensor) -> torch.Tensor:
    """One whole-utterance forward, the offline call a stream is compared with: codes ``[B, 16, T]`` ->
    ``[B, 1, T * 1920 - 555]``."""
    return model(codes)
