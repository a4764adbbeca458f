"""PersonaPlex's token-to-audio tail: the Mimi decoder under the old-moshi state handling.

PersonaPlex (NVIDIA/personaplex) vendors an old moshi (0.1.0) whose streaming code keeps the
conv carries as ``torch.cat`` results and views (new addresses every tick), runs SEANet eagerly,
CUDA-graphs only the transformers, and decodes every tick with two Mimi instances. :mod:`.stock`
reproduces that state handling on the modules (weights) of moshi 0.2.13; ``UPSTREAM.md`` maps each
piece to the upstream file it follows.
"""
