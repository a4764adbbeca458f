"""Moshi's Mimi decoder tail's serving adapter (`dsl serve moshi`): the runtime over a seeded Mimi at the
released size (`lanes`, or lockstep groups at batch `rows`), seeded codes per session, and moshi's own
streaming decode (`MoshiStockDecoder`, the bench's reference mode) as the stock loop, at batch 1 for a session
and at the group's batch for a lockstep group's rows."""

from __future__ import annotations

from typing import Any

import torch

from duplexcadence.examples.moshi.cadence import load_runtime
from duplexcadence.examples.moshi.model import CARDINALITY, NUM_CODEBOOKS, build_mimi
from duplexcadence.interpreter.serve.tail import LoadedTail, ServedTail

WEIGHTS_SEED = 1234
STOCK_MODE = "eager_compiled_rope"
"""`dsl bench moshi`'s reference: every kernel launched from Python, with moshi's shipped rope."""


def codes(seed: int, tick: int) -> dict[str, torch.Tensor]:
    """Session `seed`'s codes at frame `tick`: int64 [1, 8, 1] in [0, 2048), the same on every call."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + tick)
    return {"codes": torch.randint(0, CARDINALITY, (1, NUM_CODEBOOKS, 1), generator=generator)}


class MimiStock:
    """moshi's streaming decode of one session at batch 1 (`codes` by keyword, as the runtime)."""

    def __init__(self, mimi: Any):
        from duplexcadence.examples.moshi.stock import MoshiStockDecoder

        self.decoder = MoshiStockDecoder(mimi, 1, mode=STOCK_MODE)

    def reset(self) -> None:
        self.decoder.reset()

    def step(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decoder.step(codes)

    def close(self) -> None:
        self.decoder.close()


class MimiGroupStock:
    """moshi's batched streaming decode of a lockstep group's rows (`MoshiStockDecoder` at batch `rows`): a row
    joins with moshi's own `reset_streaming` of that row; idle rows decode zero codes, as the group feeds them."""

    def __init__(self, mimi: Any, rows: int):
        from duplexcadence.examples.moshi.stock import MoshiStockDecoder

        self.rows = rows
        self.device = next(mimi.parameters()).device
        self.decoder = MoshiStockDecoder(mimi, rows, mode=STOCK_MODE)

    def reset(self) -> None:
        self.decoder.reset()

    def join(self, row: int) -> None:
        mask = torch.zeros(self.rows, dtype=torch.bool)
        mask[row] = True
        self.decoder.reset(mask.to(self.device))

    def step(self, inputs: dict[int, dict[str, torch.Tensor]]) -> dict[int, dict[str, torch.Tensor]]:
        codes = torch.zeros((self.rows, NUM_CODEBOOKS, 1), dtype=torch.int64)
        for row, named in inputs.items():
            codes[row] = named["codes"][0]
        pcm = self.decoder.step(codes.to(self.device)).cpu()
        return {row: {"pcm": pcm[row : row + 1]} for row in inputs}

    def close(self) -> None:
        self.decoder.close()


def served(device: str = "cpu", seed: int | str = WEIGHTS_SEED) -> ServedTail:
    """`seed`: the weights' seed (`build_mimi`)."""
    weights = int(seed)
    stock_state: dict[str, Any] = {}

    def load(sessions: int = 1, lanes: int = 1, rows: int | None = None) -> LoadedTail:
        mimi = build_mimi(seed=weights, device=device)
        return LoadedTail(load_runtime(mimi, rows or 1, device=device, sessions=sessions, lanes=lanes))

    def stock(session_seed: int) -> MimiStock:
        """One stock session (or group) at a time: a new one ends the last (they share one Mimi's streaming state)."""
        if "mimi" not in stock_state:
            stock_state["mimi"] = build_mimi(seed=weights, device=device)
        if "last" in stock_state:
            stock_state.pop("last").close()
        stock_state["last"] = MimiStock(stock_state["mimi"])
        return stock_state["last"]

    def stock_group(rows: int) -> MimiGroupStock:
        """One stock group (or session) at a time: a new one ends the last (they share one Mimi's streaming state)."""
        if "mimi" not in stock_state:
            stock_state["mimi"] = build_mimi(seed=weights, device=device)
        if "last" in stock_state:
            stock_state.pop("last").close()
        stock_state["last"] = MimiGroupStock(stock_state["mimi"], rows)
        return stock_state["last"]

    return ServedTail(
        "moshi",
        load,
        device=device,
        inputs=codes,
        stock=stock,
        options={"seed": str(weights)},
        stock_group=stock_group,
        input_bounds={"codes": (0, CARDINALITY - 1)},
    )
