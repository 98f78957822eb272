"""Executors and the simulation state machine."""

from fedrisk.registry import Registry
from fedrisk.runtime.distributed import DistributedExecutor
from fedrisk.runtime.executor import ClientFailure, Executor, RoundOutput, SequentialExecutor
from fedrisk.runtime.ledger import CommLedger
from fedrisk.runtime.vectorized import VectorizedExecutor

EXECUTORS: Registry = Registry("executor")
EXECUTORS.add("sequential", SequentialExecutor, "clients one after another in one process (the reference)")
EXECUTORS.add("vectorized", VectorizedExecutor, "blocks of clients at once with torch.func.vmap (many small clients)")
EXECUTORS.add("distributed", DistributedExecutor, "SPMD processes under torchrun (gloo / NCCL), clients split by rank")

__all__ = ["EXECUTORS", "ClientFailure", "CommLedger", "Executor", "RoundOutput", "SequentialExecutor"]
