"""The communication ledger: bytes sent down (server -> client) and up (client -> server).

Counted from the actual payload and reply tensors of every client in every round.

Example:
    >>> led = CommLedger()
    >>> led.record(0, down={0: 40, 1: 40}, up={0: 40, 1: 44})
    >>> led.total_down, led.total_up, led.per_client_up
    (80, 84, {0: 40, 1: 44})
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommLedger:
    rounds: list[dict[str, Any]] = field(default_factory=list)
    total_down: int = 0
    total_up: int = 0
    per_client_down: dict[int, int] = field(default_factory=dict)
    per_client_up: dict[int, int] = field(default_factory=dict)

    def record(self, round: int, down: Mapping[int, int], up: Mapping[int, int]) -> None:
        self.rounds.append({"round": round, "down": dict(down), "up": dict(up)})
        for k, b in down.items():
            self.total_down += b
            self.per_client_down[k] = self.per_client_down.get(k, 0) + b
        for k, b in up.items():
            self.total_up += b
            self.per_client_up[k] = self.per_client_up.get(k, 0) + b

    @property
    def total(self) -> int:
        return self.total_down + self.total_up

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": [dict(r) for r in self.rounds]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        for r in state["rounds"]:
            self.record(r["round"], r["down"], r["up"])
