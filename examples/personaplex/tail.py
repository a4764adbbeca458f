"""PersonaPlex's Mimi decoder tail's registration (`duplexcadence.tails.personaplex`)."""

from duplexcadence.interpreter.tails import Tail, Upstream

PERSONAPLEX = "NVIDIA/personaplex"

TAIL = Tail(
    name="personaplex",
    summary="PersonaPlex's Mimi decoder under old moshi's state handling (torch.cat carries, SEANet eager), "
    "two instances a tick",
    package="duplexcadence.examples.personaplex",
    clock="models.personaplex_mimi_decoder",
    upstream=(
        Upstream(PERSONAPLEX, "moshi/moshi/modules/conv.py", "StreamingConv1d, StreamingConvTranspose1d"),
        Upstream(PERSONAPLEX, "moshi/moshi/modules/streaming.py", "the raw streaming convs and StreamingAdd"),
        Upstream(PERSONAPLEX, "moshi/moshi/modules/transformer.py", "RingKVCache, the attention and its mask"),
        Upstream(PERSONAPLEX, "moshi/moshi/modules/rope.py", "apply_rope"),
        Upstream(PERSONAPLEX, "moshi/moshi/modules/seanet.py", "SEANetResnetBlock, SEANetDecoder"),
        Upstream(PERSONAPLEX, "moshi/moshi/models/compression.py", "MimiModel.decode, the graphed transformer"),
        Upstream(PERSONAPLEX, "moshi/moshi/server.py", "the two Mimi instances decoded every tick"),
    ),
    build_model="duplexcadence.examples.moshi.model:build_mimi",
    stock_loop="duplexcadence.examples.personaplex.stock:PersonaPlexTail",
    load_runtime="duplexcadence.examples.personaplex.cadence:load_runtime",
    subject="duplexcadence.examples.personaplex.bench:subject",
    extra="moshi",
    requires=("moshi", "einops", "safetensors", "sentencepiece"),
    # the same network, decoded whole by moshi 0.2.13's non-streaming path on the same weights
    offline="duplexcadence.examples.moshi.stock:offline_decode",
)
