"""The papers' networks (ResNet-18, ResNet-20 with BatchNorm, DenseNet-121's blocks) train under
CODASCA, FeDXL2 and FedAvg with the sequential and vectorised executors giving the same numbers
(tiny widths and 8x8 inputs so that each case runs in about a second)."""

from __future__ import annotations

import pytest
import torch

from fedrisk.algorithms.codasca import CODASCA
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.fedxl import FeDXL2
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.simulation import Simulation

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


NETS = {
    "resnet18": ({"widths": [4, 4, 8, 8]}, (1, 8, 8)),
    "resnet20": ({"norm": "batch"}, (3, 8, 8)),
    "densenet121": ({"growth_rate": 4, "block_config": [2, 1], "num_init_features": 8, "bn_size": 2}, (1, 8, 8)),
}


def federation(shape: tuple[int, ...]) -> Federation:
    g = torch.Generator().manual_seed(0)
    clients = [Samples(torch.randn(9 + k, *shape, generator=g) + k, torch.arange(9 + k) % 2) for k in range(3)]
    return Federation("img", clients, 2, test=Samples(torch.randn(6, *shape, generator=g), torch.arange(6) % 2))


def algorithm(family: str, name: str) -> tuple[object, int]:
    options, shape = NETS[name]
    outputs = 2 if family == "fedavg" else 1
    act = "sigmoid" if family == "codasca" else None
    model = FunctionalModel(build_model(name, shape, outputs, output_activation=act, **options))
    if family == "fedavg":
        return FedAvg(model=model, loss=cross_entropy, lr=0.1, local_steps=2, batch_size=4), 1
    if family == "codasca":
        return CODASCA(model=model, lr=0.1, window=2, batch_size=4), 1
    return FeDXL2(model=model, lr=0.1, local_steps=2, batch_pos=2, batch_neg=2), 2  # round 0 bootstraps the pools


@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.parametrize("family", ["fedavg", "codasca", "fedxl2"])
def test_one_round_vectorized_equals_sequential(family: str, name: str) -> None:
    fed = federation(NETS[name][1])
    states = {}
    for executor in ("sequential", "vectorized"):
        alg, rounds = algorithm(family, name)
        sim = Simulation(alg, fed, seed=1, executor=executor, dtype=F64)
        start = torch.utils._pytree.tree_leaves(sim.server_state)
        for _ in range(rounds):
            sim.step()
        states[executor] = torch.utils._pytree.tree_leaves((sim.server_state, dict(sim.client_states)))
    a, b = states["sequential"], states["vectorized"]
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-9, atol=1e-11)
    assert any(not torch.equal(x, y) for x, y in zip(start, a))  # the round moved the model
    stats = sim.server_state["norm_stats"]
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in stats.items() if k.endswith("running_mean"))


def test_resnet18_layout_and_sizes() -> None:
    """torchvision's names and counts: 11,173,962 parameters for the CIFAR stem and 10 classes
    (kuangliu's / LibAUC's ResNet-18), 11,689,512 for the ImageNet stem and 1000 classes
    (torchvision's resnet18); DenseNet-121: 7,978,856 (torchvision's densenet121)."""
    cifar = build_model("resnet18", (3, 32, 32), 10)
    imagenet = build_model("resnet18", (3, 224, 224), 1000, stem="imagenet")
    dense = build_model("densenet121", (3, 224, 224), 1000, stem="imagenet")
    assert sum(p.numel() for p in cifar.parameters()) == 11_173_962
    assert sum(p.numel() for p in imagenet.parameters()) == 11_689_512
    assert sum(p.numel() for p in dense.parameters()) == 7_978_856
    keys = set(imagenet.state_dict())
    for k in ("conv1.weight", "bn1.running_var", "layer2.0.downsample.1.weight", "layer4.1.bn2.bias", "fc.weight"):
        assert k in keys
    assert "features.denseblock4.denselayer16.conv2.weight" in dense.state_dict()
    assert "features.transition3.norm.running_mean" in dense.state_dict()
    small = build_model("resnet18", (1, 28, 28), 1)
    assert small(torch.zeros(2, 1, 28, 28)).shape == (2, 1)
    assert small(torch.zeros(2, 784)).shape == (2, 1)  # flattened rows are reshaped
