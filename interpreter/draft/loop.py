"""What drafting needs from the user: the stock streaming loop, described by one record.

A drafting function (`dsl draft MODULE:FUNCTION`) returns a `StockLoop`. Drafting calls
`step` once per tick with `feed(tick)` as keyword arguments and watches every tensor reachable
from `model` (modules, buffers, plain attributes, streaming-state objects) and from `state` (the
stock stream object, cache containers) between calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import attrs


def _rate(value: Any) -> Fraction:
    rate = Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    if rate <= 0:
        raise ValueError(f"the input rate must be a positive number of Hz, got {value!r}")
    return rate


@attrs.frozen
class StockLoop:
    """A stock streaming loop to draft a `.clock` file from.

    `step(**feed(tick))` runs one stock call and returns its output: a tensor, a tuple of tensors,
    or a dict of them by name. With `handback=True` the call is `step(state, **feed(tick))` and
    returns `(output, new_state)`: state owned by the caller and handed back each call (cache
    containers); `state` is then the initial one. Without it, `state` is any object (or a dict of
    named objects) that the step mutates, such as the stock stream object that keeps the caches.

    With `handback="NAME"` (transformers' convention) the call is `step(**feed(tick), NAME=state)` and
    returns a record (a `ModelOutput`, a dataclass, a dict) whose field NAME holds the new state and whose
    other tensor fields are the outputs; `state` may then be None, as a stock loop starts: the object is
    learnt from what the first call returns. `keywords` are constant keyword arguments of every call
    (`{"use_cache": True}`).

    `rate` is the rate in Hz of the inputs' time axis (12.5 for one Mimi frame of codes per call).
    `time_axis` is the time axis of the inputs and outputs: one axis for all, or a dict by name (a stream it
    leaves out takes the axis along which its length changes between calls, else the last). `outputs`
    names the returned tensors when the step returns a tensor or a tuple. `cadence` is the conversation
    period in seconds.
    """

    model: Any
    step: Callable[..., Any]
    feed: Callable[[int], Mapping[str, Any]]
    rate: Fraction = attrs.field(converter=_rate)
    state: Any = None
    handback: bool | str = False
    time_axis: int | Mapping[str, int] = -1
    outputs: tuple[str, ...] = ("out",)
    cadence: Fraction = attrs.field(default=Fraction(1), converter=_rate)
    name: str = "stock"
    keywords: Mapping[str, Any] = attrs.field(factory=dict)

    def axis_of(self, name: str) -> int | None:
        """The time axis given for stream `name` (None: a dict of axes that leaves it out)."""
        if isinstance(self.time_axis, Mapping):
            return self.time_axis.get(name)
        return self.time_axis
