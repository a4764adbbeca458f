"""MiniCPM-o 4.5's token2wav tail's serving adapter (`dsl serve minicpmo45`): the runtime over a seeded tail
(P prompt frames, n Euler steps, fp32 or fp16), every session starting from one voice's set-up state (shared,
not copied per session), seeded tokens per session (25 new speech tokens a 1 s tick), and the package's own
`Token2wav.stream` (`StockToken2wavSession`) as the stock loop.

Options (`--param K=V`): `steps` (10), `prompt` (150), `dtype` (fp32 or fp16), `reduced` (1: the CI tail's
sizes, for a quick CPU run), `istft` (`captured`, the default: `hift_back` captured with the flow, so a lane
never waits for the device between chunks; `torch`: HiFT's own `torch.istft`, whose window check reads a value
back, so `hift_back` runs eagerly after the graph). Both give the same samples; the captured one serves more
sessions (docs/serving.md).
"""

from __future__ import annotations

from typing import Any

import torch

from duplexcadence.examples.minicpmo45.bench import REDUCED
from duplexcadence.examples.minicpmo45.cadence import check_istft, load_runtime
from duplexcadence.examples.minicpmo45.model import RELEASED, build_tail, random_prompt
from duplexcadence.examples.minicpmo45.stock import CHUNK_TOKENS, StockToken2wavSession
from duplexcadence.interpreter.serve.tail import LoadedTail, ServedTail

WEIGHTS_SEED, VOICE_SEED, VOCAB = 1234, 4321, 6561


def tokens(seed: int, tick: int) -> dict[str, torch.Tensor]:
    """Session `seed`'s 25 new speech tokens at chunk `tick`: int32 [1, 25], the same on every call."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + tick)
    return {"tokens": torch.randint(0, VOCAB, (1, CHUNK_TOKENS), generator=generator, dtype=torch.int32)}


class Token2wavStock:
    """One stock MiniCPM-o session (its own caches and generator state): one `stream` call a tick."""

    def __init__(self, session: StockToken2wavSession):
        self.session = session

    def reset(self) -> None:
        self.session.reset()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        (chunk,) = self.session.push_tokens(tokens[0].tolist())
        return chunk


def served(
    device: str = "cuda",
    steps: int | str = 10,
    prompt: int | str = 150,
    dtype: str = "fp32",
    reduced: int | str = 0,
    istft: str = "captured",
) -> ServedTail:
    n_timesteps, prompt_frames = int(steps), int(prompt)
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"the token2wav tail runs in fp32 or fp16, not {dtype}")
    check_istft(istft)
    float16 = dtype == "fp16"
    config = REDUCED if int(reduced) else RELEASED
    stock_state: dict[str, Any] = {}

    def load(sessions: int = 1, lanes: int = 1, rows: int | None = None) -> LoadedTail:
        if rows is not None:
            raise ValueError(
                "the token2wav tail streams one session per call: its .clock has no batch param to lockstep"
            )
        tail = build_tail(config, seed=WEIGHTS_SEED, device=device, float16=float16)
        bound = load_runtime(tail, prompt_frames, n_timesteps, sessions=sessions, lanes=lanes, istft=istft)
        voice = random_prompt(prompt_frames, seed=VOICE_SEED, device=device)
        return LoadedTail(bound.runtime, bound.voice_initial(voice))

    def stock(session_seed: int) -> Token2wavStock:
        if "tail" not in stock_state:
            stock_state["tail"] = build_tail(config, seed=WEIGHTS_SEED, device=device, float16=float16)
            stock_state["voice"] = random_prompt(prompt_frames, seed=VOICE_SEED, device=device)
        session = StockToken2wavSession(
            stock_state["tail"],
            stock_state["voice"],
            n_timesteps=n_timesteps,
            session_seed=session_seed,
            own_caches=True,
        )
        return Token2wavStock(session)

    options = {
        "steps": str(n_timesteps),
        "prompt": str(prompt_frames),
        "dtype": dtype,
        "reduced": str(int(reduced)),
        "istft": istft,
    }
    return ServedTail("minicpmo45", load, device=device, inputs=tokens, stock=stock, options=options)
