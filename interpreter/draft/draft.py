"""`draft(loop)`: run a stock streaming loop, and write the `.clock` file that declares its state.

The pipeline is record (run the calls, see what persists) -> propose (a region per persistent tensor,
clocks from the advances per call) -> write (names, families, text) -> check (the same front end as
`dsl check`, on the text).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from duplexcadence.dsl.frontend import CheckResult, check_file
from duplexcadence.interpreter.draft.loop import StockLoop
from duplexcadence.interpreter.draft.propose import Proposals, propose
from duplexcadence.interpreter.draft.record import Recording, record
from duplexcadence.interpreter.draft.write import rate_text, write_clock

DEFAULT_CALLS = 8
DEFAULT_MAX_CALLS = 64


@attrs.frozen
class Draft:
    """A drafted `.clock`: its text, what it declares, and the front end's verdict on it."""

    text: str
    proposals: Proposals
    recording: Recording = attrs.field(repr=False)
    region_names: dict[str, str]  # tensor path -> region name
    check: CheckResult = attrs.field(repr=False)

    @property
    def notes(self) -> int:
        return self.text.count("# ") - 2

    def summary(self) -> str:
        proposals = self.proposals
        families = len({name for name in self.region_names.values()})
        problems = len(self.check.errors)
        verdict = "passes dsl check" if problems == 0 else f"has {problems} error(s) in dsl check"
        return (
            f"drafted {len(proposals.inputs)} input(s), {len(proposals.outputs)} output(s) and "
            f"{len(proposals.regions)} state tensor(s) as {families} region declaration(s) from "
            f"{proposals.calls} calls ({rate_text(proposals.call_rate).removesuffix(' Hz')} calls per second); "
            f"{len(proposals.skipped)} tensor(s) seen but left out, {len(proposals.counter_proposals)} counter(s), "
            f"{len(proposals.counters)} other host int(s); "
            f"the draft {verdict}"
        )


def draft(
    loop: StockLoop,
    calls: int = DEFAULT_CALLS,
    max_calls: int = DEFAULT_MAX_CALLS,
    source: str = "",
    path: str = "draft.clock",
    progress: Callable[[str], None] | None = None,
) -> Draft:
    """Run `loop` for `calls` calls (more, up to `max_calls`, while a tensor still grows) and draft its `.clock`."""
    if calls < 2:
        raise ValueError(f"drafting needs at least 2 calls to see what persists, not {calls}")
    recording = record(loop, calls, max(calls, max_calls))
    if progress is not None:
        progress(f"ran {recording.calls} calls of the stock step")
    proposals = propose(recording, loop.rate)
    text, declared = write_clock(proposals, loop.rate, loop.cadence, source or loop.name)
    result = check_file(path, text=text)
    return Draft(text, proposals, recording, declared["regions"], result)
