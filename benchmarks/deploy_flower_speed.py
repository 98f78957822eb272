"""Seconds per round of a config on a real Flower deployment on loopback (a SuperLink and one
SuperNode per client on 127.0.0.1, ``fedrisk.deploy.commands.LocalFederation``) against the
sequential executor, and where a deployed round's time goes.

    .venv/bin/python benchmarks/deploy_flower_speed.py [--rounds 4] [--clients 2] [--messages 3]

Printed:

* seconds per round of ``fedrisk run`` (sequential executor) and of ``fedrisk deploy run`` for the
  same config (digits, logistic regression, SCAFFOLD with 2 local steps, one torch thread, an
  evaluation every round), from the ``wall_time`` of consecutive ``metrics.jsonl`` records (round
  1 of the deployed run includes nothing of the start: the handshake comes before the clock);
* Flower's own accounting of the deployed run (``flwr ls``: ServerApp and ClientApp seconds);
* the cost of one ClientApp message in a fresh process, as Flower runs it (``flwr-clientapp``
  per message): interpreter + imports (torch, flwr, fedrisk), building the config's simulation
  on the node (dataset, partition, model, algorithm), and the client's round itself
  (``node_round`` minus the build), ``--messages`` times.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedrisk.deploy.commands import LocalFederation, flwr_home, run_deployed
from fedrisk.experiment import resolve_config
from fedrisk.experiment.runner import run_experiment

MESSAGE = r"""
import time, sys
t0 = time.perf_counter()
import torch, flwr.clientapp, fedrisk.deploy.apps
from fedrisk.experiment.config import load_config
from fedrisk.experiment.runner import build_simulation
from fedrisk.algorithms.base import RoundContext
from fedrisk.deploy.records import Meta, encode
from fedrisk.deploy.handshake import fingerprint
from fedrisk.deploy.client import client_round
from fedrisk.deploy.state import ClientStateStore
from fedrisk.rng import server_generator
t1 = time.perf_counter()
cfg = load_config(sys.argv[1])
torch.set_num_threads(1)
sim = build_simulation(cfg).simulation
t2 = time.perf_counter()
plan = sim.algorithm.configure(RoundContext(0, sim.info), sim.server_state, server_generator(0, 0, "configure"))
content = encode(plan.payload(0), Meta(0, 0, 0, plan.kind, fingerprint(cfg.semantic())))
t3 = time.perf_counter()
client_round(sim.algorithm, sim.info, content, sim.client_states[0], sim.data[0])
t4 = time.perf_counter()
store = ClientStateStore(sys.argv[2])
store.save("bench", 0, 0, store.load("bench", 0) or sim.client_states[0])
t5 = time.perf_counter()
print("TIMES", t1 - t0, t2 - t1, t4 - t3, t5 - t4)
"""


def per_round(metrics: Path) -> list[float]:
    walls = [json.loads(line)["wall_time"] for line in metrics.read_text().splitlines() if line.strip()]
    return [b - a for a, b in itertools.pairwise(walls)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--messages-only", action="store_true", help="only the ClientApp message costs")
    args = parser.parse_args()
    cfg = resolve_config(
        {
            "data": {"dataset": "digits", "num_clients": args.clients},
            "model": {"name": "logreg"},
            "algorithm": {"name": "scaffold", "local_steps": 2},
            "run": {"rounds": args.rounds, "seed": 0, "threads": 1},
            "output": {"plots": False},
        }
    )
    with tempfile.TemporaryDirectory(prefix="fedrisk-bench-") as tmp:
        root = Path(tmp)
        if not args.messages_only:
            deployment(cfg, root, args)
        config = root / "experiment.toml"
        config.write_text(cfg.to_toml())
        for i in range(args.messages):
            out = subprocess.run(
                [sys.executable, "-c", MESSAGE, str(config), str(root / f"state-{i}")],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            imports, build, client, store = (float(v) for v in out.stdout.split("TIMES")[1].split())
            print(
                f"ClientApp message {i}: interpreter + imports {imports:.2f} s, build {build:.2f} s, "
                f"client round {client:.3f} s, state store {store:.3f} s"
            )


def deployment(cfg: Any, root: Path, args: argparse.Namespace) -> None:
    """The sequential run and the deployed run of ``cfg``, with Flower's accounting."""
    run_experiment(cfg, root / "sequential", progress="none")
    seq = per_round(root / "sequential" / "metrics.jsonl")
    print(f"sequential: {sum(seq) / len(seq):.3f} s/round (rounds 2..{args.rounds}: {[round(s, 3) for s in seq]})")

    with LocalFederation(args.clients, root / "fed") as fed:
        start = time.monotonic()
        run = run_deployed(cfg, fed.superlink, root / "deployed", wait=3600)
        total = time.monotonic() - start
        env = flwr_home(root / "home", fed.superlink)
        ls = subprocess.run(
            [str(Path(sys.executable).with_name("flwr")), "ls", "fedrisk", "--run-id", str(run.run_id),
             "--format", "json"], env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    dep = per_round(root / "deployed" / "metrics.jsonl")
    print(f"deployed:   {sum(dep) / len(dep):.3f} s/round (rounds 2..{args.rounds}: {[round(s, 2) for s in dep]})")
    print(f"deployed:   {total:.1f} s from `flwr run` to the final status (SuperLink and nodes already up)")
    try:
        info = json.loads(ls.stdout[ls.stdout.find("{") :])["runs"][0]
        print(f"flwr ls:    compute-time {info['compute-time']}, traffic {info['network-traffic']}")
    except (ValueError, KeyError, IndexError):
        print("flwr ls:    (no answer)", ls.stderr[-300:])


if __name__ == "__main__":
    main()
