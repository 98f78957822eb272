"""Unit checks of the Local SGDA family's pieces that the exact multi-step tests do not reach:
the game metrics of the server iterate, against formulas written out here (pinned by the
``sgda`` mutation scope, docs/reliability.md)."""

from __future__ import annotations

import math

import pytest
import torch

from fedrisk.algorithms.fessgda import FESSGDA
from fedrisk.algorithms.sgda import FSGDA, LocalSGDA, quadratic_matrix
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model

F64 = torch.float64


def affine() -> FunctionalModel:
    return FunctionalModel(build_model("affine_generator", (1,), 1))


def wgan_state(mu: float, sigma: float) -> dict:
    return {"x": {"mu": torch.tensor(mu, dtype=F64), "sigma": torch.tensor(sigma, dtype=F64)}, "y": torch.zeros(2)}


def wgan_fed(notes: dict | None) -> Federation:
    z = torch.zeros(4, 1, dtype=F64)
    info = {} if notes is None else {"dataset_meta": {"notes": notes}}
    return Federation("wgan", [Samples(z, z[:, 0])], 1, info=info)


def test_generator_error_is_the_squared_distance_to_the_targets_of_the_data() -> None:
    alg = FESSGDA(model=affine(), game="wgan")
    fed = wgan_fed({"target_mu": 0.4, "target_sigma": 0.25})
    got = alg.state_metrics(wgan_state(1.5, -0.5), fed)
    assert got == {"generator_error": pytest.approx((1.5 - 0.4) ** 2 + (-0.5 - 0.25) ** 2, rel=1e-12)}
    # without notes: the wgan_1d defaults, mu_hat = 0 and sigma_hat = 0.1
    got = alg.state_metrics(wgan_state(1.5, -0.5), wgan_fed(None))
    assert got["generator_error"] == pytest.approx(1.5**2 + 0.6**2, rel=1e-12)


def test_grad_phi_norm_averages_the_clients_means_not_the_pooled_rows() -> None:
    """eq. (1): b = (1/M) Σ_i mean(rows_i), so a client with more rows weighs the same."""
    d1, d2, c, mu = 3, 2, 1.3, 0.7
    rows = [torch.tensor([[1.0, 2.0]], dtype=F64), torch.tensor([[3.0, -1.0], [5.0, 0.0], [-2.0, 4.0]], dtype=F64)]
    fed = Federation("quad", [Samples(r, torch.zeros(len(r), dtype=torch.long)) for r in rows], 1)
    model = FunctionalModel(build_model("vector", (d2,), d1, init=0.0))
    alg = FSGDA(model=model, game="quadratic", dual_dim=d2, quadratic_curvature=c, quadratic_mu=mu, quadratic_seed=3)
    x = torch.tensor([0.3, -1.1, 2.0], dtype=F64)
    got = alg.state_metrics({"x": {"x": x}, "y": torch.zeros(d2, dtype=F64)}, fed)
    a = quadratic_matrix(3, d2, d1, F64)
    b = (rows[0].mean(0) + rows[1].mean(0)) / 2
    grad = [-c * math.sin(float(x[k])) + sum(float(a[j, k]) * float(a[j] @ x + b[j]) / mu for j in range(d2))
            for k in range(d1)]  # fmt: skip
    assert got == {"grad_phi_norm": pytest.approx(math.sqrt(sum(g * g for g in grad)), rel=1e-12)}


def test_fair_games_report_the_largest_dual_weight() -> None:
    x = torch.zeros(4, 1, dtype=F64)
    fed = Federation("f", [Samples(x, torch.tensor([0, 1, 0, 1]))], 2)
    alg = LocalSGDA(model=FunctionalModel(build_model("logreg", (1,), 2)))
    state = {"x": alg.model.init_params(dtype=F64), "y": torch.tensor([0.2, 0.8], dtype=F64)}
    assert alg.state_metrics(state, fed) == {"dual_max": pytest.approx(0.8)}
