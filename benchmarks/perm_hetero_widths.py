"""Personal accuracy per model width of finished ``perm_hetero`` runs (paper 003, Sec. 3.3):
each client's own model on its own test split, grouped by the client's width
(``widths[k mod len(widths)]``), read from the runs' checkpoints.  For a run of another
personalised algorithm (the full-width reference) the clients are grouped by ``k mod --groups``,
the same client groups.

    python benchmarks/perm_hetero_widths.py runs/perm_fmnist_hetero/seed=0 runs/perm_fmnist_scaled/perm/seed=0
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fedrisk.experiment.config import load_config
from fedrisk.experiment.runner import build_simulation, load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--groups", type=int, default=3, help="client groups k mod G for runs without widths")
    args = parser.parse_args()
    for run in args.runs:
        sim = build_simulation(load_config(run / "config.toml")).simulation
        alg, fed = sim.algorithm, sim.federation
        server = load_checkpoint(run / "checkpoint.pt")["simulation"]["server_state"]
        groups: dict[str, list[float]] = {}
        for k, test in enumerate(fed.client_tests):
            params = alg.personal_params(server, None, k)
            with torch.no_grad():
                acc = float((alg.model.apply(params, test.x).argmax(-1) == test.y).float().mean())
            g = args.groups
            label = f"width {alg.width(k):g}" if hasattr(alg, "width") else f"clients k mod {g} = {k % g}"
            groups.setdefault(label, []).append(acc)
        for label, accs in groups.items():
            a = torch.tensor(accs)
            print(f"{run}: {label} ({len(accs)} clients): personal accuracy {a.mean():.4f}, worst {a.min():.4f}")


if __name__ == "__main__":
    main()
