"""``batched_draw``: one ``draw`` call for a block of clients gives every client's own draws.

For every registered algorithm (built through the experiment layer, as the executor
equivalence tests build them) and the contract toys that declare ``batched_draw = True``, and
for several rounds, the block draw
of all clients, of a sub-block in a scrambled order and of one client must equal, leaf by leaf
and bit for bit, the per-client draws from ``client_generator(seed, round, k)``.

Round kinds other than ``train``: with default hyper-parameters the ``alg/<name>`` cases run
only ``train`` rounds (the AUC family's first stage is 2,000 local steps); the
``alg/codasca/stages-*`` and ``alg/coda/dual-reset`` cases of ``_distributed_cases.py`` cross
stage ends (rounds 1 and 3) and CODA's dual-reset round (round 2) within the ``ROUNDS``
checked here (:func:`test_round_kinds_are_covered`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _distributed_cases as C

from fedrisk.algorithms.base import RoundContext
from fedrisk.rng import client_generator, server_generator
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import Tree

ROUNDS = 4


def _draws_in_blocks(case: C.Case) -> bool:
    """The algorithm's ``batched_draw`` flag (a class attribute; toys are built, they are tiny)."""
    if case.name.startswith("alg/"):
        return C.ALGORITHMS.get(case.name.split("/")[1]).batched_draw
    return case.build()[0].batched_draw


# cases of algorithms that draw client by client are not generated (nothing to compare)
CASES = [c for c in C.cases() if c.name.startswith(("alg/", "toy/")) and not c.skip and _draws_in_blocks(c)]


def _leaves(tree: Tree) -> list[tuple[str, Any]]:
    from torch.utils import _pytree as pytree

    return [(pytree.keystr(path), leaf) for path, leaf in pytree.tree_flatten_with_path(tree)[0]]


def _check_block(sim: Simulation, ctx: RoundContext, block: list[int]) -> None:
    alg, r = sim.algorithm, ctx.round
    sizes = torch.tensor([int(sim.data[k].size) for k in block])
    ids = torch.tensor(block)
    stacked = alg.draw(ctx, ids, sizes, client_generator(sim.seed, r, block))
    for i, k in enumerate(block):
        own = alg.draw(ctx, k, int(sim.data[k].size), client_generator(sim.seed, r, k))
        got, want = _leaves(stacked), _leaves(own)
        assert [p for p, _ in got] == [p for p, _ in want], f"{alg.name}: draw structure differs"
        for (path, a), (_, b) in zip(got, want):
            assert a.shape[0] == len(block), f"{alg.name}: draws{path} lacks the client dimension"
            assert a.dtype == b.dtype and torch.equal(a[i], b), f"{alg.name} round {r}: draws{path} of client {k}"


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_block_draw_equals_client_draws(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    alg, fed, _ = case.build()
    assert alg.batched_draw, alg.name
    sim = Simulation(alg, fed, seed=C.SEED, dtype=torch.float64)
    n = sim.info.num_clients
    for r in range(ROUNDS):
        plan = alg.configure(RoundContext(r, sim.info), sim.server_state, server_generator(sim.seed, r, "configure"))
        ctx = RoundContext(r, sim.info, plan.kind)
        _check_block(sim, ctx, list(range(n)))
        _check_block(sim, ctx, list(dict.fromkeys([n - 1, 0, n // 2])))
        _check_block(sim, ctx, [n - 1])
        sim.step()


def test_some_cases_draw_in_blocks() -> None:
    """The test above is not vacuous: FedAvg, SCAFFOLD and CODASCA draw in blocks."""
    from fedrisk.algorithms import ALGORITHMS

    names = {c.name for c in CASES}
    assert {"alg/fedavg", "alg/scaffold", "alg/codasca", "alg/coda"} <= names
    assert all(ALGORITHMS.get(n).batched_draw for n in ("fedavg", "fedprox", "scaffold", "codasca", "coda"))


def test_round_kinds_are_covered() -> None:
    """The cases above do draw in CODA's dual-reset round and in stage-end rounds."""
    kinds: dict[str, set[str]] = {}
    for name in ("alg/coda/dual-reset", "alg/codasca/stages-reset"):
        alg, fed, _ = next(c for c in CASES if c.name == name).build()
        sim = Simulation(alg, fed, seed=C.SEED, dtype=torch.float64)
        kinds[name] = {sim.step().kind for _ in range(ROUNDS)}
    assert kinds["alg/coda/dual-reset"] == {"train", "stage_end", "dual_reset"}
    assert kinds["alg/codasca/stages-reset"] == {"train", "stage_end"}
