"""MiniCPM-o 4.5's token2wav tail's registration (`duplexcadence.tails.minicpmo45`)."""

from duplexcadence.interpreter.tails import Tail, Upstream

STEPAUDIO2 = "PyPI stepaudio2-minicpmo 0.1.1"

TAIL = Tail(
    name="minicpmo45",
    summary="MiniCPM-o 4.5's Step-Audio2 token2wav: conformer encoder, 16-layer DiT flow matching with CFG, "
    "HiFT vocoder; one 1 s chunk of 25 tokens a tick",
    package="duplexcadence.examples.minicpmo45",
    clock="models.step_audio2_token2wav",
    upstream=(
        Upstream(STEPAUDIO2, "stepaudio2/token2wav.py", "Token2wav.stream and set_stream_cache"),
        Upstream(STEPAUDIO2, "stepaudio2/cosyvoice2/flow/flow.py", "the flow's inference_chunk and setup_cache"),
        Upstream(STEPAUDIO2, "stepaudio2/cosyvoice2/flow/flow_matching.py", "the Euler solver and its caches"),
        Upstream(STEPAUDIO2, "stepaudio2/cosyvoice2/flow/decoder_dit.py", "the DiT estimator's forward_chunk"),
        Upstream(
            STEPAUDIO2, "stepaudio2/cosyvoice2/transformer/upsample_encoder_v2.py", "the conformer's forward_chunk"
        ),
        Upstream(STEPAUDIO2, "stepaudio2/flashcosyvoice/modules/hifigan.py", "the HiFT vocoder and its caches"),
        Upstream(
            "OpenBMB/MiniCPM-o-Demo",
            "MiniCPMO45/modeling_minicpmo.py",
            "the duplex driver: stream caches per voice, per-turn reset, the 28-token buffer",
        ),
    ),
    build_model="duplexcadence.examples.minicpmo45.model:build_tail",
    stock_loop="duplexcadence.examples.minicpmo45.stock:StockToken2wavSession",
    load_runtime="duplexcadence.examples.minicpmo45.cadence:load_runtime",
    subject="duplexcadence.examples.minicpmo45.bench:subject",
    extra="minicpmo45",
    requires=("stepaudio2", "einops", "onnxruntime", "scipy", "numpy"),
    serve="duplexcadence.examples.minicpmo45.serve:served",
    offline="duplexcadence.examples.minicpmo45.stock:offline_token2wav",
)
