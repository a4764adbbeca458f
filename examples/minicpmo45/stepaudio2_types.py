"""The classes of ``stepaudio2-minicpmo`` 0.1.1 as this tail uses them, for the type checker.

The package ships no types, and :mod:`.package` imports its modules at run time, so mypy cannot
see its classes. The declarations below name the attributes and methods the tail reads, replaces
on an instance or resizes, with the package's own class names (each docstring gives the upstream
file). They exist only while type checking: the objects are always the package's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import torch
    from torch import nn

    class TimestepEmbedder(nn.Module):
        """``stepaudio2/cosyvoice2/flow/decoder_dit.py``."""

        frequency_embedding_size: int
        timestep_embedding: Callable[..., torch.Tensor]  # a staticmethod upstream; patches.py shadows it

    class DiT(nn.Module):
        """``stepaudio2/cosyvoice2/flow/decoder_dit.py`` (the CFM's estimator)."""

        t_embedder: TimestepEmbedder
        att_cache_buffer: torch.Tensor
        cnn_cache_buffer: torch.Tensor

    class CausalConditionalCFM(nn.Module):
        """``stepaudio2/cosyvoice2/flow/flow_matching.py``."""

        estimator: DiT
        att_cache_buffer: torch.Tensor
        cnn_cache_buffer: torch.Tensor
        rand_noise: torch.Tensor

    class EspnetRelPositionalEncoding(nn.Module):
        """``stepaudio2/cosyvoice2/transformer/embedding.py``."""

        pe: torch.Tensor

        def extend_pe(self, x: torch.Tensor) -> None: ...

    class LinearNoSubsampling(nn.Module):
        """``stepaudio2/cosyvoice2/transformer/subsampling.py``."""

        pos_enc: EspnetRelPositionalEncoding

    class UpsampleConformerEncoderV2(nn.Module):
        """``stepaudio2/cosyvoice2/transformer/upsample_encoder_v2.py``."""

        embed: LinearNoSubsampling
        up_embed: LinearNoSubsampling

    class CausalMaskedDiffWithXvec(nn.Module):
        """``stepaudio2/cosyvoice2/flow/flow.py``: the flow (encoder + CFM / DiT)."""

        encoder: UpsampleConformerEncoderV2
        decoder: CausalConditionalCFM
        input_embedding: nn.Embedding
        # methods upstream; bench.py installs a compiled inference_chunk on the instance
        inference_chunk: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

        def inference(
            self,
            token: torch.Tensor,
            token_len: torch.Tensor,
            prompt_token: torch.Tensor,
            prompt_token_len: torch.Tensor,
            prompt_feat: torch.Tensor,
            prompt_feat_len: torch.Tensor,
            embedding: torch.Tensor,
            n_timesteps: int = 10,
        ) -> torch.Tensor: ...

        def setup_cache(
            self, token: torch.Tensor, mel: torch.Tensor, spk: torch.Tensor, n_timesteps: int = 10
        ) -> dict[str, torch.Tensor]: ...

    class SineGen2(nn.Module):
        """``stepaudio2/flashcosyvoice/modules/hifigan_components/layers.py``."""

        harmonic_num: int
        sine_amp: float
        noise_std: float

        def _f02sine(self, f0_values: torch.Tensor) -> torch.Tensor: ...

        def _f02uv(self, f0: torch.Tensor) -> torch.Tensor: ...

    class SourceModuleHnNSF2(nn.Module):
        """``stepaudio2/flashcosyvoice/modules/hifigan_components/layers.py``."""

        l_sin_gen: SineGen2

    class HiFTGenerator(nn.Module):
        """``stepaudio2/flashcosyvoice/modules/hifigan.py``: the vocoder."""

        istft_params: dict[str, int]
        audio_limit: float
        stft_window: torch.Tensor
        m_source: SourceModuleHnNSF2
        # a method upstream; cadence.py's deferred_istft replaces it on the instance
        _istft: Callable[[torch.Tensor, torch.Tensor], Any]
