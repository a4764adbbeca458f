"""`models.minicpmo45_duplex` at the live loop's sizes (examples/minicpmo45/unit_plan.py): the LLM's window is
what the graphed loop allocates for its static cache, byte for byte, at the released and the reduced sizes
and with another window; the encoder's cache starts over where `audio_embeddings_streaming` does."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from duplexcadence.examples.minicpmo45 import live  # noqa: E402
from duplexcadence.examples.minicpmo45.live_config import REDUCED, RELEASED, DecodeSettings  # noqa: E402
from duplexcadence.examples.minicpmo45.live_model import WindowSettings  # noqa: E402
from duplexcadence.examples.minicpmo45.live_static import StaticKV  # noqa: E402
from duplexcadence.examples.minicpmo45.unit_plan import audio_kept, unit_plan  # noqa: E402

WINDOWS = (WindowSettings(), WindowSettings(high=300, low=200))


@pytest.mark.parametrize("window", WINDOWS, ids=("basic", "small"))
@pytest.mark.parametrize("sizes", (RELEASED, REDUCED), ids=lambda s: s.name)
def test_the_llm_window_is_the_static_cache_of_the_graphed_loop(sizes, window):
    settings = DecodeSettings()
    capacity = live.llm_cache_capacity(window, settings)
    kv = StaticKV(
        sizes.llm_layers, sizes.llm_kv_heads, sizes.llm_head_dim, capacity, torch.bfloat16, torch.device("meta"), False
    )
    allocated = sum(t.numel() * t.element_size() for t in (*kv.keys, *kv.values))
    planned = unit_plan(sizes, window=window, settings=settings).region("llm_kv")
    assert (planned.capacity, planned.bytes) == (capacity, allocated)


def test_the_encoder_cache_starts_over_where_the_live_loop_does():
    positions, frames = RELEASED.audio_max_positions, 50 + 2  # a unit's encoder frames, with their context
    kept = audio_kept(positions)
    assert kept == 1400
    # audio_embeddings_streaming starts over once the cache and a unit's frames would reach the positions
    assert kept + frames < positions <= kept + 50 + frames
    assert unit_plan(RELEASED).region("audio_kv").capacity == kept + 50 <= positions
