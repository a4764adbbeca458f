"""Stable names for the registered model tails: `from duplexcadence.tails import moshi`.

Each name is a `duplexcadence.interpreter.tails.Tail` record, found through the `duplexcadence.tails`
entry points (`duplexcadence.interpreter.tails.available()` lists them)::

    from duplexcadence.tails import moshi

    mimi = moshi.build_model(seed=1234)
    session = moshi.load_runtime(mimi).session()
"""

# No other global names here (no `from __future__` either): every public name of this module is a tail.
from duplexcadence.interpreter import tails as _registry


def __getattr__(name: str) -> "_registry.Tail":
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return _registry.get(name)
    except _registry.TailError as error:
        raise AttributeError(f"module 'duplexcadence.tails' has no tail {name!r}: {error}") from None


def __dir__() -> list[str]:
    return sorted(_registry.available())
