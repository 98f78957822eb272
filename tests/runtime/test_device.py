"""Device placement: ``Simulation(..., device=...)``, ``run.device`` and what they refuse.

CUDA itself is checked by ``benchmarks/cuda_check.py`` on a GPU machine; here the choice of
device (with ``torch.cuda`` faked where a GPU would be needed), the CPU behaviour (unchanged,
bit for bit) and the moves of placement-only code on PyTorch's ``meta`` device.
"""

from __future__ import annotations

import pytest
import torch

from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import build_simulation
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.client_store import DiskClientStates
from fedrisk.runtime.device import check_device_spec, resolve_device, to_device
from fedrisk.runtime.simulation import Simulation

META = torch.device("meta")


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_cpu_and_auto_without_cuda_give_the_cpu(monkeypatch):
    fake_cuda(monkeypatch, 0)
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_cuda_without_cuda_is_one_line_naming_the_key(monkeypatch):
    fake_cuda(monkeypatch, 0)
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(FedriskError) as err:
            resolve_device(spec, "run.device")
        message = str(err.value)
        assert message.startswith(f"run.device = {spec!r} needs a CUDA GPU") and "\n" not in message
        assert "allowed here: 'cpu' or 'auto'" in message


def test_cuda_choices_with_fake_gpus(monkeypatch):
    fake_cuda(monkeypatch, 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "3")  # torchrun's rank on this node: its GPU (modulo the count)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    with pytest.raises(
        FedriskError, match=r"run.device = 'cuda:2': there are 2 CUDA device\(s\); allowed: 'cuda:0' .. 'cuda:1'"
    ):
        resolve_device("cuda:2", "run.device")


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:x", "mps", ""])
def test_misspelt_devices_are_refused(spec):
    assert check_device_spec(spec, "run.device") == (
        f"run.device = {spec!r} is not a device; allowed: 'cpu', 'auto' (CUDA when available), 'cuda' or 'cuda:N'"
    )
    with pytest.raises(FedriskError, match="is not a device"):
        resolve_device(spec)


TINY = {
    "data": {"dataset": "wine", "num_clients": 3},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 2, "batch_size": 8},
    "run": {"rounds": 2, "threads": 1},
}


def test_run_device_key_default_and_validation():
    assert resolve_config(TINY)["run.device"] == "cpu"
    assert resolve_config(TINY, ["run.device='cuda:1'"])["run.device"] == "cuda:1"
    with pytest.raises(FedriskError, match=r"run.device = 'gpu' is not a device; allowed: 'cpu', 'auto'"):
        resolve_config(TINY, ["run.device='gpu'"])
    # the device does not change a run's identity (sweeps and resumes across devices)
    assert "run.device" not in resolve_config(TINY, ["run.device='auto'"]).semantic()


def test_run_device_cuda_without_cuda_stops_the_build(monkeypatch):
    fake_cuda(monkeypatch, 0)
    with pytest.raises(FedriskError, match=r"^run.device = 'cuda' needs a CUDA GPU"):
        build_simulation(resolve_config(TINY, ["run.device='cuda'"]))
    assert build_simulation(resolve_config(TINY, ["run.device='auto'"])).simulation.device == torch.device("cpu")


def toy(num_clients: int = 3) -> tuple[FedAvg, Federation]:
    g = torch.Generator().manual_seed(0)
    s = Samples(torch.randn(60, 4, generator=g), torch.randint(0, 3, (60,), generator=g))
    fed = Federation("toy", [s.subset(range(20 * k, 20 * k + 20)) for k in range(num_clients)], num_classes=3)
    model = FunctionalModel(build_model("mlp", (4,), 3, hidden=(5,)))
    return FedAvg(model=model, loss=cross_entropy, lr=0.1, local_steps=3, batch_size=5), fed


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_device_cpu_is_bit_identical_to_no_device(executor):
    alg, fed = toy()
    runs = [Simulation(alg, fed, seed=4, executor=executor, device=d) for d in (None, "cpu", torch.device("cpu"))]
    for sim in runs:
        for _ in range(3):
            sim.step()
    ref = runs[0].server_state["params"]
    for sim in runs[1:]:
        assert sim.device == torch.device("cpu")
        assert all(torch.equal(sim.server_state["params"][k], v) for k, v in ref.items())


def test_to_device_moves_every_tensor_and_keeps_the_rest():
    tree = {"idx": torch.arange(3), "noise": (torch.zeros(2), [torch.ones(1)]), "n": 2, "name": "x"}
    moved = to_device(tree, META)
    assert moved["idx"].device == META and moved["noise"][0].device == META and moved["noise"][1][0].device == META
    assert moved["n"] == 2 and moved["name"] == "x" and isinstance(moved["noise"], tuple)
    assert to_device(moved, META) is moved  # nothing to move: the same object
    assert to_device(tree, None) is tree


def test_disk_states_are_read_onto_the_store_device(tmp_path):
    store = DiskClientStates(tmp_path, 2, initial=lambda k: {"c": torch.zeros(2)}, device=META)
    store[1] = {"c": torch.ones(2)}
    assert store[1]["c"].device == META  # a resumed CUDA run reads its states back onto its GPU
    assert DiskClientStates(tmp_path / "cpu", 1, initial=lambda k: {}).device == torch.device("cpu")


def test_functional_model_copies_its_constant_buffers_to_the_input_device():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2))
    module.register_buffer("scale", torch.full((2,), 3.0))
    fm = FunctionalModel(module)
    on_meta = fm._buffers_on(META)
    assert on_meta["scale"].device == META and fm._buffers_on(META) is on_meta  # copied once
    assert fm._buffers_on(torch.device("cpu")) is fm._buffers
    out = fm.apply({k: v.to(META) for k, v in fm.init_params(0).items()}, torch.zeros(4, 2, device=META))
    assert out.device == META and out.shape == (4, 2)


def test_run_federation_passes_the_device_on(monkeypatch):
    from fedrisk.api import run_federation

    alg, fed = toy()
    seen = []
    original = Simulation.__init__

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("device"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(Simulation, "__init__", spy)
    run_federation(fed, alg, rounds=1, progress=False, metrics=[], splits=[], device="cpu")
    assert seen == ["cpu"]
    fake_cuda(monkeypatch, 0)
    with pytest.raises(FedriskError, match=r"^device = 'cuda' needs a CUDA GPU"):
        run_federation(fed, alg, rounds=1, progress=False, metrics=[], splits=[], device="cuda")


def test_fedrisk_run_with_cuda_without_cuda_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    import tomli_w

    from fedrisk.cli import main

    config = tmp_path / "tiny.toml"
    config.write_text(tomli_w.dumps(TINY))
    fake_cuda(monkeypatch, 0)
    code = main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet", "--set", "run.device=cuda"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: run.device = 'cuda' needs a CUDA GPU") and err.count("\n") == 1
    code = main(["run", str(config), "--out", str(tmp_path / "auto"), "--quiet", "--set", "run.device=auto"])
    assert code == 0 and 'device = "auto"' in (tmp_path / "auto" / "config.toml").read_text()


def test_distributed_replies_go_to_the_payloads_device():
    from fedrisk.algorithms.base import RoundPlan
    from fedrisk.runtime.distributed import _home_device

    cpu = torch.device("cpu")
    on_meta = {"w": torch.zeros(2, device=META)}
    assert _home_device(RoundPlan([0, 1], broadcast=on_meta), cpu) == META
    # PERM's shuffle rounds broadcast nothing: each client's own payload says where the models are
    shuffle = RoundPlan([0, 1], per_client={0: on_meta, 1: on_meta})
    assert _home_device(shuffle, cpu) == META
    assert _home_device(RoundPlan([0, 1]), META) == META  # nothing sent: the data's device


def test_a_device_simulation_moves_what_each_step_makes(monkeypatch):
    """With a non-CPU device every tree a round makes on its way (the plan's payloads, the new
    server state, the new client states) goes through ``to_device``; checked on the CPU by
    pretending the simulation lives elsewhere and recording the calls."""
    import fedrisk.runtime.simulation as simulation

    alg, fed = toy()
    sim = Simulation(alg, fed, seed=1, device="cpu")
    moved: list[object] = []

    def spy(tree, device):
        moved.append(tree)
        return to_device(tree, device)

    monkeypatch.setattr(simulation, "to_device", spy)
    sim._move = True  # as for a CUDA device
    sim.step()
    broadcast, server, clients = moved  # in the order the round makes them
    assert set(broadcast) == {"params"} and set(server) == {"params", "opt"}
    assert set(clients) == {0, 1, 2}  # the round's new client states, by client
    state = {"round": 1, "seed": 1, "server_state": sim.server_state, "client_states": dict(sim.client_states)}
    state["ledger"] = sim.ledger.state_dict()
    moved.clear()
    sim.load_state_dict(state)  # a checkpoint (read on the CPU) goes to the device too
    assert len(moved) == 1 + 3


def test_the_sequential_executor_hands_the_draws_to_the_clients_on_their_data_device():
    """ClientRNG draws are made on the CPU; a client whose data live elsewhere (here: ``meta``)
    gets them there, a CPU client gets the very tensors that were drawn."""
    from dataclasses import dataclass

    from fedrisk.algorithms.base import Algorithm, ClientResult, LocalData, RoundContext, RoundPlan
    from fedrisk.algorithms.local import sample_batches
    from fedrisk.runtime.executor import SequentialExecutor

    seen = {}

    @dataclass(frozen=True)
    class Recorder(Algorithm):
        def draw(self, ctx, client, num_samples, rng):
            return {"batches": sample_batches(rng, num_samples, 2, 3)}

        def client_update(self, ctx, payload, state, data, draws):
            seen[int(data.size)] = draws["batches"].device
            return ClientResult({"n": torch.ones(1)}, {}, {})

    data = [LocalData(torch.zeros(5, 2), torch.zeros(5), torch.tensor(5), {})]
    data.append(LocalData(torch.zeros(6, 2, device=META), torch.zeros(6, device=META), torch.tensor(6), {}))
    ctx = RoundContext(0, None)  # type: ignore[arg-type]
    SequentialExecutor().run_round(Recorder(), ctx, RoundPlan([0, 1]), {0: {}, 1: {}}, data, seed=0)
    assert seen == {5: torch.device("cpu"), 6: META}
