"""The primal-dual engine's adapters from a game written on trees to leaf-list directions.

``tree_directions`` and ``flat_directions`` (``algorithms/primal_dual.py``) are what the network-dual
and SGDA families hand to ``local_sgda``; here they are checked directly, on nested trees, against
a plain loop of simultaneous descent-ascent written out by hand.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from fedrisk.algorithms.primal_dual import flat_directions, local_sgda, tree_directions

STEPS, LR, LR_DUAL = 3, 0.1, 0.3


def tree_game(t, v, a):
    """F_t(v, α) = (t+1)(p·w + q·(b0 − b1)) − (p² + q²)/2 on v = {w, b: (b0, b1)}, α = {p, q}."""
    s = t + 1.0
    w, (b0, b1) = v["w"], v["b"]
    p, q = a["p"], a["q"]
    loss = s * (p * w + q * (b0 - b1)) - 0.5 * (p * p + q * q)
    grad_v = {"w": s * p, "b": (s * q, -s * q)}
    grad_a = {"p": s * w - p, "q": s * (b0 - b1) - q}
    return loss, grad_v, grad_a


def hand_loop(w, b0, b1, p, q):
    """The same game's K steps of simultaneous SGDA, in floats (v ← v − η g_v, α ← α + η_α g_α)."""
    losses = []
    for t in range(STEPS):
        s = t + 1.0
        losses.append(s * (p * w + q * (b0 - b1)) - 0.5 * (p * p + q * q))
        gw, gb0, gb1 = s * p, s * q, -s * q
        gp, gq = s * w - p, s * (b0 - b1) - q
        w, b0, b1 = w - LR * gw, b0 - LR * gb0, b1 - LR * gb1
        p, q = p + LR_DUAL * gp, q + LR_DUAL * gq
    return (w, b0, b1, p, q), sum(losses) / len(losses)


def start():
    v = {
        "w": torch.tensor(0.5, dtype=torch.float64),
        "b": (torch.tensor(1.5, dtype=torch.float64), torch.tensor(-0.25, dtype=torch.float64)),
    }
    a = {"p": torch.tensor(0.75, dtype=torch.float64), "q": torch.tensor(-1.0, dtype=torch.float64)}
    return v, a


def test_tree_directions_runs_a_nested_game_through_local_sgda():
    v, a = start()
    window = local_sgda(tree_directions(tree_game, v, a), v, a, steps=STEPS, lr=LR, lr_dual=LR_DUAL)
    (w, b0, b1, p, q), loss = hand_loop(0.5, 1.5, -0.25, 0.75, -1.0)
    assert set(window.v) == {"w", "b"} and isinstance(window.v["b"], tuple)
    got = [window.v["w"], *window.v["b"], window.alpha["p"], window.alpha["q"]]
    assert [float(x) for x in got] == pytest.approx([w, b0, b1, p, q], rel=1e-12)
    assert float(window.loss) == pytest.approx(loss, rel=1e-12)


def test_tree_directions_returns_leaves_in_flatten_order():
    v, a = start()
    d = tree_directions(tree_game, v, a)
    loss, g_v, g_a = d(
        2, [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)], [torch.tensor(4.0), torch.tensor(5.0)]
    )
    # t = 2: s = 3; w = 1, b = (2, 3), p = 4, q = 5
    assert float(loss) == 3 * (4 * 1 + 5 * (2 - 3)) - 0.5 * (16 + 25)
    assert [float(g) for g in g_v] == [12.0, 15.0, -15.0]
    assert [float(g) for g in g_a] == [3 * 1 - 4.0, 3 * (2 - 3) - 5.0]


def flat_game(t, x, y):
    """f_t(x, y) = (t+1) y·(w, u) − |y|²/2 on x = {w, u} (scalars) and y a 2-vector."""
    s = t + 1.0
    loss = s * (y[0] * x["w"] + y[1] * x["u"]) - 0.5 * (y * y).sum()
    return loss, {"w": s * y[0], "u": s * y[1]}, s * torch.stack([x["w"], x["u"]]) - y


def nested_game(t, x, y):
    """``flat_game`` with ``u`` one level down (x = {w, n: {u}}): only the tree path can run it."""
    loss, gx, gy = flat_game(t, {"w": x["w"], "u": x["n"]["u"]}, y)
    return loss, {"w": gx["w"], "n": {"u": gx["u"]}}, gy


def hand_flat(w, u, y0, y1):
    for t in range(STEPS):
        s = t + 1.0
        gw, gu = s * y0, s * y1
        g0, g1 = s * w - y0, s * u - y1
        w, u, y0, y1 = w - LR * gw, u - LR * gu, y0 + LR_DUAL * g0, y1 + LR_DUAL * g1
    return w, u, y0, y1


@pytest.mark.parametrize("shape", ["flat", "nested", "mixed"])
def test_flat_directions_fast_path_and_tree_fallback_agree_with_the_hand_loop(shape):
    """A flat dict of tensors and a tensor y take the fast path; a nested ``x`` (wholly, or one
    entry of an otherwise flat dict) falls back to :func:`tree_directions`."""
    w, u, y = (
        torch.tensor(0.5, dtype=torch.float64),
        torch.tensor(-1.25, dtype=torch.float64),
        torch.tensor([0.75, 0.2], dtype=torch.float64),
    )
    if shape == "flat":
        x, game = {"w": w, "u": u}, flat_game
    elif shape == "mixed":  # one tensor entry and one dict entry: not every value is a tensor
        x, game = {"w": w, "n": {"u": u}}, nested_game
    else:
        x, game = {"n": {"u": u}, "w": w}, nested_game
    window = local_sgda(flat_directions(game, x, y), x, y, steps=STEPS, lr=LR, lr_dual=LR_DUAL)
    hw, hu, h0, h1 = hand_flat(0.5, -1.25, 0.75, 0.2)
    got_u = window.v["u"] if shape == "flat" else window.v["n"]["u"]
    assert [float(window.v["w"]), float(got_u)] == pytest.approx([hw, hu], rel=1e-12)
    assert window.alpha.tolist() == pytest.approx([h0, h1], rel=1e-12)


@pytest.mark.parametrize("kind", ["dual tree", "dict subclass"])
def test_flat_directions_falls_back_for_a_dual_tree_or_a_dict_subclass(kind):
    """A dual that is a tree of tensors (not one tensor), or an ``x`` that is a dict subclass,
    takes the tree path: the game gets the same kinds of objects it was written on."""
    seen = []

    def game(t, x, y):
        seen.append((type(x), type(y)))
        loss, gx, gy = flat_game(t, dict(x), torch.stack([y["a"], y["b"]]) if kind == "dual tree" else y)
        return loss, type(x)(gx), {"a": gy[0], "b": gy[1]} if kind == "dual tree" else gy

    w, u = torch.tensor(0.5, dtype=torch.float64), torch.tensor(-1.25, dtype=torch.float64)
    y0, y1 = torch.tensor(0.75, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    if kind == "dual tree":  # a plain dict x: only the dual is not a tensor
        x, y = {"w": w, "u": u}, {"a": y0, "b": y1}
    else:  # a tensor dual: only x is not a plain dict
        x, y = OrderedDict(w=w, u=u), torch.stack([y0, y1])
    window = local_sgda(flat_directions(game, x, y), x, y, steps=STEPS, lr=LR, lr_dual=LR_DUAL)
    hw, hu, h0, h1 = hand_flat(0.5, -1.25, 0.75, 0.2)
    assert seen == [(type(x), type(y))] * STEPS
    assert [float(window.v["w"]), float(window.v["u"])] == pytest.approx([hw, hu], rel=1e-12)
    got = [window.alpha["a"], window.alpha["b"]] if kind == "dual tree" else list(window.alpha)
    assert [float(g) for g in got] == pytest.approx([h0, h1], rel=1e-12)


def test_flat_directions_takes_the_fast_path_for_a_flat_dict_and_a_tensor(monkeypatch):
    """The documented fast path (no pytree work per step) is the one a model's flat parameter
    dict and a tensor dual take; anything else goes through :func:`tree_directions`."""
    import fedrisk.algorithms.primal_dual as primal_dual

    calls = []
    monkeypatch.setattr(primal_dual, "tree_directions", lambda *args: calls.append(args) or tree_directions(*args))
    x, y = {"w": torch.tensor(1.0), "u": torch.tensor(2.0)}, torch.tensor([3.0, 4.0])
    primal_dual.flat_directions(flat_game, x, y)
    assert calls == []
    primal_dual.flat_directions(nested_game, {"w": torch.tensor(1.0), "n": {"u": torch.tensor(2.0)}}, y)
    assert len(calls) == 1


def test_local_sgda_sums_nothing_unless_asked():
    v, a = start()
    window = local_sgda(tree_directions(tree_game, v, a), v, a, steps=STEPS, lr=LR)
    assert window.direction_sum is None and window.iterate_sum is None


def test_flat_directions_fast_path_hands_the_game_a_plain_dict_and_the_dual_tensor():
    seen = []

    def game(t, x, y):
        seen.append((t, type(x), sorted(x), type(y)))
        return flat_game(t, x, y)

    x = {"w": torch.tensor(1.0), "u": torch.tensor(2.0)}
    d = flat_directions(game, x, torch.tensor([3.0, 4.0]))
    loss, gx, gy = d(1, [torch.tensor(1.0), torch.tensor(2.0)], [torch.tensor([3.0, 4.0])])
    assert seen == [(1, dict, ["u", "w"], torch.Tensor)]
    assert [float(g) for g in gx] == [6.0, 8.0]  # s = 2: (2·3, 2·4), in x's key order
    assert len(gy) == 1 and gy[0].tolist() == [2 * 1 - 3.0, 2 * 2 - 4.0]
    assert float(loss) == 2 * (3 * 1 + 4 * 2) - 0.5 * (9 + 16)
