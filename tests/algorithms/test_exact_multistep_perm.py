"""Exact checks of PERM's estimate rounds at non-trivial settings (issue 29 item 2).

* Single-loop PERM (Deng et al. 2023, Alg. 2) with ``global_batch = M``: the global step
  ``w ← w − γ (1/N) Σ_i g_i^M`` uses each client's M-row minibatch gradient, while the
  discrepancies ``D_ij = ||∇f_i(w) − ∇f_j(w)||²`` of eq. (2) still come from the full local
  gradients; the weights are eq. (2)'s minimiser, found here by bisection on the KKT threshold
  (``α_i(j) = n_j / (2λ) max(0, τ_i − D_ij)``, ``Σ_j α_i(j) = 1``).
* PERMHetero (Sec. 3.3, the mechanism of its docstring) with three unequal widths: every client
  uploads ``m_k ⊙ ∇f_k(m_k ⊙ w)`` and the global step divides each coordinate's sum by the number
  of clients holding it (3, 2 or 1 here), as HeteroFL does.

Two epochs each (estimate, N shuffle rounds, estimate), least squares, against plain loops; the
minibatch rows are the algorithm's own draws (``alg.draw`` with the simulation's generators).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedrisk.algorithms import PERM, PERMHetero
from fedrisk.algorithms.base import RoundContext
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import mean_squared_error
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation, fed_info

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64, D, Linear

SEED, N = 2, 3


def grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇ of ``mean((x w − y)²) / 2``."""
    return x.T @ (x @ w - y) / len(y)


def step_to(sim: Simulation, r: int) -> None:
    """Step to round ``r`` in a bounded loop (a mutant that stops the round counter fails here
    instead of looping until mutmut's timeout)."""
    for _ in range(r - int(sim.server_state["round"])):
        sim.step()
    assert int(sim.server_state["round"]) == r


def kkt_weights(Dm: torch.Tensor, sizes: list[int], lam: float) -> torch.Tensor:
    """Eq. (2) row by row: bisection on τ_i so that Σ_j n_j / (2λ) max(0, τ_i − D_ij) = 1."""
    n = torch.tensor(sizes, dtype=F64)
    rows = []
    for i in range(Dm.shape[0]):
        lo, hi = float(Dm[i].min()), float(Dm[i].min()) + 2 * lam / float(n.min()) + 1.0
        for _ in range(200):
            tau = (lo + hi) / 2
            lo, hi = (tau, hi) if float((n / (2 * lam) * (tau - Dm[i]).clamp(min=0)).sum()) < 1 else (lo, tau)
        rows.append(n / (2 * lam) * (tau - Dm[i]).clamp(min=0))
    return torch.stack(rows)


def test_perm_global_batch_steps_with_minibatches_and_weights_from_full_gradients() -> None:
    fed = _ls.least_squares((8, 10, 12), seed=3)
    info = fed_info(fed)
    gamma, lam, M = 0.3, 40.0, 3
    alg = PERM(model=Linear(), loss=mean_squared_error, lr=0.1, local_steps=2, batch_size=3, global_lr=gamma,
               global_batch=M, lam=lam)  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w = sim.server_state["w"]["w"].clone()
    for epoch, r in enumerate((0, N + 1)):  # the two estimate rounds; the shuffle rounds between leave w alone
        step_to(sim, r)
        assert sim.step().kind == "estimate"
        full = torch.stack([grad(w, c.x, c.y) for c in fed.clients])
        mini = []
        for k, c in enumerate(fed.clients):
            ctx = RoundContext(r, info, kind="estimate")
            idx = alg.draw(ctx, k, fed.client_sizes[k], client_generator(SEED, round=r, client=k))["global_idx"]
            assert idx.shape == (M,)
            mini.append(grad(w, c.x[idx], c.y[idx]))
        w = w - gamma * torch.stack(mini).mean(0)
        torch.testing.assert_close(sim.server_state["w"]["w"], w, rtol=0, atol=1e-13)
        if epoch == 0:  # alpha^0 is uniform and nothing is estimated
            assert bool((sim.server_state["alpha"] == 1 / N).all())
            assert int(sim.server_state["estimations"]) == 0
            continue
        Dm = ((full[:, None, :] - full[None, :, :]) ** 2).sum(-1)
        torch.testing.assert_close(sim.server_state["discrepancy"], Dm, rtol=1e-12, atol=1e-12)
        alpha = kkt_weights(Dm, list(fed.client_sizes), lam)
        torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
        assert float(alpha.min()) == 0.0 and 0.1 < float(alpha[0, 1]) < 0.9  # client 0 mixes 0 and 1, not 2
    assert int(sim.server_state["estimations"]) == 1


def test_perm_hetero_global_step_divides_each_coordinate_by_its_holders() -> None:
    fed = _ls.least_squares((8, 10, 12), seed=4)
    gamma, lam, widths = 0.2, 0.5, (1.0, 0.5, 0.25)  # 4, 2 and 1 of the 4 hidden units
    model = FunctionalModel(build_model("mlp", (D,), 1, hidden=[4]))
    alg = PERMHetero(model=model, loss=mean_squared_error, lr=0.1, local_steps=2, batch_size=4, global_lr=gamma,
                     lam=lam, widths=widths)  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    names = ("layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias")
    w = {k: sim.server_state["w"][k].clone() for k in names}
    units = [4, 2, 1]
    masks = []
    for u in units:  # hidden unit h is held by the clients with at least h + 1 units
        m0 = torch.zeros(4, D, dtype=F64)
        m0[:u] = 1.0
        b0 = (torch.arange(4) < u).to(F64)
        masks.append({"layers.0.weight": m0, "layers.0.bias": b0, "layers.2.weight": b0[None, :].clone(),
                      "layers.2.bias": torch.ones(1, dtype=F64)})  # fmt: skip
    holders = {"layers.0.weight": torch.tensor([3.0, 2.0, 1.0, 1.0], dtype=F64)[:, None].expand(4, D),
               "layers.0.bias": torch.tensor([3.0, 2.0, 1.0, 1.0], dtype=F64),
               "layers.2.weight": torch.tensor([[3.0, 2.0, 1.0, 1.0]], dtype=F64),
               "layers.2.bias": torch.tensor([3.0], dtype=F64)}  # fmt: skip

    def masked_grad(k: int) -> dict[str, torch.Tensor]:
        p = {n: (w[n] * masks[k][n]).requires_grad_() for n in names}
        x, y = fed.clients[k].x, fed.clients[k].y
        out = torch.relu(x @ p["layers.0.weight"].T + p["layers.0.bias"]) @ p["layers.2.weight"].T + p["layers.2.bias"]
        loss = 0.5 * ((out[:, 0] - y) ** 2).mean()
        return {n: g * masks[k][n] for n, g in zip(names, torch.autograd.grad(loss, [p[n] for n in names]))}

    for epoch, r in enumerate((0, N + 1)):
        step_to(sim, r)
        assert sim.step().kind == "estimate"
        grads = [masked_grad(k) for k in range(N)]
        w = {n: w[n] - gamma * sum(g[n] for g in grads) / holders[n] for n in names}
        for n in names:
            torch.testing.assert_close(sim.server_state["w"][n], w[n], rtol=0, atol=1e-13)
        if epoch == 1:
            flat = torch.stack([torch.cat([g[n].reshape(-1) for n in names]) for g in grads])
            Dm = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(-1)
            torch.testing.assert_close(sim.server_state["discrepancy"], Dm, rtol=1e-12, atol=1e-12)
            alpha = kkt_weights(Dm, list(fed.client_sizes), lam)
            torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
    # the narrow clients' gradients vanish outside their units, so the counts matter: unit 1 has 2 holders
    assert float(grads[1]["layers.0.bias"][1].abs()) > 1e-6 and float(grads[2]["layers.0.bias"][1]) == 0.0
