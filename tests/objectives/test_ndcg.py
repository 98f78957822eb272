"""NDCG (SONG) objective: LibAUC's NDCGLoss as the oracle, the exact risk, bad queries, a short
centralised training run on the generated ranking set."""

from __future__ import annotations

import importlib
import importlib.util
import math

import pytest
import torch

from fedrisk.data.sources.ranking import synthetic_ranking_data
from fedrisk.errors import FedriskError
from fedrisk.metrics.ranking import ndcg_at_k
from fedrisk.objectives.ndcg import check_queries, ideal_dcg, ndcg_risk, song_surrogate

F64 = torch.float64


@pytest.mark.parametrize("seed", [0, 1])
def test_song_step_equals_libauc(seed: int) -> None:
    """Value, gradient and u of one SONG minibatch equal LibAUC's NDCGLoss (topk = -1) to 1e-6."""
    if importlib.util.find_spec("libauc") is None:  # skipped only when the package is missing; CI installs it
        pytest.skip("libauc is not installed (pip install --no-deps libauc==2.0.1; see scripts/setup.sh)")
    losses = importlib.import_module("libauc.losses")
    g = torch.Generator().manual_seed(seed)
    Q, P, M, N = 4, 2, 5, 30
    lib = losses.NDCGLoss(N=100, num_user=10, num_item=N, num_pos=P, gamma0=0.3, margin=0.7, device="cpu")
    lib.u = lib.u.to(F64)
    pred0 = torch.rand(Q, P + M, generator=g, dtype=F64)
    ratings = torch.randint(1, 4, (Q, P + M), generator=g)
    ratings[:, P:] = 0
    item_ids = torch.arange(Q * (P + M)).reshape(Q, P + M)
    u0 = 0.5 * torch.rand(Q, P, generator=g, dtype=F64) + 0.1
    lib.u[item_ids[:, :P].reshape(-1)] = u0.reshape(-1)
    num_rel, ideal = torch.tensor([2.0, 3.0, 2.0, 5.0]), torch.rand(Q, generator=g, dtype=F64) + 1
    batch = {"rating": ratings, "user_id": torch.tensor([1, 3, 5, 7]), "num_pos_items": num_rel,
             "ideal_dcg": ideal, "user_item_id": item_ids}  # fmt: skip
    p = pred0.clone().requires_grad_()
    lib_value = lib(p, batch)
    (lib_grad,) = torch.autograd.grad(lib_value, p)
    p = pred0.clone().requires_grad_()
    value, u_new = song_surrogate(
        p, ratings[:, :P], u0, num_items=N, num_relevant=num_rel, ideal_dcg=ideal, gamma=0.3, margin=0.7
    )
    (grad,) = torch.autograd.grad(value, p)
    assert float(value.detach()) == pytest.approx(float(lib_value.detach()), abs=1e-6)
    assert torch.allclose(grad, lib_grad, atol=1e-6, rtol=0) and float(grad.abs().max()) > 1e-2
    assert torch.allclose(u_new.reshape(-1), lib.u[item_ids[:, :P].reshape(-1)], atol=1e-12)


def test_exact_risk_and_ideal_dcg_against_direct_computation() -> None:
    g = torch.Generator().manual_seed(3)
    h = torch.rand(9, generator=g, dtype=F64)
    r = torch.tensor([2, 0, 1, 0, 0, 3, 0, 1, 0])
    q = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    n = 5
    terms = []
    for query in (0, 1):
        rows = [i for i in range(9) if int(q[i]) == query]
        rel = sorted((int(r[i]) for i in rows), reverse=True)
        z = sum((2**x - 1) / math.log2(p + 2) for p, x in enumerate(rel))
        for i in rows:
            if int(r[i]) == 0:
                continue
            gi = sum(max(0.0, 1 - (float(h[i]) - float(h[j]))) ** 2 for j in rows) / len(rows)
            terms.append(-(2 ** int(r[i]) - 1) / (z * math.log2(1 + n * gi)))
    assert float(ndcg_risk(h, r, q, num_items=n)) == pytest.approx(sum(terms) / len(terms), abs=1e-12)
    assert float(ideal_dcg(torch.tensor([1, 3, 0]), k=1)) == 7.0


def test_queries_without_a_relevant_item_are_named() -> None:
    with pytest.raises(FedriskError, match="train: query 4 has no relevant item"):
        check_queries(torch.tensor([1, 0, 0, 0]), torch.tensor([2, 2, 4, 4]), "train")
    with pytest.raises(FedriskError, match="relevance labels must be >= 0"):
        check_queries(torch.tensor([1, -1]), torch.tensor([0, 0]))
    with pytest.raises(FedriskError, match="ndcg_risk: query 1 has no relevant item"):
        ndcg_risk(torch.zeros(4), torch.tensor([1, 0, 0, 0]), torch.tensor([0, 0, 1, 1]))


def test_song_training_raises_test_ndcg() -> None:
    """A plain SONG loop (linear scorer, per-(query, item) u, 2 queries x 2 relevant + 6 items per
    step) on the generated set raises the test NDCG@5 of fresh queries."""
    train, test, _ = synthetic_ranking_data(num_clients=1, queries_per_client=20, items_per_query=12, dim=6, seed=1)
    q_train = train.attrs["query"]
    queries = torch.unique(q_train)
    w = torch.zeros(6, dtype=F64, requires_grad=True)
    x_tr, x_te = train.x.to(F64), test.x.to(F64)
    u = {}
    g = torch.Generator().manual_seed(0)
    start = ndcg_at_k((x_te @ w).detach(), test.y, test.attrs["query"], k=5)
    rows_of = {int(q): torch.nonzero(q_train == q).flatten() for q in queries}
    for _ in range(150):
        picked = queries[torch.randint(len(queries), (2,), generator=g)]
        rows, rel, u_rows, keys, num_rel, ideal = [], [], [], [], [], []
        for q in picked.tolist():
            items = rows_of[q]
            relevant = items[train.y[items] > 0]
            pos = relevant[torch.randint(len(relevant), (2,), generator=g)]
            other = items[torch.randint(len(items), (6,), generator=g)]
            rows.append(torch.cat([pos, other]))
            rel.append(train.y[pos])
            keys.append([int(i) for i in pos])
            u_rows.append(torch.tensor([u.get(k, 0.0) for k in keys[-1]], dtype=F64))
            num_rel.append(float(len(relevant)))
            ideal.append(float(ideal_dcg(train.y[items])))
        scores = x_tr[torch.stack(rows)] @ w
        loss, u_new = song_surrogate(
            scores, torch.stack(rel), torch.stack(u_rows), num_items=12, num_relevant=torch.tensor(num_rel),
            ideal_dcg=torch.tensor(ideal, dtype=F64), gamma=0.5,
        )  # fmt: skip
        for ks, vals in zip(keys, u_new):
            u.update(zip(ks, vals.tolist()))
        (grad,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w -= 0.5 * grad
    end = ndcg_at_k((x_te @ w).detach(), test.y, test.attrs["query"], k=5)
    assert end > start + 0.2, (start, end)
