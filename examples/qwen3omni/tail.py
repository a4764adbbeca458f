"""Qwen3-Omni's Code2Wav tail's registration (`duplexcadence.tails.qwen3omni`)."""

from duplexcadence.interpreter.tails import Tail, Upstream

TAIL = Tail(
    name="qwen3omni",
    summary="Qwen3-Omni's Code2Wav (transformers): a sliding-window transformer and a causal ConvNeXt/conv "
    "decoder; the stock chunked decode, one 1 s chunk a tick",
    package="duplexcadence.examples.qwen3omni",
    clock="models.qwen3_omni_code2wav",
    upstream=(
        Upstream(
            "huggingface/transformers",
            "src/transformers/models/qwen3_omni_moe/modeling_qwen3_omni_moe.py",
            "Qwen3OmniMoeCode2Wav: forward and chunked_decode",
        ),
    ),
    build_model="duplexcadence.examples.qwen3omni.model:build_code2wav",
    stock_loop="duplexcadence.examples.qwen3omni.stock:StockSecondDecoder",
    load_runtime="duplexcadence.examples.qwen3omni.cadence:load_runtime",
    subject="duplexcadence.examples.qwen3omni.bench:subject",
    extra="qwen3omni",
    requires=("transformers", "numpy"),
    offline="duplexcadence.examples.qwen3omni.stock:offline_decode",
)
