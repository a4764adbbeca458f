"""`toy.clock` bound to the toy tail: the runtime over a `ToyTail` (no hooks: every stage calls a module path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = Path(__file__).with_name("toy.clock")


def load_runtime(model: torch.nn.Module, device: str | torch.device | None = None, **options: Any) -> Runtime:
    """A runtime for `model` (a `ToyTail` from `build_toy`); `options` go to `Runtime.load` (sessions, graphs...)."""
    device = device or next(model.parameters()).device
    return Runtime.load(CLOCK, model, device=device, **options)
