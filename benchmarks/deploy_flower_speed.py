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
  per message): interpreter + imports (torch, flwr, fedrisk), the node's setup
  (``fedrisk.deploy.node.node_setup``: built from the dataset by the first message, as the
  handshake does, then loaded from the node's store by the ``--messages`` that follow), the
  client's round itself and the state store.
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
from fedrisk.algorithms.base import RoundContext
from fedrisk.deploy.records import Meta, encode
from fedrisk.deploy.handshake import fingerprint
from fedrisk.deploy.client import client_round
from fedrisk.deploy.node import node_setup
from fedrisk.deploy.state import ClientStateStore
from fedrisk.rng import server_generator
t1 = time.perf_counter()
cfg = load_config(sys.argv[1])
torch.set_num_threads(1)
setup = node_setup(cfg, 0, sys.argv[2])
t2 = time.perf_counter()
alg = setup.algorithm
server = alg.init_server(RoundContext(0, setup.info, "init"), alg.init_params(torch.Generator()), torch.Generator())
plan = alg.configure(RoundContext(0, setup.info), server, server_generator(0, 0, "configure"))
content = encode(plan.payload(0), Meta(0, 0, 0, plan.kind, fingerprint(cfg.semantic())))
t3 = time.perf_counter()
client_round(alg, setup.info, content, setup.initial_state, setup.data)
t4 = time.perf_counter()
store = ClientStateStore(sys.argv[2])
kept = store.load("bench", 0)
store.save("bench", 0, 0, setup.initial_state if kept is None else kept[1])
t5 = time.perf_counter()
print("TIMES", t1 - t0, t2 - t1, t4 - t3, t5 - t4, int(setup.built))
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
        for i in range(args.messages + 1):  # the first builds the node's setup (the handshake), the others load it
            out = subprocess.run(
                [sys.executable, "-c", MESSAGE, str(config), str(root / "node-store")],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            imports, setup, client, store, built = (float(v) for v in out.stdout.split("TIMES")[1].split())
            print(
                f"ClientApp message {i}: interpreter + imports {imports:.2f} s, "
                f"setup {'built' if built else 'loaded'} {setup:.2f} s, client round {client:.3f} s, "
                f"state store {store:.3f} s"
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
