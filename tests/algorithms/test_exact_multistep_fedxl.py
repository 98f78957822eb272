"""Exact multi-round check of FeDXL2 on the KL-DRO pAUC objective (issue 29 item 2).

Guo et al. 2023, Alg. 2 with ``f = λ log`` and ``ℓ_in = exp(L/λ)`` (eq. (17)), squared hinge ``L``
(margin 0.8): the bootstrap round and two training rounds of three clients with unequal class
counts, K = 2 local steps, ``λ, γ, β ∉ {1}``, against a plain loop written from the algorithm box.  Per step
the loop takes the passive ``h̃2`` (negatives) and ``(h̃1, ũ)`` (positives with *their* stored u)
from the previous round's merged pools, updates ``u(z1)`` *before* the gradient (eq. (11)), so
G1 is weighted by ``λ / u_new``, while G2 is weighted by the passive ``λ / ũ``; then
``G ← (1 − β) G + β (G1 + G2)``, ``w ← w − η_t G`` (``η_t = η · 0.5^t`` at training round t);
the client uploads its scores and the *updated* ``u`` of its positives, and the server averages
``w, G`` and concatenates the pools in client order.  The random numbers are the algorithm's own
draws (``alg.draw`` with the simulation's generators); the shuffle, the row choice and the
arithmetic are the loop's.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedrisk.algorithms.base import FedInfo, RoundContext
from fedrisk.algorithms.fedxl import FeDXL2
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation

F64 = torch.float64
D, SEED = 3, 5
K, B1, B2, LR, LAM, GAMMA, BETA, U0 = 2, 2, 3, 0.5, 0.7, 0.3, 0.4, 1.3
MARGIN = 0.8  # the squared hinge's margin m (not the default 1)
DECAY = 0.5  # the step ×0.5 every training round (decay_rounds = 1; the bootstrap round does not count)


def federation() -> Federation:
    """Three clients, positives and negatives interleaved, 2 / 3 / 1 positives."""
    g = torch.Generator().manual_seed(3)
    labels = ([0, 1, 0, 1, 0], [1, 0, 1, 1, 0, 0], [0, 0, 1, 0, 0])
    clients = []
    for k, ys in enumerate(labels):
        y = torch.tensor(ys)
        clients.append(Samples(torch.randn(len(ys), D, generator=g, dtype=F64) + 0.8 * y[:, None] + 0.2 * k, y))
    return Federation("small", clients, 2)


def hinge(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.clamp(MARGIN - (a - b), min=0.0) ** 2


def test_fedxl2_pauc_two_rounds_match_alg_2() -> None:
    fed = federation()
    counts = tuple((int((c.y == 0).sum()), int((c.y == 1).sum())) for c in fed.clients)
    info = FedInfo(len(fed.clients), tuple(fed.client_sizes), 2, counts)
    alg = FeDXL2(
        model=FunctionalModel(build_model("logreg", (D,), 1)), xrisk="pauc", lam=LAM, gamma=GAMMA, beta=BETA,
        lr=LR, local_steps=K, batch_pos=B1, batch_neg=B2, u_init=U0, lr_decay=DECAY, decay_rounds=1,
        margin=MARGIN,
    )  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w = sim.server_state["params"]["linear.weight"][0].clone()
    bias = sim.server_state["params"]["linear.bias"].clone()
    Gw, Gb = torch.zeros(D, dtype=F64), torch.zeros(1, dtype=F64)
    pos = [torch.nonzero(c.y == 1).flatten() for c in fed.clients]  # a positive's u row = its rank
    neg = [torch.nonzero(c.y == 0).flatten() for c in fed.clients]
    u = [torch.full((len(p),), U0, dtype=F64) for p in pos]

    def score(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x @ w + bias)

    def rows(units: torch.Tensor, count: int) -> list[int]:
        return [min(math.floor(float(x) * count), count - 1) for x in units]

    def draws(r: int, k: int) -> dict[str, torch.Tensor]:
        return alg.draw(RoundContext(r, info), k, fed.client_sizes[k], client_generator(SEED, round=r, client=k))

    # round 0: every client scores K·B1 positives / K·B2 negatives with w0 and uploads u0 of those rows
    sim.step()
    h1, h2, U = [], [], []
    for k, c in enumerate(fed.clients):
        d = draws(0, k)
        rp = [rows(d["pos"][s], len(pos[k])) for s in range(K)]
        rn = [rows(d["neg"][s], len(neg[k])) for s in range(K)]
        h1 += [score(c.x[pos[k][i]], w, bias) for s in range(K) for i in rp[s]]
        h2 += [score(c.x[neg[k][i]], w, bias) for s in range(K) for i in rn[s]]
        U += [u[k][i] for s in range(K) for i in rp[s]]
    pool_pos, pool_neg, pool_u = torch.stack(h1).flatten(), torch.stack(h2).flatten(), torch.stack(U)
    torch.testing.assert_close(sim.server_state["pool_pos"], pool_pos, rtol=0, atol=1e-14)
    torch.testing.assert_close(sim.server_state["pool_u"], pool_u, rtol=0, atol=0)

    for r in (1, 2):
        report = sim.step()
        ws, bs, Gws, Gbs, h1, h2, U, losses = [], [], [], [], [], [], [], []
        for k, c in enumerate(fed.clients):
            d = draws(r, k)
            # the buffers: the merged pools shuffled (h̃1 and ũ with the same permutation), taken in order
            take_p = sorted(range(len(pool_pos)), key=lambda i: float(d["keys_pos"][i]))[: K * B1]
            take_n = sorted(range(len(pool_neg)), key=lambda i: float(d["keys_neg"][i]))[: K * B2]
            wk, bk, Gwk, Gbk = w.clone(), bias.clone(), Gw.clone(), Gb.clone()
            for s in range(K):
                rp, rn = rows(d["pos"][s], len(pos[k])), rows(d["neg"][s], len(neg[k]))
                h2_t = pool_neg[take_n[s * B2 : (s + 1) * B2]]
                h1_t = pool_pos[take_p[s * B1 : (s + 1) * B1]]
                u_t = pool_u[take_p[s * B1 : (s + 1) * B1]]
                wv, bv = wk.clone().requires_grad_(), bk.clone().requires_grad_()
                a = score(c.x[pos[k][rp]], wv, bv)
                b = score(c.x[neg[k][rn]], wv, bv)
                inner_a = torch.exp(hinge(a[:, None], h2_t[None, :]) / LAM)  # [B1, B2]
                u_new = (1 - GAMMA) * u[k][rp] + GAMMA * inner_a.detach().mean(1)  # eq. (11), before G1
                losses.append(float((LAM * torch.log(inner_a.detach().mean(1))).mean()) / (K * len(fed.clients)))
                g1 = (LAM / u_new * inner_a.mean(1)).mean()
                g2 = (LAM / u_t[:, None] * torch.exp(hinge(h1_t[:, None], b[None, :]) / LAM)).mean()
                gw, gb = torch.autograd.grad(g1 + g2, (wv, bv))
                for i, row in enumerate(rp):
                    u[k][row] = u_new[i]
                Gwk, Gbk = (1 - BETA) * Gwk + BETA * gw, (1 - BETA) * Gbk + BETA * gb
                lr = LR * DECAY ** (r - 1)  # training round t = r − 1
                wk, bk = wk - lr * Gwk, bk - lr * Gbk
                h1 += list(a.detach())
                h2 += list(b.detach())
                U += list(u_new)
            ws.append(wk)
            bs.append(bk)
            Gws.append(Gwk)
            Gbs.append(Gbk)
            torch.testing.assert_close(sim.client_states[k]["u"][: len(pos[k])], u[k], rtol=0, atol=1e-13)
        w, bias = torch.stack(ws).mean(0), torch.stack(bs).mean(0)
        Gw, Gb = torch.stack(Gws).mean(0), torch.stack(Gbs).mean(0)
        pool_pos, pool_neg, pool_u = torch.stack(h1), torch.stack(h2), torch.stack(U)
        state = sim.server_state
        torch.testing.assert_close(state["params"]["linear.weight"][0], w, rtol=0, atol=1e-13)
        torch.testing.assert_close(state["params"]["linear.bias"], bias, rtol=0, atol=1e-13)
        torch.testing.assert_close(state["momentum"]["linear.weight"][0], Gw, rtol=0, atol=1e-13)
        torch.testing.assert_close(state["momentum"]["linear.bias"], Gb, rtol=0, atol=1e-13)
        torch.testing.assert_close(state["pool_pos"], pool_pos, rtol=0, atol=1e-13)
        torch.testing.assert_close(state["pool_neg"], pool_neg, rtol=0, atol=1e-13)
        torch.testing.assert_close(state["pool_u"], pool_u, rtol=0, atol=1e-13)
        assert report.train_metrics["loss"] == pytest.approx(sum(losses), rel=1e-12)  # f(ĝ) = λ log ĝ, averaged
    assert float((pool_u - U0).abs().min()) > 1e-4  # every uploaded u moved away from u0
