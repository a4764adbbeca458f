"""Shared fixtures of the MiniCPM-o 4.5 token2wav tests: the reduced CPU tail and one stock reference run.

CI time forces a reduced tail on the CPU: 1 + 1 conformer layers (released 6 + 4), a 1-layer DiT
(released 16), HiFT with 32 base channels (released 512), a 20-frame prompt (released use: 150) and
2 Euler steps (released 10 / 5). Every module is the package's own and the streaming code path is
the stock one; the shapes of the carried state do not depend on the layer counts except
``conformer_att``'s first dimension. The stock reference run is made once per test session and
shared by the stock and the runtime tests.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

REQUIRED_MODULES = ("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
MISSING = [name for name in REQUIRED_MODULES if name not in sys.modules and importlib.util.find_spec(name) is None]

PROMPT_FRAMES = 20
N_TIMESTEPS = 2
SESSION_SEED = 7


@dataclass
class Run:
    """What one pass of :func:`run_token_script` produced."""

    chunks: list[torch.Tensor]
    windows: list[int]
    """Tokens per ``stream`` call (the 3 held lookahead tokens included)."""
    last_flags: list[bool]
    flow_cache_after_turn_1: dict[str, torch.Tensor]
    hift_cache_after_turn_1: dict[str, torch.Tensor]


SCRIPT_WINDOWS = [28, 28, 28, 28, 28, 28, 13, 3, 28, 28, 27, 13, 8]
SCRIPT_LAST = [False] * 7 + [True] + [False, False, True] + [False, True]
SCRIPT_SAMPLES = [20_160] + [24_000] * 5 + [9_600, 6_720] + [20_160, 24_000, 29_760] + [5_760, 11_520]
SCRIPT_FIRST_IN_TURN = [True] + [False] * 7 + [True, False, False] + [True, False]
TURN_STARTS = (0, 8, 11)


def token_script() -> list[int]:
    return torch.randint(0, 6561, (400,), generator=torch.Generator().manual_seed(2024)).tolist()


def run_token_script(session, turns: int = 3, after_turn: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """MiniCPM-o's token feeding over up to three turns (``reset`` between them); returns the chunks.

    Turn 1: six regular chunks (first, second, four steady), a forced flush of 10 tokens (a 13-token
    window) and the end of the turn (a 3-token last chunk). Turn 2: two regular chunks and the end of
    the turn with 24 tokens pending (a 27-token last chunk on a P + 100 cache: P + 154 frames in
    flight). Turn 3: a forced flush as the first chunk (the cross-fade latency on a short chunk) and
    an 8-token last chunk. ``after_turn(i)`` is called at the end of turn i, before the reset.
    """
    tokens = token_script()
    pushes = [
        [(tokens[25 * i : 25 * i + 25], False, False) for i in range(6)]
        + [(tokens[150:160], True, False), ([], False, True)],
        [(tokens[200:225], False, False), (tokens[225:250], False, False), (tokens[250:274], False, True)],
        [(tokens[300:310], True, False), (tokens[310:315], False, True)],
    ]
    chunks: list[torch.Tensor] = []
    for turn, turn_pushes in enumerate(pushes[:turns]):
        if turn:
            session.reset()
        for new_tokens, flush, end_of_turn in turn_pushes:
            chunks += session.push_tokens(new_tokens, flush=flush, end_of_turn=end_of_turn)
        if after_turn is not None:
            after_turn(turn)
    return chunks


def reduced_config():
    from duplexcadence.examples.minicpmo45 import model

    return model.TailConfig(encoder_blocks=1, encoder_up_blocks=1, dit_depth=1, hift_base_channels=32)


@pytest.fixture(scope="session")
def tail():
    """The reduced tail that stock runs on (a runtime takes its own tail over: build another one)."""
    if MISSING:
        pytest.skip(f"needs {', '.join(MISSING)}")
    from duplexcadence.examples.minicpmo45 import model

    return model.build_tail(reduced_config(), seed=1234)


@pytest.fixture(scope="session")
def build_reduced_tail() -> Callable:
    """Another reduced tail with the same weights (same seed)."""
    from duplexcadence.examples.minicpmo45 import model

    return lambda: model.build_tail(reduced_config(), seed=1234)


@pytest.fixture(scope="session")
def prompt():
    if MISSING:
        pytest.skip(f"needs {', '.join(MISSING)}")
    from duplexcadence.examples.minicpmo45 import model

    return model.random_prompt(PROMPT_FRAMES, seed=4321)


@pytest.fixture(scope="session")
def script() -> Callable:
    return run_token_script


@pytest.fixture(scope="session")
def spec() -> SimpleNamespace:
    """The constants of the reduced set-up and of the token script, for the test modules."""
    return SimpleNamespace(
        prompt_frames=PROMPT_FRAMES,
        n_timesteps=N_TIMESTEPS,
        session_seed=SESSION_SEED,
        windows=SCRIPT_WINDOWS,
        last=SCRIPT_LAST,
        samples=SCRIPT_SAMPLES,
        first_in_turn=SCRIPT_FIRST_IN_TURN,
        turn_starts=TURN_STARTS,
        tokens=token_script,
        missing=MISSING,
    )


@pytest.fixture(scope="session")
def reference(tail, prompt) -> Run:
    """The stock run of the token script, seed 7, with the carried caches after turn 1."""
    from duplexcadence.examples.minicpmo45 import stock

    session = stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED)
    after: dict[str, dict[str, torch.Tensor]] = {}

    def keep_turn_1(turn: int) -> None:
        if turn == 0:
            after["flow"] = stock.clone_recursive(session.stream_cache)
            after["hift"] = stock.clone_recursive(session.hift_cache)

    chunks = run_token_script(session, after_turn=keep_turn_1)
    history = session.history
    return Run(chunks, [len(r.tokens) for r in history], [r.last_chunk for r in history], after["flow"], after["hift"])
