"""Experiment tracking: every evaluation record and the resolved config in TensorBoard and MLflow.

``metrics.jsonl`` stays the run's record (``fedrisk report`` reads only it); the trackers are a
copy for the tools researchers already watch.  Both are off by default and need the optional
``tracking`` extra (``pip install 'fedrisk[tracking]'``)::

    [output]
    tensorboard = true        # DIR/tensorboard/events.out.tfevents.*
    mlflow = true             # a local file store DIR/mlruns ...
    mlflow_tracking_uri = ""  # ... or this tracking URI (e.g. "http://127.0.0.1:5000")
    mlflow_experiment = ""    # "" = the config file's name

What is logged:

* every numeric value of every evaluation record (metrics, ``train_*``, ``bytes_down``,
  ``bytes_up``, ``wall_time``, ``steps_per_client``, ``samples_seen``) as a scalar at step = the
  record's round;
* the resolved config: TensorBoard gets it as the text summary ``config`` (the TOML of
  ``DIR/config.toml``); MLflow gets every dotted key as a parameter and the TOML as the artifact
  ``config.toml``; the MLflow run is named after the run directory and tagged with
  ``fedrisk.run_dir`` and ``fedrisk.seed``.

The default store is MLflow's file store (``file:`` URIs), which needs no database packages; MLflow
3 keeps it in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``, so fedrisk
sets that variable (if unset) for ``file:`` URIs.  Read such a store with the same variable set,
e.g. ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri file:runs/NAME/mlruns``, or give
a server or database URI in ``output.mlflow_tracking_uri``.

Resume (``fedrisk run --resume``): TensorBoard purges the events after the checkpoint's round
(``purge_step``), so a resumed run shows each round once; MLflow continues the run whose id was
kept in ``DIR/mlflow_run_id`` (a metric re-logged after an interruption adds a second point at the
same step).  ``--overwrite`` removes the old TensorBoard event files and starts a new MLflow run.

Example (no tracking requested: nothing is imported, nothing is written):

    >>> from fedrisk.experiment.config import resolve_config
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 3}})
    >>> open_tracking(cfg, "unused", seed=0) is None
    True
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedrisk.api import Callback
from fedrisk.errors import FedriskError

TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"
MLFLOW_RUN_ID = "mlflow_run_id"
FILE_STORE_OPT_IN = "MLFLOW_ALLOW_FILE_STORE"
EXTRA = "tracking"
"""The optional dependency group that installs TensorBoard and MLflow."""


def _require(module: str, option: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise FedriskError(
            f"output.{option} = true needs the package {module.split('.')[0]!r}, which is not installed "
            f"({exc}); install the extra: pip install 'fedrisk[{EXTRA}]'"
        ) from None


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of an evaluation record (without ``round``; booleans and lists left out).

    Example:
        >>> scalars({"round": 3, "test_accuracy": 0.5, "bytes_up": 10, "ok": True, "per_client": [1, 2]})
        {'test_accuracy': 0.5, 'bytes_up': 10.0}
    """
    return {
        k: float(v)
        for k, v in record.items()
        if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _param_text(value: Any) -> str:
    from fedrisk.experiment.schema import format_value

    return value if isinstance(value, str) else format_value(value)


class TensorBoardTracker:
    """Writes scalars and the config text with ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, log_dir: Path, config_toml: str, *, resume_round: int | None) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        if resume_round is None:  # a fresh run: no events of an earlier run in the same directory
            for old in log_dir.glob("events.out.tfevents.*"):
                old.unlink()
        purge = None if resume_round is None else resume_round + 1
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)
        if resume_round is None:
            self.writer.add_text("config", "```toml\n" + config_toml + "```", global_step=0)

    def log(self, round: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=round)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


class MLflowTracker:
    """Logs through an ``MlflowClient`` (no global active run, so runs in one process do not mix)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        run_dir: Path,
        params: Mapping[str, Any],
        config_toml: str,
        tags: Mapping[str, str],
        *,
        resume: bool,
    ) -> None:
        _require("mlflow", "mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance mode behind this opt-in; it needs no database
            # packages, which is why fedrisk's default local store is one (see the module docstring)
            os.environ.setdefault(FILE_STORE_OPT_IN, "true")
        self.client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / MLFLOW_RUN_ID
        if resume and id_file.is_file():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(self._experiment_id(experiment), run_name=run_name, tags=dict(tags))
        self.run_id = run.info.run_id
        id_file.write_text(self.run_id + "\n")
        items = [Param(k, _param_text(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        self.client.log_text(self.run_id, config_toml, "config.toml")

    def _experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # a parallel sweep job created it first
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def log(self, round: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, round) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


class Tracking(Callback):
    """The callback the runner adds: forwards each evaluation record to every tracker."""

    def __init__(self, trackers: list[Any]) -> None:
        self.trackers = trackers

    def on_evaluation(self, sim: Any, record: dict[str, Any]) -> None:
        values = scalars(record)
        for t in self.trackers:
            t.log(int(record["round"]), values)

    def close(self, finished: bool) -> None:
        """End every tracker (MLflow status ``FINISHED``, or ``KILLED`` for an interrupted or failed run)."""
        for t in self.trackers:
            t.close("FINISHED" if finished else "KILLED")


def mlflow_uri(cfg: Any, run_dir: Path) -> str:
    """``output.mlflow_tracking_uri``, or the local file store ``DIR/mlruns`` as a ``file:`` URI."""
    return cfg["output.mlflow_tracking_uri"] or (run_dir.resolve() / MLFLOW_DIR).as_uri()


def open_tracking(cfg: Any, run_dir: str | Path, *, seed: int, resume_round: int | None = None) -> Tracking | None:
    """The trackers ``cfg``'s ``[output]`` asks for (None when it asks for none).

    Args:
        cfg: the resolved :class:`~fedrisk.experiment.config.ExperimentConfig` of one run.
        run_dir: the run directory.
        seed: the run seed (an MLflow tag).
        resume_round: the checkpoint's round when the run resumes, else None.
    """
    if not (cfg["output.tensorboard"] or cfg["output.mlflow"]):
        return None
    from fedrisk.experiment.config import flatten, to_toml_value

    run_dir = Path(run_dir)
    toml = cfg.to_toml()
    trackers: list[Any] = []
    if cfg["output.tensorboard"]:
        trackers.append(TensorBoardTracker(run_dir / TENSORBOARD_DIR, toml, resume_round=resume_round))
    if cfg["output.mlflow"]:
        params = flatten(to_toml_value(cfg.run_values()))
        tags = {"fedrisk.run_dir": str(run_dir), "fedrisk.seed": str(seed), "fedrisk.config": cfg.name}
        trackers.append(
            MLflowTracker(
                mlflow_uri(cfg, run_dir),
                cfg["output.mlflow_experiment"] or cfg.name,
                run_dir.resolve().name,
                run_dir,
                params,
                toml,
                tags,
                resume=resume_round is not None,
            )
        )
    return Tracking(trackers)
