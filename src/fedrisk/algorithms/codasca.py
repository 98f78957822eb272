r"""CODASCA: CODA+ with control variates on the primal and the dual and a global step (Alg. 3 + 4).

Yuan, Guo, Xu, Ying & Yang, ICML 2021 (spec ``shared/specs/000_codasca.md``; the family:
``docs/auc-family.md``).  Alg. 3 is Alg. 1's stages (:mod:`fedrisk.algorithms.stagewise`);
Alg. 4 (DSGSCA+, one stage) is CODA+'s window (:mod:`fedrisk.algorithms.codaplus`) with the
lines marked ``+`` — which is all this module writes, through CODA+'s control-variate hooks::

      server: v_0, α_0;  + c_v = 0, c_α = 0;  clients + c_v^k = c_α^k = 0      control_variates_init
      for r = 1..R:
        every client k: (v, α) = (v_{r−1}, α_{r−1})  (+ c_v, c_α)              control_variates_payload
        for t = 0..I−1:  g_v, g_α as in CODA+ (F_k^s, prox included)
          v ← v − η_l (g_v + (c_v − c_v^k))                                    control_variates_shift
          α ← α + η_l (g_α + (c_α − c_α^k))
      + c_v^k ← c_v^k − c_v + (v_{r−1} − v_I^k)/(I η_l)            eq. (6)     control_variates_update
      + c_α^k ← c_α^k − c_α + (α_I^k − α_{r−1})/(I η_l)            (or eq. (7): the window's mean direction)
      + c = mean_k c^k                                                         control_variates_aggregate
        v̂, α̂ = mean_k (v_I^k, α_I^k)
      + v_r = v_{r−1} + η_g (v̂ − v_{r−1}),  α_r = Π(α_{r−1} + η_g (α̂ − α_{r−1}))   server_step
      output: (v_r̃, α_r̃), r̃ ~ U{1..R}                                          stage_output = "random"

Example:
    >>> from fedrisk.data.sources.synthetic import class_split_auc_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = class_split_auc_federation(4, seed=0, num_neg_classes=4, num_pos_classes=4, dim=8,
    ...                                  neg_per_class=40, test_per_class=20)
    >>> model = FunctionalModel(build_model("mlp", (8,), 1, hidden=[8], output_activation="sigmoid"))
    >>> alg = CODASCA(model=model, lr=0.1, window=4, stage_iters=20)
    >>> sim = Simulation(alg, fed, seed=0)
    >>> [sim.step().kind for _ in range(5)][-1], sorted(sim.server_state)
    ('stage_end', ['alpha', 'c_alpha', 'c_v', 'candidate', 'pick', 'v'])
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.codaplus import CODA, NPA, CODAPlus, SingleClassClientWarning
from fedrisk.algorithms.primal_dual import (
    LocalWindow,
    control_variate_difference,
    control_variate_mean,
    server_extrapolate,
)
from fedrisk.algorithms.stagewise import STAGE_END, StageSlot
from fedrisk.errors import check_range, unknown_name
from fedrisk.tree import Tree, tree_map, tree_zeros_like

# CODASCA, and the family's classes that this module has always offered (defined in codaplus.py)
__all__ = [
    "CODA",
    "CODASCA",
    "CONTROL_VARIATES",
    "EFFECTIVE_STEP_LIMIT",
    "NPA",
    "CODAPlus",
    "LargeEffectiveStepWarning",
    "SingleClassClientWarning",
]

CONTROL_VARIATES = ("difference", "gradient_mean")
EFFECTIVE_STEP_LIMIT = 1.0
"""CODASCA warns (:class:`LargeEffectiveStepWarning`) when ``η̃ = η_l · η_g · I`` exceeds this."""


class LargeEffectiveStepWarning(UserWarning):
    """CODASCA's effective step ``η̃ = η_l · η_g · I`` is large: Theorem 2 (Lemma 2) needs
    ``η̃ ≤ min{1/(3ℓ + 3ℓ²/μ_2), μ_2/(40ℓ²)}``, and the spec's deterministic toy (§7.2) already
    diverges at ``η̃ = 1.28`` (the control variates lag one window behind)."""


@dataclass(frozen=True)
class CODASCA(CODAPlus):
    """CODASCA: DSGSCA+ stages (Alg. 4) — CODA+ with SCAFFOLD-style control variates on
    ``v = (w, a, b)`` and on ``α``, and the server extrapolation ``η_g``.

    Args:
        global_lr: ``η_g`` (1 = plain averaging; the paper tunes {1.1, 1, 0.99, 0.999}; Theorem
            2 uses ``sqrt(K)``).
        control_variate: ``"difference"`` (eq. (6), default) or ``"gradient_mean"`` (eq. (7)).
        reset_control_variates: restart ``c``, ``c^k`` at 0 at every stage, as Alg. 4's box does
            (then the first window of every stage is a plain CODA+ window).  Off by default: the
            paper's experiments and the official code never reset them.
        stage_output: defaults to ``"random"`` (Alg. 4's output).
    """

    name: ClassVar[str] = "codasca"

    stage_output: str = "random"
    global_lr: float = 1.0
    control_variate: str = "difference"
    reset_control_variates: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("global_lr", self.global_lr, 0.0, None, low_inclusive=False)
        if self.control_variate not in CONTROL_VARIATES:
            raise unknown_name("control_variate", self.control_variate, CONTROL_VARIATES)
        # η̃_s = η_s · η_g · I_s: constant over the stages when window_growth = lr_decay (Theorem 2)
        # (without stages window_growth = 1 and lr_decay >= 1, so nothing grows: CODAPlus checks that)
        growth = self.window_growth / self.lr_decay
        eta_tilde = self.lr * self.global_lr * self.window
        if eta_tilde > EFFECTIVE_STEP_LIMIT or growth > 1.0:
            warnings.warn(
                f"{self.name}: the effective step eta_tilde = lr * global_lr * window = {self.lr!r} * "
                f"{self.global_lr!r} * {self.window} = {eta_tilde:.4g}"
                + (f" (growing by {growth:.4g} per stage)" if growth > 1.0 else "")
                + f" exceeds {EFFECTIVE_STEP_LIMIT}: Theorem 2 needs eta_tilde <= min(1/(3l + 3l^2/mu_2), "
                "mu_2/(40 l^2)) and the spec's heterogeneous toy diverges at 1.28; CODASCA may oscillate or "
                "diverge. Lower lr or window (or keep window_growth <= lr_decay)",
                LargeEffectiveStepWarning,
                stacklevel=3,
            )

    # -- Alg. 4's lines marked + (the hooks of CODA+) -------------------------------------------
    @property
    def sums_directions(self) -> bool:
        """Eq. (7) needs the window's directions summed."""
        return self.control_variate == "gradient_mean"

    def control_variates_init(self, v: Tree, alpha: Tree) -> dict[str, Any]:
        """``c_v = c_v^k = 0``, ``c_α = c_α^k = 0`` (§2.7-4)."""
        return {"c_v": tree_zeros_like(v), "c_alpha": tree_zeros_like(alpha)}

    def control_variates_payload(self, server_state: Tree) -> dict[str, Any]:
        """The global ``(c_v, c_α)`` go down with ``(v, α)``: twice CODA+'s bytes (P16)."""
        return {"c_v": server_state["c_v"], "c_alpha": server_state["c_alpha"]}

    def control_variates_shift(self, payload: Mapping[str, Any], state: Tree) -> tuple[Tree, Tree]:
        """``c − c^k``, constant through the window."""
        return tree_map(torch.sub, payload["c_v"], state["c_v"]), tree_map(
            torch.sub, payload["c_alpha"], state["c_alpha"]
        )

    def control_variates_update(
        self,
        payload: Mapping[str, Any],
        state: Tree,
        local: LocalWindow,
        slot: StageSlot,
        reply: dict[str, Any],
        new_state: dict[str, Any],
    ) -> None:
        """Eq. (6) with the *old* global ``c`` (or eq. (7)); nothing is sent in a stage's last
        window when the control variates restart (Alg. 4's box)."""
        if self.sums_directions:  # eq. (7): the mean of the directions used in the window
            assert local.direction_sum is not None
            c_v = control_variate_mean(local.direction_sum[0], slot.steps)
            c_alpha = control_variate_mean(local.direction_sum[1], slot.steps)
        else:  # eq. (6)
            v0, alpha0 = payload["v"], payload["alpha"]
            c_v = control_variate_difference(state["c_v"], payload["c_v"], v0, local.v, slot.steps, slot.lr)
            c_alpha = control_variate_difference(
                state["c_alpha"], payload["c_alpha"], alpha0, local.alpha, slot.steps, slot.lr, ascent=True
            )
        if slot.kind == STAGE_END and self.reset_control_variates:  # c^k = 0 for the next stage
            c_v, c_alpha = tree_zeros_like(c_v), tree_zeros_like(c_alpha)
        else:
            reply["c_v"], reply["c_alpha"] = c_v, c_alpha
        new_state["c_v"], new_state["c_alpha"] = c_v, c_alpha

    def control_variates_aggregate(self, replies: Replies, slot: StageSlot) -> dict[str, Any]:
        """``c = (1/K) Σ_k c^k`` (kept at 0 by :meth:`end_stage` when they restart)."""
        if slot.kind == STAGE_END and self.reset_control_variates:
            return {}
        return {"c_v": replies.mean("c_v"), "c_alpha": replies.mean("c_alpha")}

    def end_stage(self, state: Tree, replies: Replies, slot: StageSlot) -> Tree:
        new = super().end_stage(state, replies, slot)
        if self.reset_control_variates:  # Alg. 4's box: c = 0 at every stage's start
            new["c_v"], new["c_alpha"] = tree_zeros_like(new["c_v"]), tree_zeros_like(new["c_alpha"])
        return new

    def server_step(self, server_state: Tree, v_mean: Tree, alpha_mean: Tree) -> tuple[Tree, Tree]:
        """``v_r = v_{r−1} + η_g (v̂_r − v_{r−1})``, ``α_r = Π(α_{r−1} + η_g (α̂_r − α_{r−1}))``
        (:func:`~fedrisk.algorithms.primal_dual.server_extrapolate`; ``Π``: AUCM's ``α ≥ 0``)."""
        v, alpha = server_state["v"], server_state["alpha"]
        return server_extrapolate(v, v_mean, alpha, alpha_mean, self.global_lr, project_dual=self.dual_projection())
