"""Evaluation of a run's models with the metrics of :mod:`fedrisk.metrics`.

* the global model (``Algorithm.global_params``) on a global split (``test`` / ``validation``),
  reported as ``"{split}_{metric}"`` — or ``"global_{split}_{metric}"`` for a personalised
  algorithm (``Algorithm.personalized``), whose result is its personal models, not the
  global model it keeps on the way (PERM's w, Ditto's server model);
* personalised models (``Algorithm.personal_params``: client k's own model) on each client's
  own test split, summarised over clients (:func:`client_summary`) as
  ``"personal_{metric}_{stat}"`` with stat ``mean`` (unweighted over clients), ``wmean``
  (weighted by the clients' split sizes), ``std`` (population std over clients), ``bottom10``
  (the mean of the worst 10% of clients, at least one) and ``worst``.  A personalised
  algorithm's record lists these first (they are its headline) and names its global model's
  metrics ``global_{split}_{metric}``.  With ``client_rows`` (a list), :func:`evaluate` also
  appends one row per client and split (client, split, samples, each metric): what
  ``clients.csv`` of a run holds;
* the same on each client's own validation split (``data.client_validation_fraction``) as
  ``"validation_personal_{metric}_{stat}"``: every key measured on validation data starts with
  ``validation_``, which is what model selection (``run.select_by``) may read.

A metric that needs both classes (AUROC, partial AUROCs) or positives (AUPRC) on a per-client
split that lacks them is refused before the run by :func:`check_client_splits`, naming the
client.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fedrisk.algorithms.base import Algorithm
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.metrics import log_loss, parse_metric
from fedrisk.metrics.ranking import is_ranking_metric
from fedrisk.tree import Tree

LOWER_IS_BETTER = ("log_loss", "loss", "std", "generator_error", "grad_phi_norm")
"""Metric names (and suffixes: ``personal_accuracy_std``) whose smaller values are better."""

CLIENT_STATS = ("mean", "wmean", "std", "bottom10", "worst")


def client_summary(values: Sequence[float], sizes: Sequence[int], lower_is_better: bool = False) -> dict[str, float]:
    """Summaries of one metric over clients: unweighted ``mean``, ``wmean`` weighted by ``sizes``,
    population ``std``, ``bottom10`` (mean of the worst ceil(10%) clients) and ``worst``.

    Example:
        >>> s = client_summary([1.0, 0.5, 0.9, 0.8, 1.0, 1.0, 0.7, 0.9, 1.0, 0.2, 0.9], [1] * 10 + [10])
        >>> {k: round(v, 4) for k, v in s.items()}
        {'mean': 0.8091, 'wmean': 0.85, 'std': 0.2429, 'bottom10': 0.35, 'worst': 0.2}
    """
    v = torch.tensor(list(values), dtype=torch.float64)
    w = torch.tensor(list(sizes), dtype=torch.float64)
    ordered = v.sort(descending=lower_is_better).values
    tail = ordered[: max(1, math.ceil(0.1 * len(v)))]
    return {
        "mean": float(v.mean()),
        "wmean": float((v * w).sum() / w.sum()),
        "std": float(v.std(unbiased=False)),
        "bottom10": float(tail.mean()),
        "worst": float(ordered[0]),
    }


def default_metrics(federation: Federation, output_dim: int) -> list[str]:
    """AUROC / AUPRC for one-output binary scorers, accuracy and log-loss otherwise."""
    if federation.num_classes == 2 and output_dim == 1:
        return ["auroc", "auprc"]
    return ["accuracy", "log_loss"]


@torch.no_grad()
def predict(algorithm: Algorithm, params: Tree, x: Tensor, chunk: int = 4096) -> Tensor:
    """Model outputs on ``x`` in chunks (bounded memory)."""
    outs = [algorithm.predict(params, x[i : i + chunk]) for i in range(0, x.shape[0], chunk)]
    return torch.cat(outs) if outs else torch.empty(0)


def looks_like_probabilities(outputs: Tensor) -> bool:
    """True for sigmoid scores in [0, 1] (one column) or rows of a probability simplex."""
    if outputs.numel() == 0 or outputs.min() < 0 or outputs.max() > 1:
        return False
    if outputs.dim() == 1 or outputs.shape[-1] == 1:
        return True
    return bool(torch.allclose(outputs.sum(-1), torch.ones((), dtype=outputs.dtype), atol=1e-5))


def score_split(algorithm: Algorithm, params: Tree, split: Samples, metrics: Sequence[str]) -> dict[str, float]:
    """Every metric of the model with ``params`` on ``split``; log-loss reads the outputs as
    probabilities when they are (sigmoid scorers, softmax heads) and as logits otherwise."""
    scores = predict(algorithm, params, split.x)
    out = {}
    for m in metrics:
        if m == "log_loss":
            out[m] = log_loss(scores, split.y, from_logits=not looks_like_probabilities(scores))
        elif is_ranking_metric(m):  # NDCG: per query (attrs["query"]; none: one list)
            out[m] = parse_metric(m)(scores, split.y, split.attrs.get("query"))
        else:
            out[m] = parse_metric(m)(scores, split.y)
    return out


PERSONAL_PREFIX = {"test": "personal_", "validation": "validation_personal_"}
"""Record-key prefix of the per-client summaries on each client's own test / validation split."""


def needs_classes(metric: str) -> tuple[int, ...]:
    """The label values a binary metric needs present in a split: ``(0, 1)`` for AUROC and the
    partial AUROCs, ``(1,)`` for AUPRC, ``()`` otherwise.

    Example:
        >>> needs_classes("auroc"), needs_classes("spauroc:0.3"), needs_classes("auprc"), needs_classes("accuracy")
        ((0, 1), (0, 1), (1,), ())
    """
    kind = metric.partition(":")[0]
    if kind in ("auroc", "pauroc", "spauroc", "tpauroc"):
        return (0, 1)
    return (1,) if kind == "auprc" else ()


def check_ranking_splits(federation: Federation, metrics: Sequence[str], splits: Sequence[str] = ()) -> None:
    """With an NDCG metric, every query of every split evaluated needs a relevant item (NDCG is
    0/0 otherwise): refused before the run, naming the split (a client's own split names the
    client) and the query."""
    if not any(is_ranking_metric(m) for m in metrics):
        return
    from fedrisk.objectives.ndcg import check_queries

    named = [(f"the {s} set", getattr(federation, s, None)) for s in splits]
    for split in ("validation", "test"):
        named += [(f"client {k}'s {split} split", p) for k, p in enumerate(federation.client_splits(split) or [])]
    for where, part in named:
        if part is None or len(part) == 0:
            continue
        queries = part.attrs.get("query")
        check_queries(part.y, queries if queries is not None else torch.zeros_like(part.y), where)


def check_client_splits(federation: Federation, metrics: Sequence[str], splits: Sequence[str] = ()) -> None:
    """Refuse per-client test / validation splits (and the global ``splits`` evaluated) that
    lack a class one of ``metrics`` needs (see :func:`needs_classes`), naming the client, before
    a run spends any time.

    Example:
        >>> import torch
        >>> s = Samples(torch.zeros(4, 1), torch.tensor([0, 1, 0, 0]))
        >>> fed = Federation("toy", [s, s], 2, client_validations=[s.subset([0, 1]), s.subset([2, 3])])
        >>> check_client_splits(fed, ["accuracy"])
        >>> check_client_splits(fed, ["auroc"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: client 1's validation split (2 rows) has no label 1, which metric 'auroc' ...
    """
    check_ranking_splits(federation, metrics, splits)
    if federation.num_classes != 2:
        return
    for split in ("validation", "test"):
        named = [
            (f"client {k}'s {split} split", p, f"data.client_{split}_fraction")
            for k, p in enumerate(federation.client_splits(split) or [])
        ]
        glob = getattr(federation, split) if split in splits else None
        if glob is not None:
            named.insert(
                0, (f"the {split} set", glob, "data.validation_fraction" if split == "validation" else "the test set")
            )
        for where, part, fix in named:
            if len(part) == 0 or part.y.is_floating_point():
                continue
            present = set(part.y.reshape(-1).long().unique().tolist())
            for m in metrics:
                missing = [c for c in needs_classes(m) if c not in present]
                if missing:
                    raise FedriskError(
                        f"{where} ({len(part)} rows) has no label {missing[0]}, which metric {m!r} needs; allowed: "
                        f"splits holding both classes (a larger {fix}, or a partition that gives every client both "
                        "classes), or metrics without that need (accuracy, log_loss)"
                    )


def evaluate(
    algorithm: Algorithm,
    server_state: Tree,
    client_states: Mapping[int, Tree],
    federation: Federation,
    metrics: Sequence[str],
    splits: Sequence[str] = ("test",),
    personal: bool | None = None,
    client_rows: list[dict[str, Any]] | None = None,
    params: Tree | None = None,
) -> dict[str, float]:
    """All requested metrics for the global model on ``splits`` and, when the federation has
    per-client test / validation splits (and ``personal`` is not False), for every client's own
    model (``personal_params``: the global model for non-personalised algorithms) on its own
    test and validation splits.  Personalised algorithms report the global model as
    ``global_{split}_{metric}``, after the personal metrics; ``client_rows`` (when given)
    receives the per-client values, one row per client and split (``split``: ``"test"``, then
    ``"validation"``; ``samples``: that split's rows); ``params`` replaces the global model."""
    out: dict[str, float] = {}
    # every algorithm is scored per client when the federation has per-client splits: a global
    # model's per-client scores are the reference that personalised methods are compared to
    personal = True if personal is None else personal
    if personal:
        params_of = lambda k: algorithm.personal_params(server_state, client_states[k], k)  # noqa: E731
        for split in ("test", "validation"):
            parts = federation.client_splits(split)
            if parts is not None:
                head = PERSONAL_PREFIX[split]
                out.update(_per_client(algorithm, params_of, parts, metrics, head, client_rows, split))
    prefix = "global_" if getattr(algorithm, "personalized", False) else ""
    if params is None:
        params = algorithm.global_params(server_state)
    if params is not None:
        for name in splits:
            split = getattr(federation, name)
            if split is not None:
                for m, v in score_split(algorithm, params, split, metrics).items():
                    out[f"{prefix}{name}_{m}"] = v
    state_metrics = getattr(algorithm, "state_metrics", None)
    if state_metrics is not None:
        out.update(state_metrics(server_state, federation))
    if not prefix:  # a global model's own metrics first, as before
        out = {**{k: v for k, v in out.items() if "personal_" not in k}, **out}
    return out


def score_model(
    algorithm: Algorithm,
    federation: Federation,
    metrics: Sequence[str],
    split: str,
    params: Tree | None,
    personal: Sequence[Tree] | None = None,
) -> dict[str, float]:
    """A saved model's scores on ``split`` (``"test"`` / ``"validation"``): the global
    ``params`` on the federation's global split, and per client (``personal[k]``, or ``params``
    when None) on the client's own split, with the keys :func:`evaluate` uses."""
    out: dict[str, float] = {}
    glob = getattr(federation, split)
    if params is not None and glob is not None:
        out.update({f"{split}_{m}": v for m, v in score_split(algorithm, params, glob, metrics).items()})
    parts = federation.client_splits(split)
    if parts is not None:
        pick = (lambda k: personal[k]) if personal is not None else (lambda k: params)
        out.update(_per_client(algorithm, pick, parts, metrics, PERSONAL_PREFIX[split]))
    return out


def _per_client(
    algorithm: Algorithm,
    params_of: Callable[[int], Tree],
    parts: Sequence[Samples],
    metrics: Sequence[str],
    prefix: str,
    client_rows: list[dict[str, Any]] | None = None,
    split: str = "test",
) -> dict[str, float]:
    per_client: dict[str, list[float]] = {m: [] for m in metrics}
    sizes: list[int] = []
    for k, part in enumerate(parts):
        if len(part) == 0:
            continue
        scores = score_split(algorithm, params_of(k), part, metrics)
        for m, v in scores.items():
            per_client[m].append(v)
        sizes.append(len(part))
        if client_rows is not None:
            client_rows.append({"client": k, "split": split, "samples": len(part), **scores})
    out: dict[str, float] = {}
    for m, vals in per_client.items():
        if vals:
            for stat, v in client_summary(vals, sizes, m in LOWER_IS_BETTER).items():
                out[f"{prefix}{m}_{stat}"] = v
    return out
