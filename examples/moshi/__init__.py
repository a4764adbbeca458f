"""Moshi's token-to-audio tail: the Mimi decoder of PyPI ``moshi`` 0.2.13 at its released size.

Modules:

- :mod:`.model`: build Mimi with seeded random weights; control moshi's ``NO_TORCH_COMPILE`` switch.
- :mod:`.stages`: one decode frame split into three stages (codebooks + upsample, decoder
  transformer, SEANet decoder) with exactly the arithmetic of ``MimiModel.decode``.
- :mod:`.state`: every streaming-state tensor on the decode path, by attribute path, and
  rebinding of those tensors to externally allocated views.
- :mod:`.stock`: moshi's own streaming decode loop (stock, eager, whole-step CUDA graph).
- :mod:`.cadence`: ``stdlib/models/mimi_decoder.clock`` bound to a streaming Mimi.
- :mod:`.bench`: the ``dsl bench moshi`` subject.
- :mod:`.infer`: ``python -m duplexcadence.examples.moshi.infer``, stock vs DuplexCadence.
- :mod:`.live`: the live duplex loop of moshi's server (Mimi encode, ``LMGen.step`` with the 7B LM, Mimi
  decode), both decoders on the same tokens (CLI: ``scripts/moshi_live_duplex.py``).

Nothing here imports ``moshi`` at package import time, so that :func:`.model.configure_torch_compile`
can still set ``NO_TORCH_COMPILE`` before moshi is first imported.
"""
