r"""The network dual player of the SGDA family (issue 30 item 4): what Local SGDA, FSGDA,
FESS-GDA, Fed-Norm-SGDA(+), Local SGDA+ and SAGDA need when ``y`` is a tree of parameters with
its own model (``dual_model``) and the objective a plain ``f(x_params, y_params, batch)``
(:mod:`fedrisk.objectives.adversarial`) instead of one of the flat-vector games.

Nothing of Algorithm 1 changes: the same K simultaneous local steps (the shared
:func:`~fedrisk.algorithms.primal_dual.local_sgda` works on trees), the same server steps with
``y`` averaged leaf by leaf and projected by :func:`~fedrisk.objectives.adversarial.tree_projection`
(``dual_set``) after every ascent step and in the server step.  The functions below are the
few places where a network dual differs from a vector: its initialisation, the minibatch the
objective sees (with the noise drawn in ``draw``), the check of the models against the
objective before round 0, and the game's own metrics.

Example:
    >>> from fedrisk.data import build_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.algorithms.fessgda import FESSGDA
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = build_federation("mog_2d", "k_classes", 4, seed=0,
    ...                        dataset_options={"num_samples": 400}, partition_options={"classes_per_client": 2})
    >>> mlp = lambda out: FunctionalModel(build_model("mlp", (2,), out, hidden=[16]))
    >>> alg = FESSGDA(model=mlp(2), dual_model=mlp(1), game="gan", noise_dim=2, lr=0.05, local_steps=3,
    ...               batch_size=16)
    >>> sim = Simulation(alg, fed, seed=0)
    >>> _ = sim.step()
    >>> sorted(sim.server_state["y"]) == sorted(alg.dual_model.names)  # y: the discriminator's parameters
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedrisk.algorithms.base import FedInfo, LocalData
from fedrisk.autodiff import in_functorch_transform
from fedrisk.errors import FedriskError
from fedrisk.objectives.adversarial import Batch, MinimaxGame
from fedrisk.tree import Tree, tensor_leaves

__all__ = ["check_network_game", "init_network_dual", "network_batch", "network_objective_check"]


def network_batch(alg: Any, data: LocalData, idx: Tensor, noise: Tensor | None) -> Batch:
    """The :class:`~fedrisk.objectives.adversarial.Batch` of rows ``idx`` (with their noise)."""
    dual = alg.dual_model.apply if alg.dual_model is not None else None
    attrs = {k: v[idx] for k, v in data.attrs.items()}
    return Batch(data.x[idx], data.y[idx], attrs, noise, alg.model.apply, dual)


def check_network_game(alg: Any, fed: FedInfo) -> None:
    """Before round 0: a network game needs its dual model (``[dual_model]`` / ``dual_model=``)."""
    if alg.dual_model is None:
        raise FedriskError(
            f"game {game_name(alg)!r} has a network dual player: give its model ([dual_model] table in a config, "
            "dual_model=FunctionalModel(...) in Python)"
        )
    if getattr(alg.dual_model, "norm_layers", None):
        layer = next(iter(alg.dual_model.norm_layers))
        raise FedriskError(
            f"dual_model: BatchNorm layer {layer!r} has running statistics, which are federated state for the "
            "primal model only; use GroupNorm or LayerNorm in the dual model (or no normalisation)"
        )


def game_name(alg: Any) -> str:
    """The game's name for messages (``"objective"`` for a function passed in Python)."""
    return getattr(alg.objective_fn, "__name__", "objective") if alg.objective_fn is not None else alg.game


def init_network_dual(alg: Any, like: Tensor, gen: torch.Generator, project: Any) -> Tree:
    """``y_0``: the dual model's seeded initialisation (from the server's ``init`` generator),
    in ``x``'s dtype and device, projected onto ``Y``."""
    y0 = alg.dual_model.init_params(gen, dtype=like.dtype, device=like.device)
    return y0 if project is None else project(y0)


def network_objective_check(alg: Any, game: MinimaxGame, data: Sequence[LocalData]) -> None:
    """Evaluate the objective once on two rows of the first client (eagerly, before round 0):
    a dual model whose output does not fit the objective, or an objective that is not a scalar,
    stops the run with one line naming the game and ``dual_model``."""
    if in_functorch_transform() or not data or int(data[0].size) == 0:
        return
    local = data[0]
    on = local.x.device  # the data's device (run.device)
    x = alg.model.init_params(0, device=on)
    dtype = tensor_leaves(x)[0].dtype
    idx = torch.arange(min(2, int(local.size)), device=on)
    noise = torch.zeros(len(idx), alg.noise_dim, dtype=dtype, device=on) if game.noise else None
    local = LocalData(local.x.to(dtype) if local.x.is_floating_point() else local.x, local.y, local.size, local.attrs)
    y = alg.dual_model.init_params(0, dtype=dtype, device=on)
    name = game_name(alg)
    try:
        value = game(x, y, network_batch(alg, local, idx, noise))
    except FedriskError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FedriskError(
            f"game {name!r}: the objective fails on the models' outputs ([model] and [dual_model] must fit it): {first}"
        ) from None
    if not isinstance(value, Tensor) or value.numel() != 1:
        shape = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise FedriskError(f"game {name!r}: the objective must return a scalar loss; got {shape}")
