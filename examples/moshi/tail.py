"""Moshi's Mimi decoder tail's registration (`duplexcadence.tails.moshi`)."""

from duplexcadence.interpreter.tails import Tail, Upstream

MOSHI = "kyutai-labs/moshi"

TAIL = Tail(
    name="moshi",
    summary="Moshi's Mimi decoder (PyPI moshi 0.2.13): codebooks and upsample, an 8-layer transformer with "
    "250-step ring KV caches, SEANet; one 80 ms frame a tick",
    package="duplexcadence.examples.moshi",
    clock="models.mimi_decoder",
    upstream=(
        Upstream(MOSHI, "moshi/moshi/models/compression.py", "MimiModel.decode, the streaming decode"),
        Upstream(MOSHI, "moshi/moshi/models/loaders.py", "get_mimi, the released sizes"),
        Upstream(MOSHI, "moshi/moshi/modules/transformer.py", "RingKVCache and the streaming attention"),
        Upstream(MOSHI, "moshi/moshi/modules/conv.py", "the streaming conv and transposed-conv carries"),
        Upstream(MOSHI, "moshi/moshi/modules/seanet.py", "the SEANet decoder"),
        Upstream(MOSHI, "moshi/moshi/utils/compile.py", "CUDAGraphed and torch_compile_lazy"),
        Upstream(MOSHI, "moshi/moshi/server.py", "the live duplex loop (live.py)"),
    ),
    build_model="duplexcadence.examples.moshi.model:build_mimi",
    stock_loop="duplexcadence.examples.moshi.stock:MoshiStockDecoder",
    load_runtime="duplexcadence.examples.moshi.cadence:load_runtime",
    subject="duplexcadence.examples.moshi.bench:subject",
    extra="moshi",
    requires=("moshi", "einops", "safetensors", "sentencepiece"),
    serve="duplexcadence.examples.moshi.serve:served",
    offline="duplexcadence.examples.moshi.stock:offline_decode",
)
