"""Fixtures shared by the Mimi-tail tests (Moshi and PersonaPlex): one released-size Mimi and one
code stream per test module."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def mimi():
    """Mimi at its released size with seeded weights (examples/moshi/model.py), one per test module."""
    from duplexcadence.examples.moshi import model

    return model.build_mimi(seed=1234)


@pytest.fixture(scope="module")
def codes(request) -> torch.Tensor:
    """Random codes for the test module's `FRAMES` frames, B=1."""
    from duplexcadence.examples.moshi import model

    return model.random_codes(1, request.module.FRAMES, seed=7)
