r"""Baselines of FeDXL (spec §2.5): Local Pair and centralised pairwise / compositional (SOX) training.

* **Local Pair** (:class:`LocalPair`): every client optimises the X-risk of its *own* pairs only —
  ``mean_p ∇f(u_p) mean_q ℓ(a_p, b_q)`` with ``a``, ``b`` this step's local positive / negative
  scores — and the models (and momenta) are averaged every ``K`` steps.  It ignores the
  cross-client pairs of eqs. (3) / (8), so it optimises a different objective whenever the
  clients differ; a client holding one class has no pairs (its update is zero: it only
  contributes its unchanged model to the average; ``check`` warns once).
* **Centralised** (:class:`CentralizedPair`): Local Pair on the pooled data (one client), i.e.
  minibatch pairwise SGD for linear f and SOX (Wang & Yang 2022) for ``f = λ log``: the u-table
  over all positives, ``u ← (1−γ) u + γ mean_q ℓ_in(a_p, b_q)`` and momentum ``β``.

The same local loop as FeDXL (:meth:`fedrisk.algorithms.pairwise.PairwiseBase.local_steps_loop`) with
the passive partners replaced by the step's own scores (stop-gradient), so that for linear f the
update is exactly the gradient of the local pairwise loss ``mean_{p,q} ℓ(a_p, b_q)``:

    >>> import torch
    >>> from fedrisk.objectives.xrisk import decomposed_surrogate, pairwise_auc_risk
    >>> a = torch.tensor([0.3, 0.9], requires_grad=True); b = torch.tensor([0.1, 0.5, 0.4], requires_grad=True)
    >>> one = torch.ones(2)
    >>> g1 = torch.autograd.grad(decomposed_surrogate("auc", "sigmoid", a, b, b.detach(), a.detach(), one, one), (a, b))
    >>> g2 = torch.autograd.grad(pairwise_auc_risk(a, b, "sigmoid"), (a, b))
    >>> all(torch.allclose(x, y) for x, y in zip(g1, g2))  # G1 = ∂/∂a, G2 = ∂/∂b of the pair mean
    True

Round structure: no bootstrap round (nothing is exchanged but models); reply ``params`` (and
``momentum`` when ``beta < 1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedrisk.algorithms.base import ClientResult, FedInfo, LocalData, RoundContext
from fedrisk.algorithms.pairwise import PairwiseBase
from fedrisk.errors import FedriskError
from fedrisk.tree import Tree

__all__ = ["CentralizedPair", "LocalPair"]


@dataclass(frozen=True)
class LocalPair(PairwiseBase):
    """Local Pair: the X-risk of each client's own pairs, local (momentum) SGD, periodic averaging.

    Args (besides :class:`~fedrisk.algorithms.pairwise.PairwiseBase`'s):
        xrisk: ``"auc"`` (linear f, default), ``"pauc"`` (KL-DRO, ``f = λ log``), ``"ap"``,
            ``"tpauc"`` or ``"pauc_cvar"`` (:class:`~fedrisk.algorithms.fedxl.FeDXL2`).
        lam, gamma, u_init, lam_pos, gamma_v, max_fpr, dual_lr: as in
            :class:`~fedrisk.algorithms.fedxl.FeDXL2` (the non-linear X-risks only).
        beta: momentum weight in ``(0, 1]`` (1 = plain SGD, default; the paper uses 0.1 for the
            pAUC task); the momentum is averaged with the model.
    """

    name: ClassVar[str] = "local_pair"
    federated_pairs: ClassVar[bool] = False

    xrisk: str = "auc"
    lam: float = 1.0
    gamma: float = 0.1
    beta: float = 1.0
    u_init: float = 1.0
    lam_pos: float = 1.0
    gamma_v: float = 0.1
    max_fpr: float = 0.2
    dual_lr: float = 0.1

    @property
    def uses_momentum(self) -> bool:
        return self.beta < 1.0

    def single_class_message(self, client: int, missing: str, n: int) -> str:
        return (
            f"{self.name}: client {client} has no {missing} examples ({n} samples), so it has no local pairs: its "
            "local update is zero and it only contributes its unchanged model to the average"
        )

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        params, G, new_state, _, _, _, loss, v = self.local_steps_loop(ctx, payload, state, data, draws)
        reply: dict[str, Any] = {"params": params}
        if G is not None:
            reply["momentum"] = G
        if v is not None:
            reply["v"] = v
        return ClientResult(reply, new_state, {"loss": loss})


@dataclass(frozen=True)
class CentralizedPair(LocalPair):
    """Centralised pairwise SGD (linear f) / SOX (``xrisk = "pauc"``) on the pooled data.

    ``requires_pooled_data`` makes the runner pool the clients into one; ``local_steps`` steps
    make one "round" (one evaluation unit).
    """

    name: ClassVar[str] = "centralized_pair"
    requires_pooled_data: ClassVar[bool] = True

    def check(self, fed: FedInfo) -> None:
        if fed.num_clients != 1:
            raise FedriskError(
                f"algorithm 'centralized_pair' trains on pooled data and needs a federation with exactly 1 client, "
                f"got num_clients = {fed.num_clients}; pool the clients first with "
                "fedrisk.algorithms.local_only.centralized(federation)"
            )
        super().check(fed)
