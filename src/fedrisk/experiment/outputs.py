"""The run directory: what a run writes and how it is read back.

::

    DIR/config.toml        the resolved config (every key, effective values)
    DIR/metrics.jsonl      one JSON object per evaluation: round, metrics, bytes_down,
                           bytes_up (totals so far), wall_time (seconds, across resumes)
    DIR/summary.json       written when the run finishes: final metrics, the metrics at the round
                           selected on validation (run.select_by), totals, the oracle (best on
                           every metric, test included: not a result, kept apart)
    DIR/selected.pt        the model of the validation-selected round (plain tensors; fedrisk evaluate)
    DIR/partition.json     per-client class counts (and partition.md, the same as a table)
    DIR/checkpoint.pt      the latest checkpoint (SHA-256 manifest + torch.save; written atomically)
    DIR/checkpoint.pt.prev the checkpoint before it (the fallback when the latest is damaged)
    DIR/plots/*.png        metric vs round and vs bytes communicated

Every file is written to a temporary file in the same directory and renamed over the target
(``os.replace``), so a run killed at any moment leaves either the old or the new file.

Example:
    >>> import tempfile
    >>> d = RunDir(tempfile.mkdtemp())
    >>> d.status()
    'empty'
    >>> append_jsonl(d.metrics, {"round": 1, "test_accuracy": 0.5})
    >>> read_jsonl(d.metrics)
    [{'round': 1, 'test_accuracy': 0.5}]
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedrisk.errors import FedriskError

CONFIG = "config.toml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"
CHECKPOINT_PREV = "checkpoint.pt.prev"
PARTITION_JSON = "partition.json"
PARTITION_MD = "partition.md"
PLOTS = "plots"
CLIENT_STATES_DIR = "client_states"  # run.client_states = "disk": one file per client, and snapshots
FAILURE = "failure.json"  # a run stopped by an error: {"round", "error"} (reports show it; a rerun removes it)
OUTPUT_FILES = (CONFIG, METRICS, SUMMARY, CHECKPOINT, CHECKPOINT_PREV, PARTITION_JSON, PARTITION_MD, "selected.pt")
OUTPUT_FILES += (FAILURE,)
# experiment.personal_outputs.PERSONAL_FILES:
OUTPUT_FILES += ("clients.csv", "alpha.csv", "clusters.csv", "lambda_guide.txt")
"""Files a run owns (``--overwrite`` removes exactly these and ``plots/``)."""

RECORD_KEYS = ("round", "bytes_down", "bytes_up", "wall_time", "steps_per_client", "samples_seen")
"""Keys of a metrics record that are not metrics (budgets spent so far: rounds, bytes, seconds,
local gradient steps per client and training rows drawn, see ``runner.WorkMeter``)."""

SELECTED_MODEL = "selected.pt"
"""The parameters of the round selected on validation (``run.select_by``), see ``runner.Selector``."""


def markdown_rows(head: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1) -> str:
    """A Markdown table of the header ``head`` and the cells ``rows``: the first ``text_columns``
    columns left-aligned, the others right-aligned (the report's, the tuning's and the new
    clients' tables, and the scripts' under ``benchmarks/`` and ``scripts/``).

    Example:
        >>> print(markdown_rows(["method", "accuracy"], [["perm", "0.91"], ["local", "0.87"]]))
        | method | accuracy |
        |---|---:|
        | perm | 0.91 |
        | local | 0.87 |
    """
    align = "|" + "---|" * text_columns + "---:|" * (len(head) - text_columns)
    lines = ["| " + " | ".join(head) + " |", align]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def outputs_line(path: str | Path) -> str:
    """``outputs in DIR: ...``, with ``tensorboard/`` and ``mlruns/`` when the run tracked to them
    (the last line of ``fedrisk run`` and ``fedrisk deploy run``)."""
    extra = [f"{d}/" for d in ("tensorboard", "mlruns") if (Path(path) / d).is_dir()]
    files = "config.toml metrics.jsonl summary.json partition.json checkpoint.pt plots/"
    return " ".join([f"outputs in {path}: {files}", *extra])


# ----------------------------------------------------------------------------- atomic writes


def _atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename."""
    _atomic(Path(path), lambda fh: fh.write(text.encode()))


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file, then ``os.replace`` onto ``path``; tensors are saved
    from the CPU (a model trained on a GPU loads anywhere without ``map_location``)."""
    import torch

    from fedrisk.runtime.device import to_device

    cpu = to_device(obj, torch.device("cpu"))
    _atomic(Path(path), lambda fh: torch.save(cpu, fh))


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line (floats are written with ``repr`` precision, so they read back
    bit-exactly)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(record)) + "\n")
        fh.flush()


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(dict(r)) + "\n" for r in records))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a torn last line (a killed writer) is ignored."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    lines = p.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise FedriskError(f"{p}: line {i + 1} is not valid JSON") from None
    return out


# ----------------------------------------------------------------------------- the run directory


class RunDir:
    """Paths of one run's outputs."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    @property
    def partition_json(self) -> Path:
        return self.path / PARTITION_JSON

    @property
    def partition_md(self) -> Path:
        return self.path / PARTITION_MD

    @property
    def plots(self) -> Path:
        return self.path / PLOTS

    @property
    def client_states(self) -> Path:
        return self.path / CLIENT_STATES_DIR

    def status(self) -> str:
        """``"empty"`` (no run), ``"finished"``, ``"checkpointed"`` (interrupted, resumable)
        or ``"started"`` (a run began here but left no checkpoint)."""
        if not self.config.is_file():
            return "empty"
        if self.summary.is_file():
            try:
                if json.loads(self.summary.read_text()).get("status") == "finished":
                    return "finished"
            except json.JSONDecodeError:
                pass
        if self.checkpoint.is_file():
            return "checkpointed"
        return "started"

    def clear(self) -> None:
        """Remove the files a run writes (and nothing else)."""
        for name in OUTPUT_FILES:
            p = self.path / name
            if p.is_file():
                p.unlink()
        if self.plots.is_dir():
            for png in self.plots.glob("*.png"):
                png.unlink()
            if not any(self.plots.iterdir()):
                self.plots.rmdir()
        if self.client_states.is_dir():
            import shutil

            shutil.rmtree(self.client_states)


@dataclass
class RunData:
    """A run read back from disk (for reports)."""

    path: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    failure: dict[str, Any] | None = None  # failure.json of a run stopped by an error

    @property
    def metric_names(self) -> list[str]:
        names: dict[str, None] = {}
        for r in self.records:
            for k, v in r.items():
                if k not in RECORD_KEYS and isinstance(v, (int, float)):
                    names.setdefault(k, None)
        return list(names)

    @property
    def finished(self) -> bool:
        return self.summary.get("status") == "finished"


def load_run(path: str | Path) -> RunData:
    """Read a run directory (config, metrics and, if present, the summary)."""
    from fedrisk.experiment.config import read_toml

    d = RunDir(path)
    if not d.config.is_file():
        raise FedriskError(f"{str(d.path)!r} is not a run directory (no {CONFIG})")
    summary = json.loads(d.summary.read_text()) if d.summary.is_file() else {}
    failure = json.loads((d.path / FAILURE).read_text()) if (d.path / FAILURE).is_file() else None
    return RunData(d.path, read_toml(d.config), read_jsonl(d.metrics), summary, failure)


def _tune_trial(run: Path, top: Path) -> bool:
    """Whether ``run`` is a trial of a ``fedrisk tune`` study below ``top`` (``STUDY/trials/<n>``)."""
    from fedrisk.experiment.tune_storage import has_study

    study = run.parent.parent
    if run.parent.name != "trials" or not has_study(study):
        return False
    return top.resolve() not in (study.resolve(), run.parent.resolve())


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Every run directory at or below ``paths`` (a directory holding ``config.toml`` and
    ``metrics.jsonl``), sorted; a path holding none is an error.  The trials of a tune study
    (``STUDY/trials/<n>``) are found only when the study itself is given."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FedriskError(f"{str(p)!r} does not exist")
        if (p / CONFIG).is_file() and (p / METRICS).is_file():
            found.append(p)
            continue
        below = sorted(
            c.parent for c in p.rglob(METRICS) if (c.parent / CONFIG).is_file() and not _tune_trial(c.parent, p)
        )
        if not below:
            raise FedriskError(f"no run directories (with {CONFIG} and {METRICS}) at or below {str(p)!r}")
        found.extend(below)
    unique: dict[Path, None] = {}
    for p in found:
        unique.setdefault(p.resolve(), None)
    return list(unique)


# ----------------------------------------------------------------------------- personalised runs

PERSONAL_STATS = ("wmean", "mean", "std", "bottom10")
"""The client summaries of a personalised metric shown by reports (see ``runtime.evaluation``)."""


def best_round(records: Sequence[Mapping[str, Any]], metric: str | None = None) -> dict[str, Any] | None:
    """The evaluation at the round where ``metric`` is best, named apart from the last one.

    ``metric`` defaults to ``personal_accuracy_mean`` (else the first ``personal_*_mean``);
    losses (and stds) are minimised.  Returns ``{"round", "selected_by", "metrics"}`` or None
    when no record has the metric.

    Example:
        >>> recs = [{"round": 1, "personal_accuracy_mean": 0.7}, {"round": 2, "personal_accuracy_mean": 0.6}]
        >>> best_round(recs)["round"], best_round(recs)["selected_by"]
        (1, 'personal_accuracy_mean')
    """
    from fedrisk.runtime.evaluation import LOWER_IS_BETTER

    if metric is None:
        names = [k for r in records for k in r if k.startswith("personal_") and k.endswith("_mean")]
        if not names:
            return None
        metric = "personal_accuracy_mean" if "personal_accuracy_mean" in names else names[0]
    lower = any(metric.endswith(n) or f"_{n}_" in metric for n in LOWER_IS_BETTER)
    best: Mapping[str, Any] | None = None
    for r in records:
        v = r.get(metric)
        if not isinstance(v, (int, float)) or v != v:
            continue
        if best is None or (v < best[metric] if lower else v > best[metric]):
            best = r
    if best is None:
        return None
    metrics = {k: v for k, v in best.items() if k not in RECORD_KEYS}
    return {"round": best["round"], "selected_by": metric, "metrics": metrics}
