"""User-facing errors.  Anything raised as a :class:`FedriskError` is a mistake in the input
(a config value, a name, a missing dataset) and is shown to the user as a one-paragraph message
without a traceback; any other exception is a bug."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FedriskError(ValueError):
    """Invalid user input: the message says what is wrong and what is allowed."""


class DatasetMissingError(FedriskError):
    """A dataset is not installed: the message says which package to install or where to put files."""


def unknown_name(kind: str, name: str, choices: Iterable[str]) -> FedriskError:
    """An error for an unknown ``name`` of some ``kind``, listing valid choices and a close match."""
    options = sorted(choices)
    close = difflib.get_close_matches(name, options, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return FedriskError(f"unknown {kind} {name!r}.{hint} Valid choices: {', '.join(options)}")


def check_range(
    name: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise a :class:`FedriskError` naming ``name``, ``value`` and the allowed range."""
    ok = True
    if low is not None:
        ok &= value >= low if low_inclusive else value > low
    if high is not None:
        ok &= value <= high if high_inclusive else value < high
    if not ok:
        lo = "-inf" if low is None else repr(low)
        hi = "inf" if high is None else repr(high)
        lb = "[" if low_inclusive and low is not None else "("
        rb = "]" if high_inclusive and high is not None else ")"
        raise FedriskError(f"{name} = {value!r} is out of range; allowed: {lb}{lo}, {hi}{rb}")
