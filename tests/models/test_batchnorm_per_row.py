"""A BatchNorm network under a per-row ``vmap`` (issue 30 item 3).

One row has no batch statistics: a training-mode forward pass inside a ``vmap`` opened within
the training scope (per-sample gradients; ``full_batch_objective``'s rows under the vectorised
executor) is refused with the layer's name, while eval-mode and frozen statistics (row-wise
by construction) give the batched forward's numbers, and the vectorised executor's ``vmap``
over clients around the scope keeps working.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedrisk.algorithms.frpg import FRPG
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.simulation import Simulation


def bn_model(policy: str | None = None) -> FunctionalModel:
    torch.manual_seed(0)
    return FunctionalModel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)),
                           norm_stats=policy)  # fmt: skip


def test_a_training_forward_under_a_per_row_vmap_names_the_layer() -> None:
    fm = bn_model()
    params, x = fm.init_params(0), torch.randn(5, 3)
    message = r"BatchNorm layer '1' is in training mode under a per-row vmap"
    with fm.norm_scope(fm.init_stats(), train=True), pytest.raises(FedriskError, match=message):
        torch.func.vmap(lambda r: fm.apply(params, r[None]))(x)
    # BatchNorm2d on one image would otherwise normalise silently by that image's own statistics
    conv = FunctionalModel(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.Flatten()))
    params, x = conv.init_params(0), torch.randn(4, 1, 3, 3)
    with conv.norm_scope(conv.init_stats(), train=True), pytest.raises(FedriskError, match=message):
        torch.func.vmap(lambda r: conv.apply(params, r[None]))(x)
    fm = bn_model()
    params, x = fm.init_params(0), torch.randn(5, 3)
    with fm.norm_scope(fm.init_stats(), train=True):
        per_sample = torch.func.vmap(torch.func.grad(lambda p, r: fm.apply(p, r[None]).sum()), in_dims=(None, 0))
        with pytest.raises(FedriskError, match="one row has no batch statistics"):
            per_sample(params, x)


def test_eval_and_frozen_statistics_are_row_wise_under_a_per_row_vmap() -> None:
    fm = bn_model()
    params, x = fm.init_params(0), torch.randn(5, 3)
    stats = {k: v + 0.3 for k, v in fm.init_stats().items()}
    for train, update in ((False, True), (True, False)):
        with fm.norm_scope(stats, train=train, update=update):
            rows = torch.func.vmap(lambda r: fm.apply(params, r[None])[0])(x)
            torch.testing.assert_close(rows, fm.apply(params, x))


def test_a_client_level_vmap_around_the_training_scope_still_uses_batch_statistics() -> None:
    fm = bn_model()
    params, x = fm.init_params(0), torch.randn(2, 6, 3)
    stats = fm.init_stats()

    def client(p, xb):
        with fm.norm_scope(stats, train=True):
            return fm.apply(p, xb)

    stacked = {k: torch.stack([v, v]) for k, v in params.items()}
    out = torch.func.vmap(client)(stacked, x)
    with fm.norm_scope(stats, train=True):
        torch.testing.assert_close(out[1], fm.apply(params, x[1]))


def test_frpg_full_batch_on_a_batchnorm_model_stops_in_one_line_under_the_vectorised_executor() -> None:
    g = torch.Generator().manual_seed(1)
    clients = [Samples(torch.randn(6, 3, generator=g), torch.arange(6) % 2) for _ in range(3)]
    fed = Federation("rows", clients, 2, test=clients[0])
    alg = FRPG(model=bn_model(), loss=cross_entropy, full_batch=True)
    sim = Simulation(alg, fed, seed=0, executor="vectorized")
    with pytest.raises(FedriskError, match=r"BatchNorm layer '1' is in training mode under a per-row vmap") as e:
        sim.step()
    assert "\n" not in str(e.value)
