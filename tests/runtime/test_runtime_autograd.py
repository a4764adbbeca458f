"""Stage bodies run without autograd, whatever the caller's grad mode.

A model's parameters require grad by default (`eval()` does not change that). If a stage body ran
with grad enabled, every in-place write into a region view (the KV `index_copy_`, the runtime's
`copy_` of a new version) would attach the region's arena memory to the autograd graph, and each
tick would chain a new node onto the last: an unbounded history (and the activations it saves) in a
serving process that never calls `torch.no_grad()`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from duplexcadence.examples.toy.model import build_toy, make_prompt
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"


def test_steps_with_grad_enabled_leave_no_autograd_history():
    model = build_toy()
    assert any(p.requires_grad for p in model.parameters())
    runtime = Runtime.load(CLOCK, model)
    session = runtime.session(initial={"cache": make_prompt(model, 6)})
    codes = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(0))
    assert torch.is_grad_enabled()
    for tick in range(30):
        pcm = session.step(codes=codes[:, tick : tick + 1])
        assert not pcm.requires_grad
    for name, storage in session.storage.items():
        assert storage.flat.grad_fn is None and not storage.flat.requires_grad, name
        assert not session.region(name).requires_grad, name
