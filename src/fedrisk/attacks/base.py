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

    def poison(self, federation: Any, byzantine: Sequence[int]) -> Any:
        """The federation the run trains on (default: unchanged; data attacks override it)."""
        return federation
