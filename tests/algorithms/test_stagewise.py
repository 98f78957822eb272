"""The stagewise frame of CODA+ / CODASCA (``fedrisk.algorithms.stagewise``): the schedule against
a plain transcription of Alg. 1's outer loop, and each stage-output rule's hooks."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from fedrisk.algorithms.stagewise import (
    DUAL_RESET,
    STAGE_END,
    STAGE_OUTPUTS,
    TRAIN,
    Average,
    Last,
    LastGlobalAverageRef,
    LastLocalAverageRef,
    RandomIterate,
    StageSchedule,
    stage_output_rule,
)
from fedrisk.errors import FedriskError


def transcription(lr, window, stage_iters, window_growth, rounds_growth, lr_decay, resets, rounds):
    """Alg. 1's stages written out round by round: (stage, index, steps, lr, kind)."""
    out = []
    stage = 0
    while len(out) < rounds:
        windows = max(1, round(math.ceil(stage_iters / window) * rounds_growth**stage))
        steps = max(1, round(window * window_growth**stage))
        eta = lr / lr_decay**stage
        for r in range(windows):
            out.append((stage, r, steps, eta, STAGE_END if r == windows - 1 else TRAIN))
        for r in range(resets):
            out.append((stage, windows + r, 0, eta, DUAL_RESET))
        stage += 1
    return out[:rounds]


@pytest.mark.parametrize(
    ("window", "stage_iters", "window_growth", "rounds_growth", "resets"),
    [(2, 5, 1.0, 1.0, 0), (3, 7, 2.0, 1.0, 1), (2, 8, 3**0.5, 3**0.5, 0), (1, 3, 1.0, 1.5, 1)],
)
def test_schedule_matches_a_plain_transcription(window, stage_iters, window_growth, rounds_growth, resets) -> None:
    sched = StageSchedule(0.3, window, stage_iters, window_growth, rounds_growth, 3.0, resets)
    want = transcription(0.3, window, stage_iters, window_growth, rounds_growth, 3.0, resets, 40)
    assert [tuple(sched.slot(r)) for r in range(40)] == want
    # T_s = R_s · I_s: the divisor of the stage average
    for s in range(3):
        assert sched.stage_steps(s) == sum(w[2] for w in want if w[0] == s and w[4] != DUAL_RESET)


def test_endless_schedule_and_overflow() -> None:
    endless = StageSchedule(0.1, 3, None)
    assert not endless.staged and endless.slot(1000) == (0, 1000, 3, 0.1, TRAIN)
    with pytest.raises(FedriskError, match="window of stage 60 overflows"):
        StageSchedule(0.1, 2, 4, window_growth=2.0, name="codasca").stage_window(60)


def test_rule_choice() -> None:
    chosen = {
        (name, staged, prox > 0): type(stage_output_rule(name, staged=staged, prox_coef=prox))
        for name, staged, prox in itertools.product(STAGE_OUTPUTS, (True, False), (0.0, 0.002))
    }
    assert all(cls is Last for (name, staged, _), cls in chosen.items() if not staged)
    assert chosen["average", True, True] is Average and chosen["random", True, False] is RandomIterate
    assert chosen["last_local_average_ref", True, True] is LastLocalAverageRef
    assert chosen["last_local_average_ref", True, False] is Last  # no prox term: no reference to move
    assert chosen["last_global_average_ref", True, False] is LastGlobalAverageRef
    with pytest.raises(FedriskError, match="unknown stage_output 'best'"):
        stage_output_rule("best", staged=True, prox_coef=0.0)


def test_random_iterate_outputs_the_server_iterate_of_the_drawn_window() -> None:
    rule, gen = RandomIterate(), torch.Generator().manual_seed(5)
    state: dict = {}
    rule.init_server(state, torch.tensor(0.0), torch.tensor(0.0))
    iterates = []
    for index in range(6):  # one stage of 6 windows; the server iterate after window r is r + 1
        state["v"], state["alpha"] = torch.tensor(index + 1.0), torch.tensor(-(index + 1.0))
        rule.after_round(state, index, 6, gen)
        iterates.append(float(state["v"]))
    pick = int(torch.randint(6, (), generator=torch.Generator().manual_seed(5)))  # the same draw
    new = dict(state)
    rule.end_stage(new, state, None)
    assert float(new["v"]) == iterates[pick] and float(new["alpha"]) == -iterates[pick]


def test_average_rules_send_or_keep_the_sums() -> None:
    running = {"v": torch.tensor([6.0, 12.0]), "alpha": torch.tensor(3.0)}
    reply, state = {}, {}
    LastLocalAverageRef().client_stage_end(running, 6, reply, state)  # the client's own reference
    assert reply == {} and state["ref"].tolist() == [1.0, 2.0]
    reply, state = {}, {}
    Average().client_stage_end(running, 6, reply, state)
    assert reply["iterate_sum"] is running and state == {}
    average = {"v": torch.tensor([1.0, 2.0]), "alpha": torch.tensor(0.5)}
    new: dict = {"v": None, "alpha": None}
    Average().end_stage(new, new, average)
    assert new["v"] is average["v"] and new["alpha"] is average["alpha"]
    with_ref: dict = {}
    LastGlobalAverageRef(server_ref=True).init_server(with_ref, torch.zeros(2), torch.tensor(0.0))
    LastGlobalAverageRef(server_ref=True).end_stage(with_ref, with_ref, average)
    assert with_ref["ref"] is average["v"]
