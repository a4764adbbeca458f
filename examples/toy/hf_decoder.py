"""A transformers streaming decoder at a toy size: the VibeVoice acoustic decoder of `transformers`.

`transformers`' `VibeVoiceAcousticTokenizerModel` (huggingface/transformers,
src/transformers/models/vibevoice_acoustic_tokenizer/modeling_vibevoice_acoustic_tokenizer.py) decodes latent
frames [B, T, hidden] (time on axis 1, not last) into audio [B, 1, T x 6] here, streaming through a padding
cache: `decode(latents, padding_cache=cache, use_cache=True)` returns a `ModelOutput` (`audio`,
`padding_cache`). With no cache it makes one, an empty container whose per-layer entries (`layers[key].cache`,
the last inputs of each causal convolution) are created on their first call, keyed by layer names whose numbers
skip (`convnext_layer_1` to `_3`, then `_5`, `_6`, `_8`, `_9`). Each upsampling stage runs its layers on a
faster clock. The weights are seeded random; the sizes are small so that the CPU runs it in milliseconds.

`DecoderStockStream` is its stock streaming loop; `hf_decoder.clock` declares its state (drafted with `dsl draft
duplexcadence.examples.toy.hf_decoder:stock_loop`, then named: docs/tutorial.md, "A transformers streaming
model"). Needs the `transformers` package (the `qwen3omni` extra).
"""

from __future__ import annotations

from typing import Any

import torch

HIDDEN = 8  # latent channels
RATIOS = (2, 3)  # the encoder's downsampling; the decoder upsamples by 3, then by 2
DEPTHS = (2, 2, 3)  # the encoder's ConvNeXt layers per stage; the decoder's are these reversed
LATENT_HZ = 7.5  # latent frames per second


def build_decoder(seed: int = 0, device: str | torch.device = "cpu") -> Any:
    """The model (a `VibeVoiceAcousticTokenizerModel`) with seeded random weights."""
    from transformers import VibeVoiceAcousticTokenizerConfig, VibeVoiceAcousticTokenizerModel

    torch.manual_seed(seed)
    config = VibeVoiceAcousticTokenizerConfig(
        hidden_size=HIDDEN,
        num_filters=4,
        downsampling_ratios=list(RATIOS),
        depths=list(DEPTHS),
        ffn_expansion=2,
        layer_scale_init_value=0.5,  # the released 1e-6 would make every ConvNeXt layer nearly the identity
    )
    model = VibeVoiceAcousticTokenizerModel(config).eval()
    return torch.nn.Module.to(model, device)


def make_latents(frames: int, seed: int = 0, batch: int = 1, device: str | torch.device = "cpu") -> torch.Tensor:
    """Seeded latent frames, [batch, frames, 8]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, HIDDEN, generator=generator).to(device)


class DecoderStockStream:
    """The stock streaming loop: one latent frame [B, 1, 8] in, its audio [B, 1, 6] out; the padding cache
    starts as None and is what each call returns."""

    def __init__(self, model: Any):
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.cache = None

    @torch.no_grad()
    def step(self, latents: torch.Tensor) -> torch.Tensor:
        output = self.model.decode(latents, padding_cache=self.cache, use_cache=True)
        self.cache = output.padding_cache
        return output.audio


def stock_loop(frames: str = "12"):
    """The stock loop for `dsl draft duplexcadence.examples.toy.hf_decoder:stock_loop`: `decode`, called with the
    cache it returned last (None at first) by the keyword `padding_cache`, and `use_cache=True`."""
    from duplexcadence.interpreter.draft.loop import StockLoop

    model = build_decoder()
    latents = make_latents(int(frames))
    return StockLoop(
        model=model,
        step=model.decode,
        feed=lambda t: {"latents": latents[:, t : t + 1]},
        rate=LATENT_HZ,
        handback="padding_cache",
        keywords={"use_cache": True},
        time_axis={"latents": 1},
    )
