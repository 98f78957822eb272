"""Executors and the simulation state machine."""

from fedrisk.registry import Registry
from fedrisk.runtime.executor import ClientFailure, Executor, RoundOutput, SequentialExecutor
from fedrisk.runtime.ledger import CommLedger

EXECUTORS: Registry = Registry("executor")
EXECUTORS.add("sequential", SequentialExecutor, "clients one after another in one process (the reference)")

__all__ = ["EXECUTORS", "ClientFailure", "CommLedger", "Executor", "RoundOutput", "SequentialExecutor"]
