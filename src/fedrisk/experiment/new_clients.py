"""Clients that join after training: their personal models and metrics (issue 28).

A trained run's models serve clients that took no part in training, each by its method's own rule:

* **PERM** (``perm``, ``perm_two_stage``, ``perm_shuffling``): one discrepancy round at the
  trained global model w — the new client's full local gradient and every training client's,
  ``D_cj = ||grad f_c(w) - grad f_j(w)||^2`` — gives its mixing weights over the N training
  clients and itself (eq. (2) with the run's lam; ``perm_shuffling``: its fixed rule), and its
  personal model solves its own weighted ERM (eq. (3)) by Alg. 1's visits: from w, ``epochs``
  epochs in which the model visits every client (the new one included, in a random order) for
  K local steps of size ``lr * alpha_c(host)``.  This uses the training clients' data, as
  PERM's shuffling does (default ``epochs``: the epochs the run completed, at least 1).
* **IFCA**: the cluster model with the smallest loss on the client's training data.
* **APPLE**: the new client's directed-relationship vector p_c over the N trained core models
  (from the uniform p^0 = 1/N) is learned on its own training data by ``rounds`` rounds of
  APPLE's client update with the cores frozen and no core of its own (``local_steps`` SGD steps
  of size ``dr_lr`` per round on ``L_c(sum_j p_cj theta_j) + lam(r) mu / 2 ||p_c - p^0||^2``,
  the cosine schedule lam(r) counted from the client's first round); its personal model is
  ``sum_j p_cj theta_j`` and ``weights`` holds the p_c.
* **Methods with a global model and a personalisation step** (``fedavg_ft``, ``perfedavg``,
  ``pfedme``, ``ditto``, ``apfl``) and **FedFomo**: ``rounds`` rounds (default 1) of the
  method's own ``client_update`` on the new client, from the trained server state (the
  fine-tuning steps of FedAvg-FT, Per-FedAvg's adaptation step, Ditto's proximal steps, ...;
  FedFomo starts from the run's initial model, downloads ``num_download`` random training
  clients' models, its first-round rule, and mixes them by their loss improvement on its
  validation rows, eqs. (6)-(7)); the server state is not changed.

Methods without personal models (FedAvg, SCAFFOLD, ...) and ``local_only`` / ``perm_hetero``
are refused with a one-line error, as is a new-client federation whose inputs or classes differ.

Example:
    >>> import torch
    >>> from fedrisk.algorithms import PERM
    >>> from fedrisk.data.sources.synthetic import perm_two_cluster_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = perm_two_cluster_federation(6, samples_per_client=40, dim=4, test_per_client=10, seed=0)
    >>> train, new = select_clients(fed, [0, 1, 3, 4]), select_clients(fed, [2, 5])
    >>> alg = PERM(model=FunctionalModel(build_model("logreg", (4,), 2, bias=False)), loss=cross_entropy, lam=2.0)
    >>> sim = Simulation(alg, train, seed=0)
    >>> _ = [sim.step() for _ in range(10)]
    >>> out = personalise_new_clients(sim, new, metrics=["accuracy"])
    >>> [r["client"] for r in out.rows], out.weights.shape
    ([0, 1], torch.Size([2, 5]))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedrisk.algorithms.base import Algorithm, RoundContext
from fedrisk.algorithms.local import full_batch_objective, sgd_steps, supervised_objective
from fedrisk.autodiff import value_and_grad
from fedrisk.data.federation import Federation
from fedrisk.errors import FedriskError
from fedrisk.experiment.outputs import markdown_rows
from fedrisk.rng import client_generator, generator
from fedrisk.runtime.device import to_device
from fedrisk.runtime.evaluation import LOWER_IS_BETTER, client_summary, score_split
from fedrisk.runtime.simulation import Simulation, fed_info, local_data
from fedrisk.tree import Tree, tree_flatten_vector, tree_map, tree_to

PERM_NAMES = ("perm", "perm_two_stage", "perm_shuffling")
UPDATE_RULE = ("fedavg_ft", "perfedavg", "pfedme", "ditto", "apfl", "fedfomo", "ifca", "apple")


@dataclass
class NewClients:
    """Personal models of new clients: ``params[c]``, per-client metric ``rows`` (client, test
    samples, metrics), their ``summary`` (``personal_{metric}_{stat}``) and, for PERM, the
    ``weights`` [C, N + 1] (columns: the N training clients, then the client itself)."""

    params: list[Tree]
    rows: list[dict[str, Any]]
    summary: dict[str, float]
    weights: Tensor | None = None
    notes: list[str] = field(default_factory=list)
    self_column: bool = True


def check_compatible(train: Federation, new: Federation) -> None:
    """Refuse new clients whose inputs or classes differ from the training federation's."""
    shape, new_shape = tuple(train.clients[0].x.shape[1:]), tuple(new.clients[0].x.shape[1:])
    if shape != new_shape:
        raise FedriskError(f"new clients: inputs of shape {list(new_shape)} differ from the run's {list(shape)}")
    if train.num_classes != new.num_classes:
        raise FedriskError(
            f"new clients: {new.num_classes} classes differ from the run's {train.num_classes}; the trained models "
            "cannot serve them"
        )
    if new.client_tests is None:
        raise FedriskError("new clients: the federation has no per-client test splits (set data.client_test_fraction)")


def _gradient(alg: Any, params: Tree, data: Any) -> Tensor:
    return tree_flatten_vector(value_and_grad(full_batch_objective(alg.model.apply, alg.loss))(params, data)[1])


def perm_new_clients(
    sim: Simulation, new: Federation, epochs: int | None = None, seed: int = 0
) -> tuple[list[Tree], Tensor]:
    """PERM's rule (module docstring): weights [C, N + 1] and the personal models."""
    from fedrisk.algorithms.perm import PERM
    from fedrisk.algorithms.perm_weights import mixing_weights, squared_distances

    alg, state = sim.algorithm, sim.server_state
    w = state["w"]
    train = [local_data(s) for s in sim.federation.clients]
    N = len(train)
    if epochs is None:
        epochs = max(1, sim.round // (N + 1 if isinstance(alg, PERM) else N))
    grads = torch.stack([_gradient(alg, w, d) for d in train])
    objective = supervised_objective(alg.model.apply, alg.loss)
    weights, models = [], []
    for c, samples in enumerate(new.clients):
        mine = local_data(samples.to(sim.dtype, sim.device))
        sizes = [*sim.federation.client_sizes, len(samples)]
        if isinstance(alg, PERM):
            D = squared_distances(torch.cat([grads, _gradient(alg, w, mine)[None]]))
            alpha = mixing_weights(D, sizes, alg.lam)[N]
        elif alg.weights == "local":
            alpha = torch.zeros(N + 1, dtype=torch.float64).index_fill(0, torch.tensor([N]), 1.0)
        elif alg.weights == "samples":
            alpha = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
        else:
            alpha = torch.full((N + 1,), 1.0 / (N + 1), dtype=torch.float64)
        hosts = [*train, mine]
        gen = torch.Generator().manual_seed(int(seed) * 100003 + c)
        v = w
        for _ in range(epochs):  # Alg. 1's visits of one model: every host once per epoch
            for h in torch.randperm(N + 1, generator=gen).tolist():
                n_h = int(hosts[h].size)
                idx = torch.randint(0, n_h, (alg.local_steps, alg.batch_size), generator=gen)
                v, _ = sgd_steps(objective, v, hosts[h], idx, alg.lr * float(alpha[h]))
        weights.append(alpha)
        models.append(v)
    return models, torch.stack(weights)


def apple_new_clients(sim: Simulation, new: Federation, rounds: int = 1) -> tuple[list[Tree], Tensor]:
    """APPLE's rule (module docstring): the DR vectors [C, N] and the personal models."""
    from fedrisk.algorithms.apple import combine

    alg, cores = sim.algorithm, sim.server_state["cores"]
    N = sim.federation.num_clients
    models, weights = [], []
    for c, samples in enumerate(new.clients):
        data = local_data(samples.to(sim.dtype, sim.device))
        dtype = next(iter(cores.values())).dtype if isinstance(cores, dict) else sim.dtype
        on = {"dtype": dtype, "device": sim.device}
        state = {"p": torch.full((N,), 1.0 / N, **on), "me": torch.zeros(N, **on)}  # no own core
        for r in range(rounds):  # the client's own rounds 0, 1, ...: lam(r) from its start
            ctx = RoundContext(r, sim.info)
            draws = alg.draw(ctx, c, len(samples), client_generator(sim.seed, 10**9 + r, c, "new_client"))
            draws = to_device(draws, sim.device)
            state = alg.client_update(ctx, {"cores": cores}, state, data, draws).state
        weights.append(state["p"])
        models.append(combine(cores, state["p"]))
    return models, torch.stack(weights)


def rule_new_clients(sim: Simulation, new: Federation, rounds: int = 1) -> list[Tree]:
    """The method's own ``client_update`` on each new client, ``rounds`` times, from the trained server state."""
    alg, state = sim.algorithm, sim.server_state
    info = fed_info(new)
    plan = alg.configure(RoundContext(sim.round, sim.info), state, torch.Generator().manual_seed(sim.round))
    models = []
    for c, samples in enumerate(new.clients):
        data = local_data(samples.to(sim.dtype, sim.device))
        params0 = alg.global_params(state)  # the new client's own model starts at the trained global one
        if params0 is None:  # (FedFomo, IFCA: at the run's initial model)
            params0 = tree_to(alg.init_params(generator(sim.seed, "init")), sim.dtype, sim.device)
        client_state = to_device(alg.init_client(RoundContext(0, info, "init"), c, params0), sim.device)
        payload = to_device(_payload(alg, state, plan, c, sim), sim.device)
        for r in range(rounds):
            ctx = RoundContext(sim.round + r, sim.info, plan.kind)
            rng = client_generator(sim.seed, 10**9 + r, c, "new_client")
            draws = to_device(alg.draw(ctx, c, len(samples), rng), sim.device)
            client_state = alg.client_update(ctx, payload, client_state, data, draws).state
        models.append(alg.personal_params(state, client_state, c))
    return models


def _payload(alg: Algorithm, state: Any, plan: Any, client: int, sim: Simulation) -> dict[str, Any]:
    if plan.per_client is None:
        return dict(plan.broadcast)
    if alg.name == "fedfomo":  # no affinity yet: num_download random training clients' models
        N = sim.federation.num_clients
        M = min(alg.num_download, N)  # type: ignore[attr-defined]
        gen = torch.Generator().manual_seed(client)
        ids = torch.randperm(N, generator=gen)[:M].sort().values
        return {**plan.broadcast, "others": tree_map(lambda x: x[ids], state["models"]), "ids": ids}
    raise FedriskError(f"new clients: {alg.name} sends per-client payloads; no rule for clients outside training")


def personalise_new_clients(
    sim: Simulation,
    new: Federation,
    metrics: Sequence[str] = ("accuracy",),
    *,
    epochs: int | None = None,
    rounds: int = 1,
    seed: int = 0,
) -> NewClients:
    """Personal models and metrics of the clients of ``new`` from the trained ``sim`` (module docstring)."""
    alg = sim.algorithm
    name = alg.name
    if not getattr(alg, "personalized", False):
        raise FedriskError(
            f"new clients: {name} has no personal models, so there is no personalised metric to report; "
            f"use a personalised method ({', '.join(PERM_NAMES + UPDATE_RULE)})"
        )
    if name not in PERM_NAMES + UPDATE_RULE:
        raise FedriskError(
            f"new clients: no rule for {name} (its personal models need training of their own); supported: "
            f"{', '.join(PERM_NAMES + UPDATE_RULE)}"
        )
    check_compatible(sim.federation, new)
    weights = None
    if name in PERM_NAMES:
        models, weights = perm_new_clients(sim, new, epochs, seed)
    elif name == "apple":
        models, weights = apple_new_clients(sim, new, rounds)
    else:
        models = rule_new_clients(sim, new, rounds)
    rows, per_metric, sizes = [], {m: [] for m in metrics}, []
    for c, (params, test) in enumerate(zip(models, new.client_tests)):  # type: ignore[arg-type]
        scores = score_split(alg, params, test.to(sim.dtype, sim.device), metrics)
        rows.append({"client": c, "test_samples": len(test), **scores})
        for m, v in scores.items():
            per_metric[m].append(v)
        sizes.append(len(test))
    summary = {}
    for m, vals in per_metric.items():
        for stat, v in client_summary(vals, sizes, m in LOWER_IS_BETTER).items():
            summary[f"personal_{m}_{stat}"] = v
    return NewClients(models, rows, summary, weights, self_column=name != "apple")


def select_clients(fed: Federation, ids: Sequence[int]) -> Federation:
    """The federation of the clients ``ids`` only (e.g. clients held out of training).

    Example:
        >>> from fedrisk.data.sources.synthetic import perm_two_cluster_federation
        >>> select_clients(perm_two_cluster_federation(4, samples_per_client=20, seed=0), [1, 3]).num_clients
        2
    """
    bad = [k for k in ids if not 0 <= int(k) < fed.num_clients]
    if bad or not ids:
        raise FedriskError(f"new_clients.clients: {bad or 'none'} not in 0 .. {fed.num_clients - 1}")
    tests = None if fed.client_tests is None else [fed.client_tests[int(k)] for k in ids]
    return Federation(
        f"{fed.name}[{','.join(map(str, ids))}]",
        [fed.clients[int(k)] for k in ids],
        fed.num_classes,
        client_tests=tests,
        class_names=fed.class_names,
        info=dict(fed.info),
    )


def evaluate_new_clients(run: str | Path, config: str | Path, **options: Any) -> NewClients:
    """``fedrisk evaluate RUN --new-clients CONFIG``: rebuild the run ``RUN`` at its checkpoint,
    build the new clients from CONFIG's ``[data]`` (a ``[model]`` table, when given, must equal
    the run's; ``[new_clients] clients = [...]`` keeps only those clients) and personalise them
    (:func:`personalise_new_clients`, ``options`` passed on); writes ``RUN/new_clients.csv``."""
    from fedrisk.experiment.assemble import build_simulation
    from fedrisk.experiment.callbacks import load_checkpoint
    from fedrisk.experiment.config import read_toml, resolve_config
    from fedrisk.experiment.outputs import RunDir

    rd = RunDir(run)
    if not rd.config.is_file() or not rd.checkpoint.is_file():
        raise FedriskError(f"{rd.path}: not a run directory with a checkpoint (config.toml and checkpoint.pt)")
    ours = read_toml(rd.config)
    sim = build_simulation(resolve_config(ours)).simulation
    sim.load_state_dict(load_checkpoint(rd.checkpoint)["simulation"])
    raw = read_toml(config)
    if "data" not in raw:
        raise FedriskError(f"{config}: no [data] table; it describes the new clients' data")
    model = raw.get("model", {})
    differing = sorted(k for k in model if model[k] != ours.get("model", {}).get(k))
    if differing:
        raise FedriskError(
            f"{config}: [model] differs from the run's in {', '.join(differing)}; new clients are served by the "
            "run's trained models (leave [model] out, or copy the run's)"
        )
    spec = {k: v for k, v in ours.items() if k not in ("data", "output", "sweep")}
    new = build_simulation(resolve_config({**spec, "data": raw["data"]})).simulation.federation
    chosen = raw.get("new_clients", {}).get("clients")
    if chosen is not None:
        new = select_clients(new, chosen)
    metrics = sim_metrics(ours)
    out = personalise_new_clients(sim, new, metrics, **options)
    _write_rows(rd.path / "new_clients.csv", out.rows)
    return out


def sim_metrics(config: dict[str, Any]) -> list[str]:
    """The run's metrics (``run.metrics``; accuracy and log-loss when unset)."""
    return list(config.get("run", {}).get("metrics") or ["accuracy", "log_loss"])


def format_new_clients(out: NewClients, run: str | Path | None = None) -> str:
    """A Markdown table of the new clients' metrics (and, for PERM, their largest weights), then the summary."""
    if not out.rows:
        return "no new clients"
    metrics = [k for k in out.rows[0] if k not in ("client", "test_samples")]
    head = ["client", "test samples", *metrics] + (
        ["largest weights (training client: weight" + ("; 'self')" if out.self_column else ")")]
        if out.weights is not None
        else []
    )
    rows = []
    for row in out.rows:
        cells = [str(row["client"]), str(row["test_samples"]), *(f"{row[m]:.4f}" for m in metrics)]
        if out.weights is not None:
            w = out.weights[int(row["client"])]
            N = w.shape[0] - 1 if out.self_column else -1
            top = [int(j) for j in w.argsort(descending=True)[:4] if float(w[j]) > 0]
            cells.append(", ".join(f"{'self' if j == N else j}: {float(w[j]):.3f}" for j in top))
        rows.append(cells)
    lines = [markdown_rows(head, rows, text_columns=0), ""]
    lines += [f"{k} = {v:.4f}" for k, v in out.summary.items() if k.endswith(("_mean", "_bottom10", "_worst"))]
    if run is not None:
        lines.append(f"per-client values: {Path(run) / 'new_clients.csv'}")
    return "\n".join(lines)


def _write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    import csv

    if not rows:
        return
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
