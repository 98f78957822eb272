"""Byzantine attacks on replies.

An attack sits between the clients' replies and the server's aggregation.  It sees every
reply (omniscient attacks such as ALIE or IPM use the honest ones) and returns the replies the
server receives, with the Byzantine clients' entries replaced.  A data attack (label flipping)
instead changes the Byzantine clients' training data once, before the run (:meth:`Attack.poison`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import RoundContext


class Attack:
    """Base class: ``apply`` returns the replies the server sees."""

    name: str = "attack"

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        raise NotImplementedError

    def prepare(self, algorithm: Any, info: Any, byzantine: Sequence[int]) -> None:
        """Called once by the Simulation before round 0 with the algorithm, its
        :class:`~fedrisk.algorithms.base.FedInfo` and the Byzantine ids.

        The default refuses more Byzantine clients than the algorithm's aggregator claims to
        tolerate (:func:`fedrisk.attacks.defence.check_breakdown`: a Krum or trimmed mean
        configured for ``f`` faulty replies, or a rule with breakdown point 1/2); adaptive
        attacks also read the defence here.  Algorithms whose aggregation cannot be modelled are
        not checked.
        """
        from fedrisk.attacks.defence import check_breakdown, defence_of
        from fedrisk.errors import FedriskError

        defence = getattr(self, "defence", None)
        if defence is None:
            try:
                defence = defence_of(algorithm)
            except FedriskError:
                return
        check_breakdown(defence, int(info.num_clients), byzantine)

    def poison(self, federation: Any, byzantine: Sequence[int]) -> Any:
        """The federation the run trains on (default: unchanged; data attacks override it)."""
        return federation
