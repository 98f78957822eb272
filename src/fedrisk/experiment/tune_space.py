"""Search spaces of ``fedrisk tune``: parsing ``KEY=SPEC`` strings and checking them (and the
tuned metric) against a config.

Specs: ``log:LO:HI`` (floats, log-uniform, 0 < LO < HI), ``float:LO:HI``, ``int:LO:HI``,
``logint:LO:HI`` and ``choice:A,B,...`` (TOML values).

Example:
    >>> parse_dimension("algorithm.lr", "log:1e-3:1")
    Dimension(key='algorithm.lr', kind='log', low=0.001, high=1.0, choices=())
    >>> parse_dimension("algorithm.lam", "choice:1,10,100").choices
    (1, 10, 100)
    >>> parse_dimension("algorithm.lr", "log:0:1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    fedrisk.errors.FedriskError: search space algorithm.lr = 'log:0:1' does not parse: ...
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import ExperimentConfig, flatten, parse_literal
from fedrisk.experiment.schema import format_value

KINDS = ("log", "float", "int", "logint", "choice")
ALLOWED = "log:LO:HI (0 < LO < HI), float:LO:HI, int:LO:HI, logint:LO:HI, choice:A,B,..."
NOT_TUNABLE = ("run.seed", "run.seeds", "sweep.", "tune.", "output.")


@dataclass(frozen=True)
class Dimension:
    """One tuned key: ``kind`` in :data:`KINDS` with bounds or choices."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def spec(self) -> str:
        """The canonical text, e.g. ``"log:0.001:1.0"``."""
        if self.kind == "choice":
            return "choice:" + ",".join(format_value(c) for c in self.choices)
        return f"{self.kind}:{self.low}:{self.high}"

    def suggest(self, trial: Any) -> Any:
        """Optuna's proposal for this key in ``trial``."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind in ("int", "logint"):
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.kind == "logint")
        return trial.suggest_float(self.key, float(self.low), float(self.high), log=self.kind == "log")

    def values(self) -> list[Any]:
        """Values that span the dimension (its bounds or its choices), to validate against the config."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]


def short(value: Any) -> str:
    """A proposed value for tables: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else format_value(value)


def parse_dimension(key: str, text: str) -> Dimension:
    """``"log:1e-3:1"`` -> a log-uniform float dimension of ``key`` (see :data:`KINDS`)."""
    from fedrisk.experiment.sweep import _split_top

    def bad(why: str) -> FedriskError:
        return FedriskError(f"search space {key} = {text!r} does not parse: {why}; allowed: {ALLOWED}")

    if not isinstance(text, str):
        raise bad("not a string")
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise bad(f"unknown kind {kind!r}")
    if kind == "choice":
        parts = [p.strip() for p in _split_top(rest)]
        if not rest.strip() or any(not p for p in parts):
            raise bad("empty choice")
        choices = tuple(parse_literal(p) for p in parts)
        if any(not isinstance(c, (str, int, float, bool)) for c in choices):
            raise bad("choices must be numbers, strings or booleans")
        if len(set(map(repr, choices))) != len(choices):
            raise bad("repeated choice")
        return Dimension(key, kind, choices=choices)
    bounds = rest.split(":")
    if len(bounds) != 2:
        raise bad("expected two bounds LO:HI")
    number = int if kind in ("int", "logint") else float
    try:
        low, high = (number(b) for b in bounds)
    except ValueError:
        raise bad(f"bounds must be {'integers' if number is int else 'numbers'}") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise bad("need finite bounds with LO < HI")
    if kind in ("log", "logint") and low <= 0:
        raise bad("a log scale needs 0 < LO")
    return Dimension(key, kind, low, high)


def parse_space(items: Sequence[str]) -> dict[str, Dimension]:
    """``["algorithm.lr=log:1e-3:1", ...]`` (``--space``) -> ``{key: Dimension}``."""
    space: dict[str, Dimension] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not k for k in key.split(".")):
            raise FedriskError(
                f"--space expects KEY=SPEC with a dotted key (e.g. algorithm.lr=log:1e-3:1); got {item!r}"
            )
        if key in space:
            raise FedriskError(f"--space {key} is given twice; give each key once")
        space[key] = parse_dimension(key, text.strip())
    return space


def config_space(cfg: ExperimentConfig) -> dict[str, Dimension]:
    """The config's ``[tune.space]`` restricted to ``tune.keys`` (all of it when empty)."""
    table = flatten(cfg["tune.space"])
    keys = cfg["tune.keys"] or list(table)
    missing = [k for k in keys if k not in table]
    if missing:
        raise FedriskError(
            f"tune.keys lists {', '.join(missing)}, not in tune.space; "
            f"allowed: {', '.join(table) or '(tune.space is empty)'}"
        )
    return {k: parse_dimension(k, table[k]) for k in keys}


def check_space(cfg: ExperimentConfig, space: Mapping[str, Dimension], where: str = "search space") -> None:
    """Every key must be a config key whose type takes the dimension's values (bounds, choices)."""
    for key, dim in space.items():
        if any(key == p or (p.endswith(".") and key.startswith(p)) for p in NOT_TUNABLE):
            raise FedriskError(f"{where} {key}: not a tunable key; allowed: keys of [data], [model], [algorithm], ...")
        for value in dim.values():
            try:
                with warnings.catch_warnings():  # a bound may be a poor value (a theorem's step bound): not an error
                    warnings.simplefilter("ignore")
                    cfg.with_overrides({key: value})
            except FedriskError as exc:
                raise FedriskError(f"{where} {key} = {dim.spec!r}: {exc}") from None


def check_metric(cfg: ExperimentConfig, metric: str) -> None:
    """``metric`` must be a metric the runs evaluate on a validation split: the check of
    ``run.select_by`` (:func:`~fedrisk.experiment.section_rules.check_select_by`) decides, since the
    tuned runs select on it (:func:`select_overrides`) and evaluate the validation split they
    select on by themselves.  It takes ``validation_<metric>`` (needs
    ``data.validation_fraction``) and the per-client summaries
    ``validation_personal_<metric>_<stat>`` (needs ``data.client_validation_fraction``).

    Example:
        >>> from fedrisk.experiment.config import resolve_config
        >>> cfg = resolve_config({"data": {"dataset": "breast_cancer", "client_validation_fraction": 0.2}})
        >>> check_metric(cfg, "validation_personal_accuracy_mean")
        >>> check_metric(cfg, "validation_accuracy")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        fedrisk.errors.FedriskError: metric 'validation_accuracy': ... needs a validation split ...
    """
    from fedrisk.experiment.section_rules import EXACT_GAME_METRICS, check_select_by

    if metric in EXACT_GAME_METRICS:  # a game's exact metric of its iterate: no split to leak
        return
    if not metric:
        raise FedriskError(
            "no metric to tune: set tune.metric or pass --metric; allowed: a validation metric such as validation_auroc"
        )
    if not metric.startswith("validation_"):
        raise FedriskError(
            f"metric {metric!r} is not evaluated on the validation split; allowed: validation_<metric> (e.g. "
            "validation_auroc), validation_personal_<metric>_<stat> or an exact game metric "
            f"({', '.join(EXACT_GAME_METRICS)}): tuning on the test split would select on it"
        )
    try:
        check_select_by(metric, cfg.section("data"), cfg["run.metrics"])
    except FedriskError as exc:
        raise FedriskError(f"metric {metric!r}: {exc}") from None


def select_overrides(cfg: ExperimentConfig, metric: str) -> dict[str, Any]:
    """``{"run.select_by": metric}``: the tuned runs report and save the round their validation
    metric selects."""
    return {"run.select_by": metric}
