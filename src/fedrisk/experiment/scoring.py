"""``fedrisk evaluate``: score a finished run's saved model on a split or on other data.

A run that selects on validation (``run.select_by``) saves the model of its selected round in
``DIR/selected.pt``; every finished run saves its last global model in ``DIR/model.pt``.
:func:`evaluate_run` rebuilds the run's algorithm (from ``DIR/config.toml``) on the run's own
data, or on the ``[data]`` table of another config, loads the saved parameters (plain tensors,
``torch.load(..., weights_only=True)``), checks that they fit the model, and scores:

* the global model on the global split ``split`` (``"test"`` or ``"validation"``) as
  ``{split}_{metric}``;
* each client's model (its own saved model for a personalised run with the same number of
  clients, else the global model) on the client's own ``split`` split, summarised over clients
  as ``personal_*`` (test) or ``validation_personal_*`` (validation), as during the run.

Example:
    >>> import tempfile
    >>> from fedrisk.experiment.config import resolve_config
    >>> from fedrisk.experiment.runner import run_experiment
    >>> cfg = resolve_config({"data": {"dataset": "wine", "num_clients": 2, "validation_fraction": 0.3},
    ...                       "run": {"rounds": 3}, "output": {"plots": False}})
    >>> result = run_experiment(cfg, tempfile.mkdtemp(), progress="none")
    >>> scored = evaluate_run(result.path, split="validation")
    >>> scored.round == result.summary["selected"]["round"]
    True
    >>> scored.metrics["validation_accuracy"] == result.summary["selected"]["metrics"]["validation_accuracy"]
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedrisk.errors import FedriskError
from fedrisk.experiment.outputs import SELECTED_MODEL, RunDir

MODELS = ("selected", "final")
SPLITS = ("test", "validation")


@dataclass
class Scored:
    """What :func:`evaluate_run` measured, and on what."""

    run: Path
    model: str  # "selected" or "final"
    round: int | None  # the round the model is from (None: the final model of a run without selection)
    selected_by: str
    data: str  # the federation's name
    split: str
    metrics: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        """The scores as a Markdown table, under one line saying what was scored."""
        from fedrisk.experiment.progress import format_number

        what = f"round {self.round}, selected by {self.selected_by}" if self.selected_by else "the last round"
        lines = [
            f"{self.model} model of {self.run} ({what}) on {self.data}, {self.split} split:",
            "",
            "| metric | value |",
            "|---|---:|",
        ]
        lines += [f"| {k} | {format_number(v)} |" for k, v in self.metrics.items()]
        return "\n".join(lines)


def load_saved(run: str | Path, model: str = "selected") -> dict[str, Any]:
    """The saved model of a run directory: ``{"round", "selected_by", "global", ["personal"]}``."""
    from fedrisk.experiment.assemble import MODEL_FILE

    if model not in MODELS:
        raise FedriskError(f"--model {model!r} is not allowed; allowed: {', '.join(MODELS)}")
    rd = RunDir(run)
    if rd.status() != "finished":
        raise FedriskError(
            f"{rd.path} holds no finished run (status: {rd.status()}); allowed: a finished run directory"
        )
    path = rd.path / (SELECTED_MODEL if model == "selected" else MODEL_FILE)
    if not path.is_file():
        hint = (
            "the run selected no round (no validation split; run.select_by): use --model final"
            if model == "selected"
            else "the algorithm has no global model"
        )
        raise FedriskError(f"{path} does not exist: {hint}")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise FedriskError(f"cannot read {path}: {exc}") from None
    if model == "final":
        return {"round": None, "selected_by": "", "global": saved}
    return saved


def _check_fits(saved: Any, expected: Any, run: Path) -> None:
    from torch.utils._pytree import tree_flatten

    got, got_spec = tree_flatten(saved)
    want, want_spec = tree_flatten(expected)
    if got_spec != want_spec or [tuple(t.shape) for t in got] != [tuple(t.shape) for t in want]:
        raise FedriskError(
            f"the model saved in {run} does not fit the model built for these data (parameter names or shapes "
            "differ); allowed: data with the run's input shape and number of classes"
        )


def evaluate_run(
    run: str | Path,
    *,
    split: str = "test",
    config: str | Path | None = None,
    model: str = "selected",
    metrics: Sequence[str] | None = None,
) -> Scored:
    """Score the saved ``model`` of ``run`` on ``split`` of the run's data or of the ``[data]``
    table of ``config`` (with the run's seed); ``metrics`` default to the run's."""
    from fedrisk.experiment.assemble import build_simulation
    from fedrisk.experiment.config import read_toml, resolve_config
    from fedrisk.runtime.evaluation import score_model

    if split not in SPLITS:
        raise FedriskError(f"--split {split!r} is not allowed; allowed: {', '.join(SPLITS)}")
    rd = RunDir(run)
    saved = load_saved(rd.path, model)
    raw = read_toml(rd.config)
    if config is not None:
        other = read_toml(config)
        if "data" not in other:
            raise FedriskError(f"--config {config}: no [data] table to evaluate on")
        raw["data"] = other["data"]
        if other.get("imports"):
            raw["imports"] = sorted(set(raw.get("imports", [])) | set(other["imports"]))
    raw.setdefault("run", {})["select_by"] = "none"  # nothing is selected here
    if str(raw["run"].get("device", "cpu")).startswith("cuda") and not torch.cuda.is_available():
        raw["run"]["device"] = "cpu"  # a run trained on a GPU is scored on a machine without one
    raw["run"]["metrics"] = list(metrics) if metrics else raw["run"].get("metrics", [])
    cfg = resolve_config(raw, source=Path(config) if config is not None else rd.config)
    sim = build_simulation(cfg).simulation
    fed = sim.federation
    if split == "validation" and fed.validation is None and fed.client_validations is None:
        raise FedriskError(
            f"--split validation: the data ({fed.name}) have no validation split; allowed: --split test, or data "
            "with data.validation_fraction or data.client_validation_fraction > 0"
        )
    alg = sim.algorithm
    expected = alg.global_params(sim.server_state)
    glob = saved.get("global") or None
    if glob is not None:
        _check_fits(glob, expected, rd.path)
    personal = saved.get("personal")
    if personal is not None and len(personal) != fed.num_clients:
        personal = None  # other clients: each is scored with the global model
    if glob is None and personal is None:
        raise FedriskError(
            f"{rd.path}: the saved model has no global model and its {len(saved.get('personal') or [])} personal "
            f"models do not match the {fed.num_clients} clients of {fed.name}"
        )
    names = list(cfg["run.metrics"]) or None
    if names is None:
        from fedrisk.api import resolve_metrics

        names = resolve_metrics(sim, None)
    if glob is not None:
        glob = _to_dtype(glob, expected)
    if personal is not None:
        personal = [_to_dtype(p, alg.personal_params(sim.server_state, sim.client_states[0], 0)) for p in personal]
    scores = score_model(alg, fed, names, split, glob, personal)
    return Scored(rd.path, model, saved.get("round"), saved.get("selected_by", ""), fed.name, split, scores)


def _to_dtype(tree: Any, like: Any) -> Any:
    from fedrisk.tree import tree_map

    return tree_map(lambda t, ref: t.to(device=ref.device, dtype=ref.dtype), tree, like)
