"""PERM with clients of different model widths (Deng et al., NeurIPS 2023, Sec. 3.3).

The paper describes this case only at a high level (masked sub-models m_i of the global model
in the weight objective, "partial training" of the personal models) and runs no experiment;
:class:`PERMHetero` documents the mechanism chosen here.  Built on :mod:`fedrisk.algorithms.perm`.

Example:
    >>> import torch
    >>> p = {"l0.weight": torch.ones(4, 3), "l0.bias": torch.ones(4), "l1.weight": torch.ones(2, 4)}
    >>> width_mask(p, 0.25)["l0.bias"].tolist()
    [1.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import ClientResult, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.local import sgd_steps, supervised_objective
from fedrisk.algorithms.perm import (
    PERM,
    _estimate_gradients,
    _row,
    weights_from_replies,
)
from fedrisk.errors import FedriskError
from fedrisk.tree import Tree, tree_map, tree_stack


def _units(size: int, ratio: float) -> int:
    return max(1, math.ceil(ratio * size - 1e-9))


def width_mask(params: Tree, ratio: float) -> dict[str, Tensor]:
    """0/1 masks of the width-``ratio`` sub-model of a stack of linear layers (an MLP): the
    first ``ceil(ratio * h)`` units of every hidden layer (HeteroFL's static sub-model; the
    input and output layers keep their sizes).

    Example:
        >>> p = {"l0.weight": torch.ones(4, 3), "l0.bias": torch.ones(4), "l1.weight": torch.ones(2, 4)}
        >>> m = width_mask(p, 0.5)
        >>> m["l0.weight"].sum(1).tolist(), m["l0.bias"].tolist(), m["l1.weight"].sum(0).tolist()
        ([3.0, 3.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0])
    """
    if not 0.0 < ratio <= 1.0:
        raise FedriskError(f"width {ratio!r} cannot be served: widths are fractions of the hidden layers in (0, 1]")
    if not isinstance(params, dict):
        raise FedriskError("heterogeneous widths need a model whose parameters are a flat dict (model = 'mlp')")
    weights = [k for k, v in params.items() if isinstance(v, Tensor) and v.dim() == 2]
    if len(weights) < 2 or len(weights) + sum(k.endswith("bias") for k in params) != len(params):
        raise FedriskError(
            "heterogeneous widths cannot be served by this model: they need a stack of linear layers with at least "
            f"one hidden layer (model = 'mlp' with hidden = [...]); got parameters {list(params)}"
        )
    masks: dict[str, Tensor] = {}
    for layer, key in enumerate(weights):
        out_dim, in_dim = params[key].shape
        rows = out_dim if layer == len(weights) - 1 else _units(out_dim, ratio)
        cols = in_dim if layer == 0 else _units(in_dim, ratio)
        m = torch.zeros_like(params[key])
        m[:rows, :cols] = 1.0
        masks[key] = m
        bias = key[: -len("weight")] + "bias"
        if bias in params:
            masks[bias] = (torch.arange(out_dim, device=params[bias].device) < rows).to(params[bias].dtype)
    if set(masks) != set(params):
        unknown = sorted(set(params) - set(masks))
        raise FedriskError(f"heterogeneous widths: cannot tell which layer {unknown} belong to")
    return masks


def _masked(tree: Tree, mask: Tree) -> Tree:
    return tree_map(lambda x, m: x * m, tree, mask)


@dataclass(frozen=True)
class PERMHetero(PERM):
    """Single-loop PERM with clients of different model widths (the paper's Sec. 3.3 case, which
    it leaves unspecified; spec §2.9 / P15).  What is implemented:

    * client k's model v_k is an MLP whose hidden layers have ``widths[k % len(widths)]`` of the
      global model's units (HeteroFL's static sub-models, kept at full size with the other units
      at zero, so every payload has one shape);
    * v_k travels through the shuffle schedule like any PERM model; a host j trains it on its own
      data, but only the units both can hold (``mask_k * mask_j``: a weak host trains the
      sub-model of its own width, partial training; the rest of v_k is left as it is);
    * weights (Sec. 3.3): every client uploads its gradient at its own sub-model ``m_k * w`` of
      the global model, restricted to ``m_k``; ``D_ij = ||g_i - g_j||^2`` and the closed form of
      eq. (2) (the VC-dimension term of Sec. 3.3 is left out);
    * the global model's step averages each coordinate over the clients that hold it (HeteroFL).

    ``widths`` must lie in (0, 1] and the model must be an MLP with at least one hidden layer,
    else a FedriskError says why the widths cannot be served.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> PERMHetero(model=FunctionalModel(build_model("mlp", (4,), 2)), loss=cross_entropy, widths=(1.0, 1.5))
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: width 1.5 cannot be served: widths are fractions of the hidden layers in (0, 1]
    """

    name: ClassVar[str] = "perm_hetero"

    widths: tuple[float, ...] = (1.0, 0.5)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.widths:
            raise FedriskError("widths must name at least one width in (0, 1]")
        if self.warmup != "uniform":
            raise FedriskError(
                f"perm_hetero supports warmup = 'uniform' only (alpha uniform for warmup_rounds); got {self.warmup!r}"
            )
        params = self.init_params(torch.Generator())  # only the shapes matter
        for r in (1.0, *self.widths):  # 1.0 first: whether the model can be masked at all
            width_mask(params, r)

    def width(self, client: int) -> float:
        return self.widths[client % len(self.widths)]

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        state = super().init_server(ctx, params, gen)
        masks = [width_mask(params, self.width(k)) for k in range(ctx.fed.num_clients)]
        state["masks"] = tree_stack(masks)
        state["v"] = tree_stack([_masked(params, m) for m in masks])
        return state

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = server_state["members"].tolist()
        masks = server_state["masks"]
        if self.round_kind(server_state) == "estimate":
            w = server_state["w"]
            per_client = {k: {"params": _masked(w, _row(masks, k)), "mask": _row(masks, k)} for k in clients}
            return RoundPlan(clients, per_client=per_client, kind="estimate")
        hosts, owner = self.hosting(server_state)
        v = server_state["v"]
        per_client = {
            k: {
                "params": _row(v, i),
                "alpha": self.visit_weight(server_state, i, k),
                "mask": tree_map(lambda m, i=i, k=k: m[i] * m[k], masks),
            }
            for k, i in zip(hosts, owner.tolist())
        }
        return RoundPlan(clients, per_client=per_client, kind="shuffle")

    def aggregate_other(self, ctx: RoundContext, state: dict, replies: Replies, gen: torch.Generator) -> Tree:
        if self.estimates_weights(int(state["round"]) - 1):
            state["alpha"] = weights_from_replies(
                state["alpha"], replies, ctx.fed.client_sizes, self.lam, "grad_full", out=state
            )
        total = replies.sum("grad" if self.global_batch is not None else "grad_full")
        holders = tree_map(lambda m: m.sum(0).clamp_min(1.0), state["masks"])  # clients holding each coordinate
        state["w"] = tree_map(lambda p, s, c: p - self.global_lr * s / c, state["w"], total, holders)
        state["j"] = torch.tensor(0)
        return state

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        mask = payload["mask"]
        if ctx.kind != "shuffle":
            out = _estimate_gradients(self, payload["params"], data, draws)
            reply = {k: _masked(g, mask) for k, g in out["reply"].items()}
            return ClientResult(reply, state, {"global_loss": out["loss"]})
        N = ctx.fed.num_clients
        step = (self.lr / N) * N * payload["alpha"]
        objective = supervised_objective(self.model.apply, self.loss)
        params, loss = sgd_steps(
            objective, payload["params"], data, draws["batches"], step, lambda p, g: _masked(g, mask)
        )
        reply = {"params": params, "weighted_loss": payload["alpha"].to(loss.dtype) * loss}
        return ClientResult(reply, state, {"host_loss": loss})
