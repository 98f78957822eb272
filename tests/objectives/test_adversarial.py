"""``P_Y`` on a tree (the network dual of issue 30): box per parameter, ball and simplex over the
vector of all parameters, checked by hand; a one-leaf tree is projected as the flat games do."""

from __future__ import annotations

import pytest
import torch

from fedrisk.errors import FedriskError
from fedrisk.objectives.adversarial import tree_projection
from fedrisk.objectives.minimax import make_projection

F64 = torch.float64


def t(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=F64)


def test_ball_scales_every_parameter_by_the_global_norm() -> None:
    y = {"w": t(3.0, 0.0).reshape(1, 2), "b": t(4.0)}  # ||y|| = 5 over both leaves
    out = tree_projection("ball", radius=2.0)(y)
    torch.testing.assert_close(out["w"], t(1.2, 0.0).reshape(1, 2))
    torch.testing.assert_close(out["b"], t(1.6))
    inside = {"w": t(0.3, 0.0).reshape(1, 2), "b": t(0.4)}
    torch.testing.assert_close(tree_projection("ball", radius=2.0)(inside)["w"], inside["w"])


def test_simplex_projects_the_concatenation_of_the_leaves() -> None:
    project = tree_projection("simplex")
    out = project({"a": t(0.5), "b": t(0.5, 0.5)})  # θ = (1.5 − 1)/3: all three equal 1/3
    torch.testing.assert_close(out["a"], t(1 / 3))
    torch.testing.assert_close(out["b"], t(1 / 3, 1 / 3))
    out = project({"a": t(2.0), "b": t(0.0, 0.0)})
    torch.testing.assert_close(out["a"], t(1.0))
    torch.testing.assert_close(out["b"], t(0.0, 0.0))


def test_box_clips_each_parameter_and_none_is_no_projection() -> None:
    out = tree_projection("box", low=-0.5, high=0.25)({"w": t(-2.0, 0.1, 3.0)})
    torch.testing.assert_close(out["w"], t(-0.5, 0.1, 0.25))
    assert tree_projection("none") is None


@pytest.mark.parametrize("dual_set", ["simplex", "box", "ball"])
def test_a_one_leaf_tree_is_projected_exactly_as_the_flat_vector(dual_set: str) -> None:
    v = torch.randn(6, generator=torch.Generator().manual_seed(1), dtype=F64) * 3
    flat = make_projection(dual_set, 6, low=-0.5, high=0.5, radius=0.7)(v)
    tree = tree_projection(dual_set, low=-0.5, high=0.5, radius=0.7)({"x": v})["x"]
    assert torch.equal(tree, flat)


def test_the_tree_projection_runs_under_vmap_row_by_row() -> None:
    rows = torch.randn(3, 4, generator=torch.Generator().manual_seed(2), dtype=F64)
    project = tree_projection("simplex")
    batched = torch.func.vmap(lambda r: project({"a": r[:1], "b": r[1:]}))(rows)
    for i in range(3):
        one = project({"a": rows[i, :1], "b": rows[i, 1:]})
        torch.testing.assert_close(batched["b"][i], one["b"])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"dual_set": "sphere"}, "unknown dual_set 'sphere'"),
        ({"dual_set": "ball", "radius": -1.0}, "dual_radius = -1.0 is out of range"),
        ({"dual_set": "box", "low": 1.0, "high": 0.0}, "dual_low = 1.0 must be <= dual_high = 0.0"),
    ],
)
def test_bad_dual_sets_are_refused(kw: dict, message: str) -> None:
    with pytest.raises(FedriskError, match=message):
        tree_projection(**kw)
