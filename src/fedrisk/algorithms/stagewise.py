r"""The stagewise frame of CODA+ / CODASCA (paper 000, Alg. 1 and Alg. 3): the stage schedule and
the stage-output rules.

Stage ``s`` approximately solves eq. (5), ``min_v max_α f(v, α) + (λ/2)||v − v_0^s||²``, with
``R_s`` communication windows of ``I_s`` local steps at the step size ``η_s``; its output starts
stage ``s + 1`` and (usually) is that stage's prox reference ``v_0^{s+1}``.

* :class:`StageSchedule` — which stage, window position, step count, step size and round kind a
  round has: a pure function of the round number, so every party (``client_update`` under
  ``vmap`` included) knows a round's static step count from ``ctx.round`` alone.
* :class:`StageOutput` and its five rules (:data:`STAGE_OUTPUTS`) — what a stage outputs, as
  small strategy objects with hooks at the points of the round where the rule acts: the server's
  initial state, the client's prox reference, the client's stage end, the server's round and the
  server's stage end.  :func:`stage_output_rule` picks one.

Example (Alg. 1 with ``T_0 = 5``, ``I = 2``: three windows, the step size then divided by 3):
    >>> sched = StageSchedule(lr=0.3, window=2, stage_iters=5)
    >>> [sched.slot(r).kind for r in range(4)], sched.slot(3).stage
    (['train', 'train', 'stage_end', 'train'], 1)
    >>> type(stage_output_rule("random", staged=True, prox_coef=0.002)).__name__
    'RandomIterate'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from fedrisk.errors import FedriskError
from fedrisk.tree import Tree, tree_scale

__all__ = [
    "DUAL_RESET",
    "STAGE_END",
    "STAGE_OUTPUTS",
    "TRAIN",
    "Average",
    "Last",
    "LastGlobalAverageRef",
    "LastLocalAverageRef",
    "RandomIterate",
    "StageOutput",
    "StageSchedule",
    "StageSlot",
    "stage_output_rule",
]

TRAIN, STAGE_END, DUAL_RESET = "train", "stage_end", "dual_reset"
STAGE_OUTPUTS = ("average", "random", "last", "last_local_average_ref", "last_global_average_ref")


# ============================================================================================
# The schedule (Alg. 1 / Alg. 3's outer loop, mapped onto rounds)
# ============================================================================================


class StageSlot(NamedTuple):
    """Where a round falls in the stage schedule (a pure function of the round number)."""

    stage: int
    """``s``, counted from 0."""
    index: int
    """The round's position within its stage (0 = the stage's first window)."""
    steps: int
    """Local steps ``I_s`` of the round (0 for CODA's dual-reset round)."""
    lr: float
    """The local step size ``η_s`` of the stage."""
    kind: str
    """``"train"``, ``"stage_end"`` or ``"dual_reset"``."""


@dataclass(frozen=True)
class StageSchedule:
    """Stages of ``R_s`` windows of ``I_s`` local steps at ``η_s`` (docs/auc-family.md, "Schedule").

    * ``R_s = round(R_0 · rounds_growth^s)``, ``R_0 = ceil(stage_iters / window)``: stage
      boundaries fall on round boundaries, so the step size never changes inside a window;
    * ``I_s = round(window · window_growth^s)``; ``η_s = lr / lr_decay^s``;
    * ``stage_iters=None``: one endless stage; ``dual_reset_rounds`` extra rounds (CODA: 1)
      follow the ``R_s`` windows of every stage.

    ``name`` prefixes the error messages.
    """

    lr: float
    window: int
    stage_iters: int | None
    window_growth: float = 1.0
    rounds_growth: float = 1.0
    lr_decay: float = 3.0
    dual_reset_rounds: int = 0
    name: str = "stagewise"

    @property
    def staged(self) -> bool:
        """Whether there are stages at all (``stage_iters`` set)."""
        return self.stage_iters is not None

    def rounds_per_stage(self) -> int | None:
        """``R_0 = ceil(T_0 / I_0)`` windows in the first stage (None: one endless stage)."""
        if self.stage_iters is None:
            return None
        return -(-self.stage_iters // self.window)

    def stage_rounds(self, stage: int) -> int:
        """``R_s = round(R_0 · rounds_growth^s)`` windows in stage ``s`` (1 for an endless stage)."""
        R = self.rounds_per_stage()
        if R is None:
            return 1
        if self.rounds_growth == 1.0:
            return R
        return max(1, round(R * self.rounds_growth**stage))

    def stage_window(self, stage: int) -> int:
        """``I_s = round(window · window_growth^s)``."""
        if self.window_growth == 1.0:
            return self.window
        try:
            steps = self.window * self.window_growth**stage
        except OverflowError:
            steps = math.inf
        if steps > 2**40:
            raise FedriskError(f"{self.name}: the window of stage {stage} overflows (window_growth too large)")
        return max(1, round(steps))

    def stage_lr(self, stage: int) -> float:
        """``η_s = lr / lr_decay^s``."""
        return self.lr / self.lr_decay**stage

    def stage_steps(self, stage: int) -> int:
        """``T_s = R_s · I_s``: the local iterations of stage ``s`` (the average's divisor)."""
        return self.stage_rounds(stage) * self.stage_window(stage)

    def slot(self, round: int) -> StageSlot:
        """The stage, window position, local steps, step size and kind of ``round``."""
        R = self.rounds_per_stage()
        if R is None:
            return StageSlot(0, round, self.window, self.lr, TRAIN)
        if self.rounds_growth == 1.0:
            stage, index = divmod(round, R + self.dual_reset_rounds)
        else:  # stages of growing length: walk them (a handful)
            stage, index = 0, round
            while index >= (R := self.stage_rounds(stage)) + self.dual_reset_rounds:
                index -= R + self.dual_reset_rounds
                stage += 1
        if index >= R:
            return StageSlot(stage, index, 0, self.stage_lr(stage), DUAL_RESET)
        kind = STAGE_END if index == R - 1 else TRAIN
        return StageSlot(stage, index, self.stage_window(stage), self.stage_lr(stage), kind)


# ============================================================================================
# The stage-output rules (spec §2.7-6)
# ============================================================================================


class StageOutput:
    """What a stage outputs; the default hooks do nothing (the rule :class:`Last`).

    ``tracks_average``: clients sum their local iterates over the stage (``iterate_sum``);
    ``sends_sums``: they send the sums in the stage's last window and the server averages them;
    ``keeps_own_ref``: a client keeps its own prox reference from stage 1 on instead of the
    broadcast one.  The hooks are called by CODA+ at the named points of a round.
    """

    name: ClassVar[str] = "last"
    tracks_average: ClassVar[bool] = False
    sends_sums: ClassVar[bool] = False
    keeps_own_ref: ClassVar[bool] = False

    def init_server(self, state: dict[str, Any], v: Tree, alpha: Tree) -> None:
        """Add the rule's server fields to the initial server ``state`` (in place)."""

    def client_stage_end(self, running: Tree, total_steps: int, reply: dict[str, Any], state: dict[str, Any]) -> None:
        """After a client's last window of a stage: ``running`` = ``Σ_t (v_t^k, α_t^k)`` over
        the stage's ``total_steps`` (only when ``tracks_average``); update ``reply`` / ``state``."""

    def after_round(self, new: dict[str, Any], index: int, stage_rounds: int, gen: torch.Generator) -> None:
        """On the server after window ``index`` of a stage of ``stage_rounds`` windows."""

    def end_stage(self, new: dict[str, Any], state: Tree, average: Tree | None) -> None:
        """On the server after the stage's last window: set the next stage's start in ``new``.
        ``average`` = ``(1/K) Σ_k (1/T_s) Σ_t (v_t^k, α_t^k)`` when clients sent their sums."""


class Last(StageOutput):
    """``"last"``: the stage continues from the last server iterate (no extra state)."""


class Average(StageOutput):
    """``"average"`` (Alg. 2's output, default of CODA+, CODA, NPA): the time-and-client average
    ``(1/K) Σ_k (1/T_s) Σ_t (v_t^k, α_t^k)`` of all local iterates, exact; the clients send their
    iterate sums once, in the stage's last window."""

    name: ClassVar[str] = "average"
    tracks_average: ClassVar[bool] = True
    sends_sums: ClassVar[bool] = True

    def client_stage_end(self, running: Tree, total_steps: int, reply: dict[str, Any], state: dict[str, Any]) -> None:
        reply["iterate_sum"] = running

    def end_stage(self, new: dict[str, Any], state: Tree, average: Tree | None) -> None:
        assert average is not None
        new["v"], new["alpha"] = average["v"], average["alpha"]


class RandomIterate(StageOutput):
    """``"random"`` (Alg. 4's output, default of CODASCA): the server iterate ``(v_r̃, α_r̃)``
    after a window ``r̃ ~ U{1..R_s}`` drawn on the server at the stage's start."""

    name: ClassVar[str] = "random"

    def init_server(self, state: dict[str, Any], v: Tree, alpha: Tree) -> None:
        state["pick"] = torch.zeros((), dtype=torch.int64)
        state["candidate"] = {"v": v, "alpha": alpha}

    def after_round(self, new: dict[str, Any], index: int, stage_rounds: int, gen: torch.Generator) -> None:
        if index == 0:
            new["pick"] = torch.randint(stage_rounds, (), generator=gen)
        if index == int(new["pick"]):
            new["candidate"] = {"v": new["v"], "alpha": new["alpha"]}

    def end_stage(self, new: dict[str, Any], state: Tree, average: Tree | None) -> None:
        new["v"], new["alpha"] = state["candidate"]["v"], state["candidate"]["alpha"]


class LastLocalAverageRef(StageOutput):
    """``"last_local_average_ref"`` (the official code's ``update_regularizer``): continue from the
    last server iterate; each client re-centres its own prox reference on the average of its own
    local iterates over the stage, ``(1/T_s) Σ_t v_t^k`` (computed locally, never sent)."""

    name: ClassVar[str] = "last_local_average_ref"
    tracks_average: ClassVar[bool] = True
    keeps_own_ref: ClassVar[bool] = True

    def client_stage_end(self, running: Tree, total_steps: int, reply: dict[str, Any], state: dict[str, Any]) -> None:
        state["ref"] = tree_scale(1.0 / total_steps, running["v"])


class LastGlobalAverageRef(StageOutput):
    """``"last_global_average_ref"``: continue from the last server iterate; every client's prox
    reference becomes the cross-client stage average of the primal, broadcast by the server in
    the next stage's first window (the mean of the code's per-client references)."""

    name: ClassVar[str] = "last_global_average_ref"
    tracks_average: ClassVar[bool] = True
    sends_sums: ClassVar[bool] = True

    def __init__(self, server_ref: bool) -> None:
        self.server_ref = server_ref

    def init_server(self, state: dict[str, Any], v: Tree, alpha: Tree) -> None:
        if self.server_ref:
            state["ref"] = v

    def client_stage_end(self, running: Tree, total_steps: int, reply: dict[str, Any], state: dict[str, Any]) -> None:
        reply["iterate_sum"] = running

    def end_stage(self, new: dict[str, Any], state: Tree, average: Tree | None) -> None:
        if "ref" in new:
            assert average is not None
            new["ref"] = average["v"]


def stage_output_rule(name: str, *, staged: bool, prox_coef: float) -> StageOutput:
    """The rule for ``stage_output = name``.  Without stages (``staged=False``) every rule is
    :class:`Last` (no stage ever ends); the reference rules without a prox term (``prox_coef = 0``)
    keep no reference (``"last_local_average_ref"`` is then :class:`Last`).

    Example:
        >>> [type(stage_output_rule(n, staged=True, prox_coef=0.0)).__name__ for n in STAGE_OUTPUTS]
        ['Average', 'RandomIterate', 'Last', 'Last', 'LastGlobalAverageRef']
    """
    if not staged or name == "last" or (name == "last_local_average_ref" and prox_coef <= 0):
        return Last()
    if name == "average":
        return Average()
    if name == "random":
        return RandomIterate()
    if name == "last_local_average_ref":
        return LastLocalAverageRef()
    if name == "last_global_average_ref":
        return LastGlobalAverageRef(server_ref=prox_coef > 0)
    raise FedriskError(f"unknown stage_output {name!r}; allowed: {', '.join(STAGE_OUTPUTS)}")
