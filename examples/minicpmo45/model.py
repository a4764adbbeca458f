"""MiniCPM-o 4.5's token-to-audio tail (Step-Audio2 Token2wav) at released sizes with seeded random weights.

The modules are the package's own (``stepaudio2-minicpmo`` 0.1.1, imported by
:mod:`.package`), constructed the way the released ``flow.yaml`` / ``Token2wav.__init__``
construct them:

* ``UpsampleConformerEncoderV2(512 -> 512, linear input, pre-lookahead 3, 6 + 4 conformer layers,
  upsample x2, 8 heads, rel_pos_espnet / rel_selfattn, key bias, 2048 FFN, normalize_before)``
  (``stepaudio2/cosyvoice2/transformer/upsample_encoder_v2.py``);
* ``DiT(320 -> 80, hidden 512, depth 16, 8 heads x 64, mlp_ratio 4)``
  (``stepaudio2/cosyvoice2/flow/decoder_dit.py``);
* ``CausalConditionalCFM(DiT, inference_cfg_rate=0.7)`` (``flow_matching.py``), whose constructor
  draws ``rand_noise`` [1, 80, 30000] from the global CPU generator: the builder seeds torch first;
* ``CausalMaskedDiffWithXvec(512, 80, 192, "mel", 6561, encoder, decoder)`` (``flow.py``);
* ``HiFTGenerator()`` with its defaults (``stepaudio2/flashcosyvoice/modules/hifigan.py``),
  weight-norm parametrizations kept as in stock inference.

No weights can be downloaded, so the parameters are the constructors' own seeded random
initialisation, with one fix: the DiT is adaLN-zero, so its modulation layers, its final layer and
all its biases start at exactly zero, and with them at zero the DiT outputs exactly 0 for every
input (the ODE would never move the noise). Every parameter that is all zero after construction
(206 at released sizes: those of the DiT plus the encoder's LayerNorm biases) is filled with
N(0, 0.02) from a CPU generator seeded with the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from duplexcadence.examples.minicpmo45.package import load_stepaudio2

if TYPE_CHECKING:
    from duplexcadence.examples.minicpmo45.stepaudio2_types import CausalMaskedDiffWithXvec, HiFTGenerator

SPEECH_TOKEN_VOCAB = 6561
SILENCE_TOKEN = 4218
"""Speech token MiniCPM-o and ``Token2wav.set_stream_cache`` use as silence (3 of them pad the prompt)."""
PRE_LOOKAHEAD_TOKENS = 3
MEL_BINS = 80
SPEAKER_EMBEDDING_DIM = 192
SAMPLE_RATE = 24_000
SAMPLES_PER_MEL_FRAME = 480
"""HiFT upsampling 8 * 5 * 3 times the iSTFT hop 4: one 50 Hz mel frame is 480 samples at 24 kHz."""
FILL_STD = 0.02


@dataclass(frozen=True)
class TailConfig:
    """Sizes of the tail; the defaults are the released MiniCPM-o 4.5 / Step-Audio2 token2wav."""

    encoder_blocks: int = 6
    encoder_up_blocks: int = 4
    encoder_size: int = 512
    encoder_heads: int = 8
    encoder_linear_units: int = 2048
    dit_depth: int = 16
    dit_hidden: int = 512
    dit_heads: int = 8
    dit_head_dim: int = 64
    dit_mlp_ratio: float = 4.0
    inference_cfg_rate: float = 0.7
    hift_base_channels: int = 512
    """``HiFTGenerator(base_channels=...)``; the released tail uses the default 512."""

    def __post_init__(self) -> None:
        # The CFM / DiT cache buffers are hard-coded for 16 layers, 8 heads x 128 (k and v of 64)
        # and 1024 = 512 + 512 conv channels: only the depth may shrink.
        if not 1 <= self.dit_depth <= 16:
            raise ValueError("the package's DiT cache buffers hold at most 16 layers")
        if (self.dit_hidden, self.dit_heads, self.dit_head_dim) != (512, 8, 64):
            raise ValueError("the package's DiT cache buffers are sized for hidden 512, 8 heads x 64")


RELEASED = TailConfig()


def zero_parameter_count(config: TailConfig) -> int:
    """How many flow parameters are all zero after construction (206 at released sizes).

    Per DiT block 11 (q/k/v/proj biases, q_norm/k_norm biases, fc1/fc2 biases, the conv block's
    LayerNorm bias, the adaLN modulation weight and bias); 7 more in the DiT (the two timestep-MLP
    biases, the input projection bias, the final layer's modulation weight and bias and its
    linear weight and bias); in the encoder every LayerNorm bias (2 per conformer layer, the two
    input embeddings' and ``after_norm``).
    """
    return 11 * config.dit_depth + 7 + 2 * (config.encoder_blocks + config.encoder_up_blocks) + 3


@dataclass
class Token2wavTail:
    """The built tail: the flow (encoder + CFM/DiT) and the HiFT vocoder, in eval mode on ``device``."""

    flow: CausalMaskedDiffWithXvec
    """``CausalMaskedDiffWithXvec``; ``flow.half()`` was applied when ``float16``."""
    hift: HiFTGenerator
    """``HiFTGenerator``; always float32 (as in ``Token2wav``)."""
    config: TailConfig
    seed: int
    device: torch.device
    float16: bool
    filled_zero_parameters: tuple[str, ...]
    """Names of the flow parameters that were all zero after construction and got N(0, 0.02)."""


@dataclass
class PromptConditioning:
    """What ``Token2wav._prepare_prompt`` returns (``Token2wav.cache``), here random instead of from a prompt wav.

    ``prompt_frames`` = P mel frames = 2 x prompt tokens (the stock front end replicate-pads the
    prompt mel to exactly that length).
    """

    tokens: torch.Tensor
    """[1, P/2] int64 prompt speech tokens (s3tokenizer ids)."""
    tokens_lens: torch.Tensor
    """[1] int32."""
    speaker_embedding: torch.Tensor
    """[1, 192] float32 (campplus output)."""
    mels: torch.Tensor
    """[1, P, 80] float32 prompt mel."""
    mels_lens: torch.Tensor
    """[1] int32."""

    @property
    def prompt_frames(self) -> int:
        return int(self.mels.shape[1])

    def as_token2wav_cache(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The 5-tuple ``Token2wav.stream`` unpacks from ``self.cache``."""
        return self.tokens, self.tokens_lens, self.speaker_embedding, self.mels, self.mels_lens


def _fill_all_zero_parameters(module: torch.nn.Module, seed: int) -> tuple[str, ...]:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    filled = []
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if torch.count_nonzero(parameter) == 0:
                noise = torch.empty(parameter.shape, dtype=torch.float32)
                noise.normal_(0.0, FILL_STD, generator=generator)
                parameter.copy_(noise)
                filled.append(name)
    return tuple(filled)


def build_tail(
    config: TailConfig = RELEASED,
    seed: int = 1234,
    device: str | torch.device = "cpu",
    float16: bool = False,
) -> Token2wavTail:
    """Build the tail with the package's modules and seeded random weights.

    ``torch.manual_seed(seed)`` is called before construction (so ``flow.decoder.rand_noise`` and
    every initial weight are a function of ``seed``); the global CPU generator is left in whatever
    state construction leaves it. ``float16`` applies ``flow.half()`` as ``Token2wav(float16=True)``
    does (the CFM / DiT buffers become float16 too; HiFT stays float32).
    """
    stepaudio2 = load_stepaudio2()
    device = torch.device(device)
    torch.manual_seed(seed)
    encoder = stepaudio2.upsample_encoder_v2.UpsampleConformerEncoderV2(
        input_size=config.encoder_size,
        output_size=config.encoder_size,
        input_layer="linear",
        pre_lookahead_len=PRE_LOOKAHEAD_TOKENS,
        num_blocks=config.encoder_blocks,
        num_up_blocks=config.encoder_up_blocks,
        up_stride=2,
        up_scale_factor=2,
        attention_heads=config.encoder_heads,
        pos_enc_layer_type="rel_pos_espnet",
        selfattention_layer_type="rel_selfattn",
        key_bias=True,
        linear_units=config.encoder_linear_units,
        normalize_before=True,
    )
    estimator = stepaudio2.decoder_dit.DiT(
        in_channels=4 * MEL_BINS,
        out_channels=MEL_BINS,
        mlp_ratio=config.dit_mlp_ratio,
        depth=config.dit_depth,
        num_heads=config.dit_heads,
        head_dim=config.dit_head_dim,
        hidden_size=config.dit_hidden,
    )
    decoder = stepaudio2.flow_matching.CausalConditionalCFM(estimator, inference_cfg_rate=config.inference_cfg_rate)
    flow = stepaudio2.flow.CausalMaskedDiffWithXvec(
        input_size=config.encoder_size,
        output_size=MEL_BINS,
        spk_embed_dim=SPEAKER_EMBEDDING_DIM,
        output_type="mel",
        vocab_size=SPEECH_TOKEN_VOCAB,
        encoder=encoder,
        decoder=decoder,
    )
    hift = stepaudio2.hifigan.HiFTGenerator(base_channels=config.hift_base_channels)
    filled = _fill_all_zero_parameters(flow, seed)
    if float16:
        flow.half()
    flow.to(device).eval()
    hift.to(device).eval()
    return Token2wavTail(
        flow=flow, hift=hift, config=config, seed=seed, device=device, float16=float16, filled_zero_parameters=filled
    )


def random_prompt(prompt_frames: int = 150, seed: int = 4321, device: str | torch.device = "cpu") -> PromptConditioning:
    """A reproducible stand-in for a prompt wav's front-end output (P = ``prompt_frames`` mel frames).

    Prompt tokens are uniform in the 6561-token vocabulary, the prompt mel and the speaker
    embedding standard normal, all from a CPU generator seeded with ``seed``.
    """
    if prompt_frames <= 0 or prompt_frames % 2:
        raise ValueError("the prompt mel is 2 frames per prompt token: prompt_frames must be even and positive")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    device = torch.device(device)
    token_count = prompt_frames // 2
    tokens = torch.randint(0, SPEECH_TOKEN_VOCAB, (1, token_count), generator=generator, dtype=torch.int64)
    mels = torch.randn(1, prompt_frames, MEL_BINS, generator=generator)
    speaker_embedding = torch.randn(1, SPEAKER_EMBEDDING_DIM, generator=generator)
    return PromptConditioning(
        tokens=tokens.to(device),
        tokens_lens=torch.tensor([token_count], dtype=torch.int32, device=device),
        speaker_embedding=speaker_embedding.to(device),
        mels=mels.to(device),
        mels_lens=torch.tensor([prompt_frames], dtype=torch.int32, device=device),
    )


def parameter_counts(tail: Token2wavTail) -> dict[str, int]:
    """Parameter counts by part (weight-norm parametrizations count their g and v)."""
    flow = tail.flow

    def count(module: torch.nn.Module) -> int:
        return sum(parameter.numel() for parameter in module.parameters())

    return {
        "encoder": count(flow.encoder),
        "dit": count(flow.decoder.estimator),
        "token_embedding": count(flow.input_embedding),
        "flow": count(flow),
        "hift": count(tail.hift),
    }
