"""One benchmark workload on Flower's simulation (run by ``simulation_speed.py``).

Runs with the interpreter of ``.venv-bench`` (Flower is not a fedrisk dependency; this file
imports neither fedrisk nor scikit-learn)::

    .venv-bench/bin/python benchmarks/flower_workload.py WORKLOAD.pt

``WORKLOAD.pt`` is written by ``simulation_speed.export_workload``: the clients' data, the test
set, the initial parameters and every (round, client)'s minibatch indices, so that Flower
trains exactly the model fedrisk trains.  The Flower side is written the way Flower's own
PyTorch quick-start writes it, with its fastest reasonable choices:

* ``flwr.simulation.run_simulation`` in-process (a ``ServerApp`` thread, Ray actors running the
  ``ClientApp``), ``num_cpus=1`` per client so that a 2-core machine gets 2 actors (Flower's
  default of 2 CPUs per client leaves one actor and starves the driver);
* the stock ``FedAvg`` strategy of the Message API (``fraction_train=1``, no federated
  evaluation, weights ``num-examples``);
* the ``ClientApp`` keeps one model per actor process, copies the received weights into it in
  place and runs the local steps like the hand-written loop (``torch.autograd.grad`` and
  in-place SGD), one torch thread per actor.

Seconds per round are measured inside the strategy: from the start of ``configure_train`` to
the end of ``aggregate_train`` (sending, every client's training, receiving, aggregating).
The final global model is evaluated on the test set.  Prints ``RESULT {json}`` (times,
accuracy, the driver's ``VmHWM``) on its last line.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _mlp import mlp  # this script's folder (also on the Ray actors' PYTHONPATH, see main)
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from torch import nn

WORKFILE_ENV = "FEDRISK_FLOWER_WORKLOAD"
_CACHE: dict[str, Any] = {}


def load_workload() -> dict[str, Any]:
    """The workload file named by ``$FEDRISK_FLOWER_WORKLOAD``, loaded once per process."""
    if "data" not in _CACHE:
        _CACHE["data"] = torch.load(os.environ[WORKFILE_ENV], weights_only=True)
    return _CACHE["data"]


# -- ClientApp -----------------------------------------------------------------------------------
client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """E local SGD steps on this client's minibatches of this round, from the received model."""
    data = load_workload()
    wl = data["workload"]
    if "model" not in _CACHE:
        torch.set_num_threads(1)
        _CACHE["model"] = mlp(wl["hidden"])
    model: nn.Sequential = _CACHE["model"]
    params = list(model.parameters())
    client = int(context.node_config["partition-id"])
    round_ = int(msg.content["config"]["server-round"]) - 1  # Flower counts rounds from 1
    received = msg.content["arrays"].to_torch_state_dict()
    with torch.no_grad():
        for p, v in zip(params, received.values()):
            p.copy_(v)
    x, y = data["clients_x"][client], data["clients_y"][client]
    idx = data["indices"][round_, client]
    lr = float(msg.content["config"]["lr"])
    for step in range(idx.shape[0]):
        loss = nn.functional.cross_entropy(model(x[idx[step]]), y[idx[step]])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-lr)
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"train_loss": float(loss), "num-examples": len(x)}),
        }
    )
    return Message(content=content, reply_to=msg)


# -- ServerApp -----------------------------------------------------------------------------------
class TimedFedAvg(FedAvg):
    """Flower's FedAvg, recording when each round's training starts and ends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: list[float] = []
        self.ends: list[float] = []

    def configure_train(self, server_round, arrays, config, grid):  # type: ignore[no-untyped-def]
        self.starts.append(time.perf_counter())
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
        out = super().aggregate_train(server_round, replies)
        self.ends.append(time.perf_counter())
        return out


server_app = ServerApp()


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    data = load_workload()
    wl = data["workload"]
    clients = len(data["clients_x"])
    model = mlp(wl["hidden"])
    with torch.no_grad():
        for p, v in zip(model.parameters(), data["init"]):
            p.copy_(v)
    strategy = TimedFedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients, min_available_nodes=clients
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(wl["rounds"]),
        train_config=ConfigRecord({"lr": float(wl["lr"])}),
    )
    model.load_state_dict(result.arrays.to_torch_state_dict())
    with torch.no_grad():
        acc = float((model(data["test_x"]).argmax(1) == data["test_y"]).double().mean())
    _CACHE["result"] = {"times": [e - s for s, e in zip(strategy.starts, strategy.ends)], "accuracy": acc}


def vm_hwm_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    # Ray pickles the ClientApp with every message it sends to an actor: the apps must come
    # from an importable module (pickled by reference), not from ``__main__`` (pickled by value
    # together with the globals they use, e.g. the loaded data).
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ[WORKFILE_ENV] = str(Path(sys.argv[1]).resolve())  # both inherited by the Ray actors
    import flower_workload as fw

    torch.set_num_threads(1)
    data = fw.load_workload()
    logging.getLogger("flwr").setLevel(logging.WARNING)  # no per-round log lines
    start = time.perf_counter()
    run_simulation(
        server_app=fw.server_app,
        client_app=fw.client_app,
        num_supernodes=len(data["clients_x"]),
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    total = time.perf_counter() - start
    if "result" not in fw._CACHE:
        raise SystemExit("the Flower ServerApp did not finish (see the log above)")
    import flwr

    result = {**fw._CACHE["result"], "vm_hwm_mb": [vm_hwm_mb()], "total_s": total, "flwr": flwr.__version__}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
