"""Qwen3-Omni's Code2Wav tail (transformers' ``Qwen3OmniMoeCode2Wav``) under DuplexCadence.

``model`` builds the released-size module with seeded weights and holds ``forward_for_capture``;
``stock`` is the stock one-second streaming loop (``chunked_decode``'s arithmetic per second).
Both need the optional ``transformers`` install described in this folder's README.md, so nothing
is imported here.
"""
