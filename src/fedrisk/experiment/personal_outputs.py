"""Per-client outputs of a run (personalised federated learning):

::

    DIR/clients.csv        one row per client, split and evaluation: round, client, split
                           (each client's own ``test`` split, and its ``validation`` split when
                           ``data.client_validation_fraction > 0``), samples (that split's
                           rows), train_samples and every metric of that client's personal
                           model (the global model for algorithms without personal models)
    DIR/alpha.csv          algorithms with a learned client-to-client weight matrix (PERM's
                           alpha, FedFomo's and APPLE's weights): one row per client each time
                           the matrix changes: round, client, then its weight on client 0..N-1
    DIR/clusters.csv       clustered methods (IFCA): one row per client and evaluation: round,
                           client, cluster (the method's current estimate) and group (the
                           client's true group where the data define one: the synthetic
                           clusters' ``cluster`` attribute, else the set of classes it holds)
    DIR/lambda_guide.txt   PERM: the discrepancy scale and the lam range where the number of
                           partners changes, from the first estimation (also printed)

The callbacks of :func:`personal_callbacks` write them; a resumed run first drops the rows of
rounds after its checkpoint, so every row appears once.  :func:`read_clients` /
:func:`read_alpha` read them back (pandas is not needed).

Example:
    >>> import tempfile, torch
    >>> from fedrisk import run_federation
    >>> from fedrisk.algorithms import PERM
    >>> from fedrisk.data.sources.synthetic import perm_two_cluster_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> fed = perm_two_cluster_federation(4, samples_per_client=30, dim=3, test_per_client=10, seed=0)
    >>> alg = PERM(model=FunctionalModel(build_model("logreg", (3,), 2)), loss=cross_entropy, lam=5.0)
    >>> out = Path(tempfile.mkdtemp())
    >>> _ = run_federation(fed, alg, rounds=10, callbacks=personal_callbacks(out, stream=None))
    >>> rows = read_clients(out / CLIENTS_CSV)
    >>> len(rows), sorted(rows[0])[:4]
    (40, ['accuracy', 'client', 'log_loss', 'round'])
    >>> sorted({r["round"] for r in read_alpha(out / ALPHA_CSV)})  # alpha^0 (uniform), then the estimate of round 6
    [0, 6]
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from fedrisk.api import Callback
from fedrisk.runtime.simulation import RoundReport, Simulation

CLIENTS_CSV = "clients.csv"
ALPHA_CSV = "alpha.csv"
CLUSTERS_CSV = "clusters.csv"
LAMBDA_GUIDE = "lambda_guide.txt"
PERSONAL_FILES = (CLIENTS_CSV, ALPHA_CSV, CLUSTERS_CSV, LAMBDA_GUIDE)
"""Files these callbacks own (``--overwrite`` removes them with the run's other outputs)."""


def weight_matrix(sim: Simulation) -> torch.Tensor | None:
    """The algorithm's current N x N client weight matrix (row i: client i's weights), or None."""
    fn = getattr(sim.algorithm, "weight_matrix", None)
    if fn is not None:
        return fn(sim.server_state)
    rows = getattr(sim.algorithm, "client_weights", None)  # kept on the clients (APPLE's DR vectors)
    return None if rows is None else rows(sim.client_states)


def client_clusters(sim: Simulation) -> torch.Tensor | None:
    """The clustered method's current cluster of every client (IFCA's estimates), or None."""
    fn = getattr(sim.algorithm, "client_clusters", None)
    return None if fn is None else fn(sim.client_states)


def true_groups(fed: Any) -> list[str]:
    """Each client's true group, where the data define one: ``info["client_clusters"]``, else
    a ``cluster`` attribute constant over the client's rows (the synthetic PERM clusters), else
    the set of classes the client holds (``"2+7"``; clients of a ``k_classes`` split that hold
    the same classes form a group).

    Example:
        >>> from fedrisk.data.sources.synthetic import perm_two_cluster_federation
        >>> true_groups(perm_two_cluster_federation(4, samples_per_client=10, seed=0))
        ['0', '0', '1', '1']
    """
    given = fed.info.get("client_clusters")
    if given is not None:
        return [str(g) for g in given]
    attrs = [(getattr(c, "attrs", None) or {}).get("cluster") for c in fed.clients]
    if all(a is not None and len(a) and bool((a == a[0]).all()) for a in attrs):
        return [str(int(a[0])) for a in attrs]  # type: ignore[index]
    return [
        "+".join(str(k) for k in sorted(set(c.y.tolist()))) if not c.y.is_floating_point() else "" for c in fed.clients
    ]


def _keep_rounds(path: Path, last_round: int) -> None:
    """Drop the rows of rounds after ``last_round`` (a resumed run rewrites them)."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if not lines:
        return
    kept = [lines[0]] + [ln for ln in lines[1:] if ln.strip() and int(ln.split(",", 1)[0]) <= last_round]
    path.write_text("".join(kept), encoding="utf-8")


def _append(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    new = not path.is_file() or path.stat().st_size == 0
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if new:
        writer.writerow(header)
    writer.writerows(rows)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(buf.getvalue())


class ClientsWriter(Callback):
    """Appends the per-client values of every evaluation to ``clients.csv``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.columns: list[str] | None = None

    def on_start(self, sim: Simulation) -> None:
        _keep_rounds(self.path, sim.round)
        if self.path.is_file() and self.path.stat().st_size:
            self.columns = self.path.read_text(encoding="utf-8").split("\n", 1)[0].split(",")

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        rows = sim.client_scores
        if not rows:
            return
        metrics = [k for k in rows[0] if k not in ("client", "split", "samples")]
        if self.columns is None:
            self.columns = ["round", "client", "split", "samples", "train_samples", *metrics]
        sizes = sim.federation.client_sizes
        out = []
        for row in rows:
            values = {"round": record["round"], "train_samples": sizes[int(row["client"])], **row}
            values["test_samples"] = row["samples"]  # the column's name in files written before validation rows
            out.append([values.get(c, "") for c in self.columns])
        _append(self.path, self.columns, out)


class ClustersWriter(Callback):
    """Appends every client's cluster (and its true group) at every evaluation to ``clusters.csv``
    for algorithms that estimate cluster memberships (``client_clusters``, e.g. IFCA)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.groups: list[str] | None = None

    def on_start(self, sim: Simulation) -> None:
        _keep_rounds(self.path, sim.round)
        if getattr(sim.algorithm, "client_clusters", None) is not None:
            self.groups = true_groups(sim.federation)

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        clusters = client_clusters(sim)
        if clusters is None or self.groups is None:
            return
        rows = [[record["round"], k, int(c), self.groups[k]] for k, c in enumerate(clusters.tolist())]
        _append(self.path, ["round", "client", "cluster", "group"], rows)


class AlphaWriter(Callback):
    """Writes the algorithm's weight matrix to ``alpha.csv`` whenever it changes, and PERM's
    lam guide (:func:`fedrisk.algorithms.perm_weights.lambda_guide`) after its first estimation."""

    def __init__(self, path: Path, guide: Path | None, stream: TextIO | None) -> None:
        self.path = path
        self.guide = guide
        self.stream = stream
        self._last: torch.Tensor | None = None

    def on_start(self, sim: Simulation) -> None:
        _keep_rounds(self.path, sim.round)
        self._last = None
        if sim.round > 0 and self.path.is_file():  # resumed: the latest written matrix is the current one
            self._last = weight_matrix(sim)
        self._write(sim, sim.round)

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None:
        self._write(sim, sim.round)
        estimations = sim.server_state.get("estimations") if isinstance(sim.server_state, Mapping) else None
        if estimations is not None and int(estimations) == 1 and report.kind == "estimate":
            self._guide(sim, report.clients)

    def _write(self, sim: Simulation, round: int) -> None:
        alpha = weight_matrix(sim)
        if alpha is None or (self._last is not None and torch.equal(alpha, self._last)):
            return
        self._last = alpha.clone()
        N = alpha.shape[0]
        rows = [[round, i, *(repr(float(x)) for x in alpha[i].tolist())] for i in range(N)]
        _append(self.path, ["round", "client", *map(str, range(N))], rows)

    def _guide(self, sim: Simulation, clients: Sequence[int]) -> None:
        from fedrisk.algorithms.perm_weights import lambda_guide

        index = torch.tensor(list(clients), dtype=torch.long)
        D = sim.server_state["discrepancy"][index][:, index]
        sizes = [sim.federation.client_sizes[k] for k in clients]
        text = f"round {sim.round}: " + lambda_guide(D, sizes, getattr(sim.algorithm, "lam", None))
        if self.guide is not None:
            self.guide.write_text(text + "\n", encoding="utf-8")
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()


def personal_callbacks(run_dir: str | Path, stream: TextIO | None = sys.stderr) -> list[Callback]:
    """The callbacks writing ``clients.csv``, ``alpha.csv``, ``clusters.csv`` and ``lambda_guide.txt``
    into ``run_dir`` (``stream``: where the lam guide is printed; None: not printed)."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    return [
        ClientsWriter(d / CLIENTS_CSV),
        AlphaWriter(d / ALPHA_CSV, d / LAMBDA_GUIDE, stream),
        ClustersWriter(d / CLUSTERS_CSV),
    ]


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def read_clients(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``clients.csv`` (numbers parsed)."""
    with open(path, encoding="utf-8", newline="") as fh:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def read_alpha(path: str | Path) -> list[dict[str, Any]]:
    """The matrices of an ``alpha.csv``: ``{"round": r, "alpha": Tensor [N, N]}`` per change."""
    by_round: dict[int, list[list[float]]] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        next(reader, None)
        for row in reader:
            by_round.setdefault(int(row[0]), []).append([float(x) for x in row[2:]])
    return [{"round": r, "alpha": torch.tensor(m, dtype=torch.float64)} for r, m in by_round.items()]


def read_clusters(path: str | Path) -> dict[int, list[tuple[int, str]]]:
    """The memberships of a ``clusters.csv``: per evaluation round, (cluster, true group) per client."""
    out: dict[int, list[tuple[int, str]]] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            out.setdefault(int(row["round"]), []).append((int(row["cluster"]), row["group"]))
    return out


def cluster_table(groups: Sequence[tuple[str, Sequence[Path]]]) -> str:
    """Per configuration with a ``clusters.csv``: the clusters in use at the last evaluation and
    the adjusted Rand index (ARI) of the estimated memberships against the true groups (1: the
    same partition up to the cluster names; about 0: no better than chance), per seed and mean
    ± std; "" when no run has the file.

    Example:
        >>> cluster_table([("fedavg", [Path("no-such-run")])])
        ''
    """
    rows = []
    for label, dirs in groups:
        found = [Path(d) / CLUSTERS_CSV for d in dirs if (Path(d) / CLUSTERS_CSV).is_file()]
        if found:
            from sklearn.metrics import adjusted_rand_score  # only for runs with memberships
        aris, used, rounds, first = [], [], [], []
        for path in found:
            by_round = read_clusters(path)
            if not by_round:
                continue
            last = max(by_round)
            est, truth = [c for c, _ in by_round[last]], [g for _, g in by_round[last]]
            aris.append(float(adjusted_rand_score(truth, est)))
            used.append(len(set(est)))
            rounds.append(last)
            hits = [r for r in sorted(by_round) if adjusted_rand_score(truth, [c for c, _ in by_round[r]]) >= 1.0]
            first.append(str(hits[0]) if hits else "–")
        if not aris:
            continue
        mean = sum(aris) / len(aris)
        std = (sum((a - mean) ** 2 for a in aris) / (len(aris) - 1)) ** 0.5 if len(aris) > 1 else 0.0
        rows.append(
            f"| {label} | {len(aris)} | {'/'.join(map(str, rounds))} | {'/'.join(map(str, used))} | "
            f"{mean:.4f} ± {std:.4f} | {' / '.join(f'{a:.4f}' for a in aris)} | {'/'.join(first)} |"
        )
    if not rows:
        return ""
    head = (
        "| configuration | runs | last evaluation | clusters in use | ARI vs true groups | ARI per run | "
        "first evaluation with ARI = 1 |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    return head + "\n" + "\n".join(rows)


def _final_client_values(run_dir: Path, metric: str) -> list[float]:
    path = run_dir / CLIENTS_CSV
    if not path.is_file():
        return []
    rows = [r for r in read_clients(path) if r.get("split", "test") == "test" and metric in r and r[metric] != ""]
    if not rows:
        return []
    last = max(r["round"] for r in rows)
    return [float(r[metric]) for r in rows if r["round"] == last]


def plot_personal(
    groups: Sequence[tuple[str, Sequence[Path]]], out_dir: str | Path, metric: str = "accuracy"
) -> list[Path]:
    """Per-client plots of a report: ``clients_{metric}.png``, a box plot per configuration of
    every client's final ``metric`` (each client's model on its own test split; seeds pooled),
    and ``alpha_<label>.png``, the heat map of the final weight matrix of each configuration's
    first run with an ``alpha.csv``.  ``groups``: (label, run directories).  Returns the files.

    Example:
        >>> plot_personal([("fedavg", [Path("no-such-run")])], ".")
        []
    """
    series = [(label, [v for d in dirs for v in _final_client_values(Path(d), metric)]) for label, dirs in groups]
    series = [(label, vals) for label, vals in series if vals]
    alphas = []
    for label, dirs in groups:
        found = [Path(d) / ALPHA_CSV for d in dirs if (Path(d) / ALPHA_CSV).is_file()]
        if found:
            mats = read_alpha(found[0])
            if mats:
                alphas.append((label, mats[-1]))
    if not series and not alphas:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if series:
        fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(series) + 1.5), 3.8))
        ax.boxplot([v for _, v in series], showmeans=True)
        ax.set_xticks(range(1, len(series) + 1), [label for label, _ in series], rotation=30, ha="right")
        ax.set_ylabel(f"{metric} (own test split)")
        ax.set_title(f"per-client {metric} at the last evaluation")
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        path = out / f"clients_{metric}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    for label, mat in alphas:
        fig, ax = plt.subplots(figsize=(4.6, 4.0))
        values = mat["alpha"].numpy()
        signed = bool(values.min() < 0)  # FedFomo's affinities can be negative: a diverging map around 0
        bound = float(abs(values).max()) or 1.0
        image = ax.imshow(values, cmap="RdBu_r" if signed else "viridis", vmin=-bound if signed else 0.0, vmax=bound)
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_xlabel("client j (weight on its data)")
        ax.set_ylabel("client i (row alpha_i)")
        ax.set_title(f"{label}: weights at round {mat['round']}")
        fig.tight_layout()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
        path = out / f"alpha_{safe}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


__all__ = [
    "ALPHA_CSV",
    "CLIENTS_CSV",
    "CLUSTERS_CSV",
    "LAMBDA_GUIDE",
    "PERSONAL_FILES",
    "AlphaWriter",
    "ClientsWriter",
    "ClustersWriter",
    "client_clusters",
    "cluster_table",
    "personal_callbacks",
    "plot_personal",
    "read_alpha",
    "read_clients",
    "read_clusters",
    "true_groups",
    "weight_matrix",
]
