"""The limits of a `.clock` program: how large it may be before checking or planning it would take
long or allocate much.

Every limit is a named constant here, with what it bounds and why its default is what it is. A
program over one gets a located error of its own code (docs/reliability.md), from `dsl check` as
well as `dsl plan` and `dsl render`, before the work it would cost: family expansion (`regions`),
the order of stages (`stages`), the shape trace (`warmup`, `hyperperiod`, `firings`, `views`,
`states`), the arena (`bytes`). A real model that
needs more raises a limit: `--limit NAME=VALUE` on `dsl check`, `dsl plan` and `dsl render`, or
`limits={"NAME": VALUE}` (or a `Limits`) for `check_file`, `load_program`, `plan_file` and
`make_plan`; a program carries the limits it was checked with to its plan.

The defaults hold every released tail with room to spare (the largest: Mimi's decoder, 40 regions,
a warm-up of 125 instants, 450 traced firings and 6 450 views; Step-Audio2's token2wav, a 743 MiB
arena) and keep `dsl check`, `dsl plan` and `dsl render` of any file (up to the 256 kB a file may
have) within a few seconds on one core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

MAX_REGIONS = 1024
"""Regions in a program, each member of a family counted (`kv[layer < 8]` is 8): family expansion,
the plan and the arena map are per region. A 48-layer model with four state families has 192;
Mimi's decoder has 40."""

MAX_STAGES = 256
"""Stages in a program: the order within an instant relates every stage that writes a region to every
stage that reads it, which grows with the square of the stages. A stage per layer of a 64-layer
model, attention and feed-forward apart, is 128; Mimi has 3."""

MAX_RETENTION = 10_000_000
"""Units a `retain last N`, `ring N` or `first A + last B` keeps (each of A and B): 208 s of a 48 kHz
sample clock, hours of frames; Mimi keeps 250."""

MAX_HORIZON = 100_000_000
"""Units a `retain all horizon H` keeps: 35 minutes of a 48 kHz sample clock."""

MAX_CONTEXT = 10_000_000
"""Units a read reaches back: `read R last N`, the context of `read R new + N`, a lookahead."""

MAX_WARMUP = 10_000
"""Instants before the state repeats (the warm-up the planner traces), or up to a horizon where it
never does: a window of 10 000 frames filled one frame an instant. Mimi's is 125."""

MAX_HYPERPERIOD = 1_000_000_000
"""The hyperperiod in base ticks (the base tick divides every clock's period and the cadence): an
hour of a 48 kHz clock is 172 800 000. Mimi's 2 s at 24 kHz is 48 000."""

MAX_FIRINGS = 20_000
"""Firings the planner traces: the warm-up, then two hyperperiods (the second confirms the first
repeats). Mimi's plan traces 450."""

MAX_VIEWS = 200_000
"""Region views the planner traces: every region a traced firing touches counts once (a stage that
updates a family of 8 has 8 views a firing). Mimi's plan traces 6 450."""

MAX_STATES = 500_000
"""Region lengths the planner traces and keeps: at every traced instant, the length of every region
with a time axis (the runtime looks them up by instant, and the timeline draws them). A thousand
regions on a 10 kHz clock would be twenty million. Mimi's plan keeps 4 025."""

MAX_BYTES = 64 * 2**30
"""Bytes of the arena of one session (its pinned regions and one block of scratch): 64 GiB, against
the 743 MiB of Step-Audio2's token2wav at its released size."""


@attrs.frozen
class Limits:
    """The limits a program is checked and planned under (see each constant for what it bounds)."""

    regions: int = MAX_REGIONS
    stages: int = MAX_STAGES
    retention: int = MAX_RETENTION
    horizon: int = MAX_HORIZON
    context: int = MAX_CONTEXT
    warmup: int = MAX_WARMUP
    hyperperiod: int = MAX_HYPERPERIOD
    firings: int = MAX_FIRINGS
    views: int = MAX_VIEWS
    states: int = MAX_STATES
    bytes: int = MAX_BYTES

    @classmethod
    def of(cls, value: Limits | Mapping[str, int] | None) -> Limits:
        """`value` as Limits: None is the defaults; a mapping raises the limits it names (ValueError
        for an unknown name or a value that is not a positive integer)."""
        if value is None:
            return DEFAULT_LIMITS
        if isinstance(value, Limits):
            return value
        changes: dict[str, int] = {}
        for name, amount in value.items():
            if name not in NAMES:
                raise ValueError(f"unknown limit {name!r}; the limits are {', '.join(NAMES)}")
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
                raise ValueError(f"the limit {name} must be a positive integer, not {amount!r}")
            changes[name] = amount
        return attrs.evolve(DEFAULT_LIMITS, **changes)


DEFAULT_LIMITS = Limits()
NAMES: tuple[str, ...] = tuple(field.name for field in attrs.fields(Limits))


def parse_limits(pairs: Sequence[str]) -> tuple[Limits, list[str]]:
    """Limits from `--limit NAME=VALUE` pairs (VALUE a positive integer, `_` allowed), and what is
    wrong with the pairs that are not."""
    values: dict[str, int] = {}
    problems: list[str] = []
    for pair in pairs:
        name, sep, text = (part.strip() for part in pair.partition("="))
        if not sep or not name:
            problems.append(f"--limit {pair!r} is not NAME=VALUE (the limits: {', '.join(NAMES)})")
            continue
        if name not in NAMES:
            problems.append(f"--limit {name}: no such limit (the limits: {', '.join(NAMES)})")
            continue
        try:
            amount = int(text)
        except ValueError:
            amount = 0
        if amount < 1:
            problems.append(f"--limit {name}={text}: the value must be a positive integer")
            continue
        values[name] = amount
    return attrs.evolve(DEFAULT_LIMITS, **values), problems
