"""User-facing errors.  Anything raised as a :class:`FedriskError` is a mistake in the input
(a config value, a name, a missing dataset) and is shown to the user as a one-paragraph message
without a traceback; any other exception is a bug."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


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


def check_int(name: str, value: Any, low: int) -> None:
    """Raise a :class:`FedriskError` unless ``value`` is an ``int`` (not a bool) ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FedriskError(f"{name} must be an integer >= {low}; got {value!r}")
    check_range(name, value, low)


def check_positive(name: str, value: Any) -> None:
    """Raise a :class:`FedriskError` unless ``value`` is a finite number ``> 0`` (not a bool)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or value != value:
        raise FedriskError(f"{name} = {value!r} is not allowed; it must be a number > 0")
    if value == float("inf"):
        raise FedriskError(f"{name} = inf is not allowed; it must be a finite number > 0")
