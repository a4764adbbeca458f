"""The toy tail as a benchmark subject: stock eager vs DuplexCadence."""

from __future__ import annotations

from fractions import Fraction

import torch

from duplexcadence.examples.toy.cadence import load_runtime
from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.bench import Subject, Variant
from duplexcadence.interpreter.runtime.runtime import Runtime

PROMPT, WINDOW = 6, 20


class SessionRunner:
    """Adapts a runtime session to the bench protocol (`reset()`, `step(**inputs)`)."""

    def __init__(self, runtime: Runtime, initial=None, seed: int = 0):
        self.runtime = runtime
        self.session = runtime.session(initial=initial, seed=seed)

    def reset(self) -> None:
        self.session.reset()

    def step(self, **inputs):
        return self.session.step(**inputs)


def subject(device: str | torch.device = "cpu", seconds: int = 10, seed: int = 0, **_) -> Subject:
    device = torch.device(device)
    ticks = int(Fraction(25, 2) * seconds) + 1
    codes = torch.randint(0, 64, (1, ticks + 64), generator=torch.Generator().manual_seed(seed)).to(device)
    model = build_toy(device=device)
    prompt = make_prompt(model, PROMPT).to(device)

    def stock():
        runner = ToyStockStream(build_toy(device=device), prompt, WINDOW)
        generator_state = {"seed": seed}

        class Seeded:
            def reset(self):
                runner.reset()
                torch.manual_seed(generator_state["seed"])

            def step(self, **inputs):
                return runner.step(**inputs)

        return Seeded()

    def cadence():
        runtime = load_runtime(model, device=device)
        runner = SessionRunner(runtime, {"cache": prompt}, seed)
        return runner

    return Subject(
        "toy",
        Fraction(25, 2),
        lambda t: {"codes": codes[:, t : t + 1]},
        [
            Variant("stock eager", stock, reference=True),
            Variant("duplexcadence", cadence, info=lambda r: {"graphs": r.runtime.report().graphs_captured}),
        ],
        device,
        description="toy tail (tests, docs/runtime.md)",
        warmup_ticks=25,
        tick_name="frame",
    )
