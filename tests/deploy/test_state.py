"""The node-local client-state store: survives a restart, falls back to the previous file, refuses
foreign files and bad ids."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedrisk.deploy.state import ClientStateStore
from fedrisk.errors import FedriskError
from fedrisk.experiment.checkpoint import CheckpointWarning


def test_states_survive_a_restart_per_experiment_and_client(tmp_path):
    store = ClientStateStore(tmp_path)
    cv = {"c_i": {"w": torch.randn(3, 2), "b": torch.randn(2, dtype=torch.float64)}, "n": 5, "pool": [torch.ones(1)]}
    store.save("abc", 1, 3, cv)
    store.save("abc", 2, 3, {"c_i": torch.zeros(1)})
    store.save("other", 1, 9, {"c_i": torch.full((1,), 7.0)})
    again = ClientStateStore(tmp_path)  # a new process after a SuperNode restart
    rnd, state = again.load("abc", 1)
    assert rnd == 3 and state["n"] == 5
    assert torch.equal(state["c_i"]["w"], cv["c_i"]["w"]) and state["c_i"]["b"].dtype == torch.float64
    assert again.load("other", 1)[0] == 9 and again.load("abc", 2)[1]["c_i"].tolist() == [0.0]
    assert again.load("abc", 0) is None


def test_a_damaged_newest_file_falls_back_to_the_previous_round(tmp_path):
    store = ClientStateStore(tmp_path)
    store.save("e", 0, 1, {"v": torch.tensor([1.0])})
    store.save("e", 0, 2, {"v": torch.tensor([2.0])})
    path = store.path("e", 0)
    path.write_bytes(path.read_bytes()[:-7])  # killed mid-write by something other than us
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rnd, state = store.load("e", 0)
    assert rnd == 1 and state["v"].tolist() == [1.0]
    assert any(issubclass(w.category, CheckpointWarning) for w in caught)


def test_foreign_files_and_bad_ids_are_refused(tmp_path):
    store = ClientStateStore(tmp_path)
    store.save("e", 0, 1, {"v": torch.zeros(1)})
    store.path("e", 3).write_bytes(store.path("e", 0).read_bytes())  # client 0's file copied to client 3
    with pytest.raises(FedriskError, match=r"holds the state of client 0 of experiment 'e', not client 3"):
        store.load("e", 3)
    for bad in ("../x", ".hidden", "", "a/b"):
        with pytest.raises(FedriskError, match="cannot name a directory"):
            store.save(bad, 0, 1, {})
    for bad in (-1, True, "2"):
        with pytest.raises(FedriskError, match=r"client id .* is not allowed"):
            store.load("e", bad)
