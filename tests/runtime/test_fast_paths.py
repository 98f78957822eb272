"""The executors' fast paths equal the generic ones."""

from __future__ import annotations

import torch

from fedrisk.aggregators.base import InMemoryReplies
from fedrisk.runtime.executor import _provably_finite
from fedrisk.tree import tensor_leaves, tree_nbytes


def _replies() -> dict[int, dict]:
    g = torch.Generator().manual_seed(0)
    return {k: {"params": {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g)}} for k in (0, 2, 7)}


def test_stacked_sum_equals_one_by_one_sum(monkeypatch) -> None:
    """The replies' stacked reduction (one tensordot per leaf, chunked) against adding the
    replies one by one."""
    from fedrisk.aggregators import base

    replies = _replies()
    weights = {0: 0.2, 2: 0.5, 7: 0.3}
    trees = [r["params"] for r in replies.values()]
    for w in (None, weights):
        ws = [1.0] * 3 if w is None else [w[k] for k in replies]
        by_hand = {n: sum(wk * t[n] for wk, t in zip(ws, trees)) for n in ("w", "b")}
        got = InMemoryReplies(replies).sum("params", w)
        assert all(torch.allclose(got[n], by_hand[n], rtol=1e-6, atol=1e-7) for n in ("w", "b"))
        monkeypatch.setattr(base, "STACK_BYTES", 60)  # one reply per chunk for "w" (60 bytes)
        chunked = InMemoryReplies(replies).sum("params", w)
        monkeypatch.undo()
        assert all(torch.allclose(chunked[n], got[n], rtol=1e-6, atol=1e-7) for n in ("w", "b"))
    mixed = {0: {"p": {"a": torch.ones(2)}}, 1: {"p": {"a": torch.ones(3)}}}
    assert base.stacked_weighted_sum([r["p"] for r in mixed.values()]) is None  # shapes differ
    assert InMemoryReplies(replies).nbytes() == {0: 72, 2: 72, 7: 72}


def test_tensor_leaves_fast_path_keeps_pytree_order() -> None:
    """Nested plain dicts skip torch's pytree but give its leaves, in its order."""
    from torch.utils import _pytree as pytree

    nested = {"y": torch.zeros(3), "b": [torch.ones(1), 2.0, None]}
    tree = {"z": torch.ones(2), "a": nested, "n": 3, "t": (torch.ones(4),)}
    expected = [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]
    got = tensor_leaves(tree)
    assert len(got) == len(expected) == 4 and all(a is b for a, b in zip(got, expected))
    assert tree_nbytes(tree) == 4 * (2 + 3 + 1 + 4)
    single = torch.ones(2)
    assert tensor_leaves(single)[0] is single


def test_provably_finite_detects_nan_and_inf() -> None:
    trees = [r["params"] for r in _replies().values()]
    assert _provably_finite(trees)
    for bad in (float("nan"), float("inf")):
        broken = [dict(t) for t in trees]
        broken[1]["b"] = broken[1]["b"].clone()
        broken[1]["b"][0] = bad
        assert not _provably_finite(broken)
    big = torch.zeros(2**21)
    big[-1] = float("nan")
    assert not _provably_finite([{"x": big}])
    # a NaN in one dtype among several, and a lone leaf of its shape (no stacking)
    mixed = [{"a": torch.ones(3), "b": torch.ones(2, dtype=torch.float64), "c": torch.ones(5)}]
    assert _provably_finite(mixed)
    mixed[0]["b"] = torch.tensor([1.0, float("-inf")], dtype=torch.float64)
    assert not _provably_finite(mixed)


def test_eager_sgd_steps_equal_the_generic_loop_bitwise(monkeypatch) -> None:
    """``sgd_steps``' eager loop (flat dict, no correction, Python lr) against the generic
    loop, forced by an identity correction: the same parameters and loss, bit for bit."""
    from fedrisk.algorithms import local
    from fedrisk.algorithms.base import LocalData
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import cross_entropy
    from fedrisk.rng import client_generator

    calls = []
    eager = local._eager_sgd_steps
    monkeypatch.setattr(local, "_eager_sgd_steps", lambda *a: calls.append(1) or eager(*a))
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(30, 8, generator=g), torch.randint(0, 4, (30,), generator=g)
    data = LocalData(x, y, torch.tensor(30))
    idx = local.sample_batches(client_generator(0, 0, 0), 30, 6, 5)
    for name, options in [("logreg", {}), ("mlp", {"hidden": (16, 16)})]:
        model = FunctionalModel(build_model(name, (8,), 4, **options))
        params = model.init_params(torch.Generator().manual_seed(0))
        objective = local.supervised_objective(model.apply, cross_entropy)
        fast, fast_loss = local.sgd_steps(objective, params, data, idx, 0.1)
        slow, slow_loss = local.sgd_steps(objective, params, data, idx, 0.1, correction=lambda p, gr: gr)
        assert fast.keys() == slow.keys() and all(torch.equal(fast[k], slow[k]) for k in fast)
        assert torch.equal(fast_loss, slow_loss)
    assert len(calls) == 2  # the eager loop really ran (once per model)


def test_in_place_local_sgd_under_vmap_equals_the_out_of_place_loop(monkeypatch) -> None:
    """Under ``vmap`` alone ``sgd_steps`` updates its own tensors in place from step 1 on: the
    same numbers, bit for bit, as the out-of-place loop; the payload (shared by the block,
    step 0) is never written; under ``vmap(grad(...))`` the loop stays out of place."""
    from fedrisk.algorithms import local
    from fedrisk.algorithms.base import LocalData
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import cross_entropy

    model = FunctionalModel(build_model("mlp", (5,), 3, hidden=[7]))
    params = model.init_params(0)
    before = {k: v.clone() for k, v in params.items()}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 9, 5, generator=g), torch.randint(0, 3, (4, 9), generator=g)
    idx = torch.randint(0, 9, (4, 6, 2), generator=g)
    objective = local.supervised_objective(model.apply, cross_entropy)

    def run(p, xk, yk, ik):
        return local.sgd_steps(objective, p, LocalData(xk, yk, torch.tensor(9)), ik, 0.1)

    calls = []
    original = local._sgd_update_
    monkeypatch.setattr(local, "_sgd_update_", lambda *a: calls.append(1) or original(*a))
    fast = torch.func.vmap(run, in_dims=(None, 0, 0, 0))(params, x, y, idx)
    assert len(calls) == 5 * len(params)  # steps 1..5, every leaf
    with local.fast_paths(in_place=False):
        slow = torch.func.vmap(run, in_dims=(None, 0, 0, 0))(params, x, y, idx)
    assert len(calls) == 5 * len(params)  # no further in-place call
    explicit = torch.func.vmap(
        lambda p, xk, yk, ik: local.sgd_steps(
            objective, p, LocalData(xk, yk, torch.tensor(9)), ik, 0.1, in_place=False
        ),
        in_dims=(None, 0, 0, 0),
    )(params, x, y, idx)
    assert len(calls) == 5 * len(params)
    assert all(torch.equal(explicit[0][k], slow[0][k]) for k in params)
    monkeypatch.undo()
    assert all(torch.equal(fast[0][k], slow[0][k]) for k in params) and torch.equal(fast[1], slow[1])
    assert all(torch.equal(params[k], before[k]) for k in params)
    calls.clear()
    monkeypatch.setattr(local, "_sgd_update_", lambda *a: calls.append(1) or original(*a))
    outer = torch.func.vmap(torch.func.grad(lambda p, xk, yk, ik: run(p, xk, yk, ik)[1]), in_dims=(None, 0, 0, 0))
    assert outer(params, x, y, idx)["layers.0.weight"].shape == (4, 7, 5) and not calls


def test_fast_path_switches_reject_bad_input_and_restore() -> None:
    """``local.fast_paths``: unknown names and non-bool values are FedriskErrors naming the
    allowed choices; the switches in force come back after the block, also on an exception."""
    import pytest

    from fedrisk.algorithms import local
    from fedrisk.errors import FedriskError

    with pytest.raises(FedriskError, match="fused, gather, in_place"), local.fast_paths(fusion=False):
        pass
    with pytest.raises(FedriskError, match="True or False"), local.fast_paths(fused=0):
        pass
    with pytest.raises(RuntimeError), local.fast_paths(fused=False, gather=False) as active:
        assert not active.fused and not active.gather and active.in_place
        raise RuntimeError("inside")
    assert local.active_fast_paths() == local.FastPaths()
