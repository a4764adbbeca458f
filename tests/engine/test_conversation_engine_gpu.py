"""The conversation engine on a GPU: MiniCPM-o 4.5 at the reduced sizes with its steps graphed per row count.

Two conversations over a few units (one scripted, one deciding for itself); then every captured graph is
replayed and compared with the same step run eagerly on the same rows (``torch.equal``: the batched
computation, not batch-1 eager), and each conversation's audio with the stock tail fed its speech tokens.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("stepaudio2") is None:
    pytest.skip("needs stepaudio2-minicpmo (scripts/model-pins.txt)", allow_module_level=True)

from duplexcadence.interpreter.engine.api import Decision, UnitInput  # noqa: E402
from duplexcadence.interpreter.engine.registry import load_engine  # noqa: E402

pytestmark = pytest.mark.gpu
N_TIMESTEPS = 2


def test_graphs_replay_their_eager_steps_and_the_tail_is_stock() -> None:
    from duplexcadence.examples.minicpmo45.model import build_tail
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    engine = load_engine("minicpmo45", device="cuda", sizes="reduced", conversations=3, n_timesteps=N_TIMESTEPS)
    model = engine.model
    seeds = (3, 4)
    ids = [engine.open(seed=seed) for seed in seeds]
    script = [
        Decision("speak", (1, 2, 3)),
        Decision("speak", (4,)),
        Decision("speak", (5, 6), True),
        Decision("listen"),
    ]
    generator = np.random.default_rng(0)
    outputs: dict[int, list] = {cid: [] for cid in ids}
    for unit in range(4):
        audio = (0.1 * generator.standard_normal((2, 16000))).astype(np.float32)
        out = engine.step({ids[0]: UnitInput(audio[0], script[unit]), ids[1]: UnitInput(audio[1])})
        for cid in ids:
            outputs[cid].append(out[cid])
    replays = sum(graphs.counters.replays for graphs in model.step_graphs())
    assert replays > 0 and all(graphs.counters.direct == 0 for graphs in model.step_graphs())

    checked = 0
    for graphs in model.step_graphs():
        results = model.step_outputs()[graphs.name]
        for rows, graph in sorted(graphs.graphs.items()):
            model.rows[:rows].copy_(torch.arange(rows, device=model.device))
            graph.replay()
            replayed = [t[:rows].clone() for t in results]
            graphs.step(rows)
            torch.cuda.synchronize()
            assert all(torch.equal(a, t[:rows]) for a, t in zip(replayed, results)), (graphs.name, rows)
            checked += 1
    assert checked == 9  # three steps at 1, 2 and 3 rows

    tail = build_tail(model.sizes.tail, seed=1234, device="cuda")
    for cid, seed in zip(ids, seeds):
        stock = StockToken2wavSession(tail, model.prompt, N_TIMESTEPS, session_seed=seed, own_caches=True)
        turn_start = True
        for output in outputs[cid]:
            if output.kind != "speak":
                continue
            chunks = stock.push_tokens(output.speech_tokens, flush=turn_start, end_of_turn=output.end_of_turn)
            expected = torch.cat([c.reshape(-1) for c in chunks]).numpy() if chunks else np.zeros(0, np.float32)
            assert np.array_equal(output.audio, expected), (cid, output.unit)
            turn_start = output.end_of_turn
            if output.end_of_turn:
                stock.reset()
