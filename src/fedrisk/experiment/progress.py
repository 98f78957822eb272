"""Progress display for runs: a ``tqdm`` bar on a terminal, plain lines in logs and CI.

The bar is :class:`fedrisk.api.ProgressBar`, the one ``run_federation`` shows: the round
``r/R``, elapsed and remaining time, the mean training loss of the last round and the latest
evaluation.  Plain mode prints one line per evaluation and is chosen automatically when the
stream is not a terminal (``mode="auto"``), so logs and CI output stay readable.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> p = Progress(total_rounds=4, mode="plain", stream=out, label="fedavg")
    >>> p.start(round=0)
    >>> p.evaluation({"round": 2, "test_accuracy": 0.75, "bytes_down": 0, "bytes_up": 0, "wall_time": 1.0})
    >>> out.getvalue().split(" | ")[:2]
    ['[fedavg] round 2/4', 'elapsed 00:01']
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from fedrisk.api import ProgressBar, RoundDisplay

MODES = ("auto", "bar", "plain", "none")
_NON_METRIC = ("round", "bytes_down", "bytes_up", "wall_time", "steps_per_client", "samples_seen")


def format_duration(seconds: float | None) -> str:
    """``75.2 -> "01:15"``, ``3725 -> "1:02:05"``, None -> ``"--:--"``.

    Example:
        >>> format_duration(75.2), format_duration(3725), format_duration(None)
        ('01:15', '1:02:05', '--:--')
    """
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def format_number(value: Any) -> str:
    """Four significant decimals for metrics; integers as they are."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"


def metric_items(record: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in record.items() if k not in _NON_METRIC]


class Progress(RoundDisplay):
    """Shows a run's progress (a :class:`~fedrisk.api.Callback`).

    Args:
        total_rounds: R, the round the run ends at.
        mode: ``"auto"`` (bar on a terminal, plain otherwise), ``"bar"``, ``"plain"`` or
            ``"none"``.
        stream: where to write (default: standard error, so results on stdout stay clean).
        label: a prefix naming the run (e.g. the algorithm and seed).
        elapsed_before: seconds already spent before a resume (counted by the plain lines; the
            bar's times are this session's).
        max_metrics: at most this many evaluation metrics on the bar.
    """

    def __init__(
        self,
        total_rounds: int,
        mode: str = "auto",
        stream: TextIO | None = None,
        label: str = "",
        elapsed_before: float = 0.0,
        max_metrics: int = 3,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {MODES}; got {mode!r}")
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "plain"
        self.mode = mode
        self.total = total_rounds
        self.label = label
        self.elapsed_before = elapsed_before
        self.max_metrics = max_metrics
        self._t0 = time.perf_counter()
        self._start_round = 0
        self._round = 0
        self._train: dict[str, float] = {}
        self._latest: dict[str, Any] = {}
        self._bar: ProgressBar | None = None

    # -- plain methods (usable without a Simulation; the hooks come from RoundDisplay) --------
    def start(self, round: int) -> None:
        self._t0 = time.perf_counter()
        self._start_round = self._round = round
        if self.mode == "bar":
            self._bar = ProgressBar(self.total, file=self.stream, max_metrics=self.max_metrics, label=self.label)
            self._bar.start(round)

    def round_end(self, round: int, train_metrics: Mapping[str, float]) -> None:
        self._round = round
        self._train = dict(train_metrics)
        if self._bar is not None:
            self._bar.round_end(round, train_metrics)

    def evaluation(self, record: Mapping[str, Any]) -> None:
        self._round = int(record.get("round", self._round))
        self._latest = dict(metric_items(record))
        if self._bar is not None:
            self._bar.evaluation(record)
        elif self.mode == "plain":
            elapsed = record.get("wall_time", self.elapsed())
            parts = [f"{self._prefix()}round {self._round}/{self.total}", f"elapsed {format_duration(elapsed)}"]
            if self._round < self.total:
                parts.append(f"eta {format_duration(self.eta())}")
            metrics = " ".join(f"{k}={format_number(v)}" for k, v in self._latest.items())
            if metrics:
                parts.append(metrics)
            self._write(" | ".join(parts) + "\n")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # -- timing -----------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self._t0

    def eta(self) -> float | None:
        done = self._round - self._start_round
        if done <= 0:
            return None
        return (time.perf_counter() - self._t0) / done * (self.total - self._round)

    # -- rendering --------------------------------------------------------------------------
    def _prefix(self) -> str:
        return f"[{self.label}] " if self.label else ""

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not kill the run
            pass


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
