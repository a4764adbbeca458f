"""PersonaPlex's token-to-audio tail: the Mimi decoder under the old-moshi state handling.

PersonaPlex (NVIDIA/personaplex) vendors an old moshi (0.1.0) whose streaming code keeps the
conv carries as ``torch.cat`` results and views (new addresses every tick), runs SEANet eagerly,
CUDA-graphs only the transformers, and decodes every tick with two Mimi instances. :mod:`.stock`
reproduces that state handling on the modules (weights) of moshi 0.2.13; README.md maps each
piece to the upstream file it follows.

- :mod:`.cadence`: ``stdlib/models/personaplex_mimi_decoder.clock`` (a tick through both instances, as the
  server; the second instance's decode pruned, since nothing reads its PCM) bound to the reproduction over
  one copy of the weights; both instances' work as two sessions of one runtime.
- :mod:`.bench`: the ``dsl bench personaplex`` subject.
- :mod:`.infer`: ``python -m duplexcadence.examples.personaplex.infer``, stock vs DuplexCadence.

Nothing here imports ``moshi`` at package import time (see ``examples/moshi/model.py`` on
``NO_TORCH_COMPILE``).
"""
