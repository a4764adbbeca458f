"""The toy tail's serving adapter (`dsl serve toy`): a runtime over `build_toy`, sessions primed with the
prompt's keys and values, seeded codes per session, and `ToyStockStream` as the stock reference."""

from __future__ import annotations

import torch

from duplexcadence.examples.toy.cadence import load_runtime
from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.serve.tail import LoadedTail, ServedTail

PROMPT, WINDOW, VOCAB = 6, 20, 64


def codes(seed: int, tick: int) -> dict[str, torch.Tensor]:
    """Session `seed`'s codes at `tick`: int64 [1, 1], the same on every call."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + tick)
    return {"codes": torch.randint(0, VOCAB, (1, 1), generator=generator)}


class ToyStock:
    """`ToyStockStream` with the prompt every session starts from (`codes` by keyword, as the runtime)."""

    def __init__(self, device: str):
        model = build_toy(device=device)
        self.stream = ToyStockStream(model, make_prompt(model, PROMPT).to(device), WINDOW)

    def reset(self) -> None:
        self.stream.reset()

    def step(self, codes: torch.Tensor) -> torch.Tensor:
        return self.stream.step(codes.to(self.stream.prompt_cache.device))


def served(device: str = "cpu", seed: int | str = 0) -> ServedTail:
    """`seed`: the weights' seed (`build_toy`)."""
    weights = int(seed)

    def load(sessions: int = 1, lanes: int = 1, rows: int | None = None) -> LoadedTail:
        batch = rows or 1
        model = build_toy(seed=weights, device=device, batch=batch)
        params = {"B": batch} if rows is not None else None
        runtime = load_runtime(model, device=device, sessions=sessions, lanes=lanes, params=params)
        prompt = make_prompt(model, PROMPT, batch=batch).to(device)
        return LoadedTail(runtime, {"cache": prompt})

    def stock(session_seed: int) -> ToyStock:
        return ToyStock(device)

    return ServedTail(
        "toy",
        load,
        device=device,
        inputs=codes,
        stock=stock,
        options={"seed": str(weights)},
        input_bounds={"codes": (0, VOCAB - 1)},
    )
