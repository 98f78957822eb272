"""The node-side setup cache (:mod:`fedrisk.deploy.node`): built once per node and config, then
loaded without the dataset; only the node's own partition is kept; a changed config or a damaged
file does not reuse it; the loaded setup computes the built one's reply bit for bit."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra (scripts/setup.sh installs it)")

import fedrisk.experiment.assemble as assemble
from fedrisk.algorithms.base import RoundContext
from fedrisk.deploy.handshake import fingerprint
from fedrisk.deploy.node import node_round, node_setup, setup_path
from fedrisk.deploy.records import Meta, decode, encode
from fedrisk.errors import FedriskError
from fedrisk.experiment import resolve_config
from fedrisk.experiment.assemble import build_simulation
from fedrisk.rng import server_generator

from .test_records import same


def config(**algorithm):
    raw = {"data": {"dataset": "digits", "num_clients": 3}, "model": {"name": "logreg"},
           "algorithm": {"name": "scaffold", "local_steps": 2, **algorithm}, "run": {"seed": 3}}  # fmt: skip
    return resolve_config(raw)


def no_build(*args, **kwargs):
    raise AssertionError("the node rebuilt the federation")


def test_the_setup_is_built_once_then_loaded_without_the_dataset(tmp_path, monkeypatch):
    cfg = config()
    sim = build_simulation(cfg).simulation
    first = node_setup(cfg, 2, tmp_path)
    monkeypatch.setattr(assemble, "build_simulation", no_build)
    again = node_setup(cfg, 2, tmp_path)
    assert first.built and not again.built
    assert again.info == sim.info == first.info
    for got in (first, again):
        assert same(got.initial_state, sim.client_states[2])
        assert torch.equal(got.data.x, sim.data[2].x) and torch.equal(got.data.y, sim.data[2].y)
        assert int(got.data.size) == sim.info.client_sizes[2]  # this client's partition, nothing else
        assert type(got.algorithm) is type(sim.algorithm) and got.algorithm.local_steps == 2
    files = sorted(p.name for p in tmp_path.rglob("*.pt"))
    assert files == ["setup-client-2.pt"]


def test_a_loaded_setup_gives_the_built_setups_reply_bit_for_bit(tmp_path, monkeypatch):
    cfg = config()
    exp = fingerprint(cfg.semantic())
    sim = build_simulation(cfg).simulation
    plan = sim.algorithm.configure(RoundContext(0, sim.info), sim.server_state, server_generator(3, 0, "configure"))
    content = encode(plan.payload(1), Meta(0, 1, 3, plan.kind, exp))
    node = {"partition-id": 1, "num-partitions": 3}
    built = node_round(cfg, content, {**node, "state-dir": str(tmp_path / "a")})  # builds the setup
    node_setup(cfg, 1, tmp_path / "b")
    monkeypatch.setattr(assemble, "build_simulation", no_build)
    loaded = node_round(cfg, content, {**node, "state-dir": str(tmp_path / "b")})  # loads it
    assert same(decode(built)[0], decode(loaded)[0])


def test_another_config_or_a_damaged_file_is_not_reused(tmp_path):
    cfg, other = config(), config(lr=0.05)
    node_setup(cfg, 0, tmp_path)
    assert node_setup(other, 0, tmp_path).built  # another fingerprint: another file
    path = setup_path(tmp_path, fingerprint(cfg.semantic()), 0)
    assert path != setup_path(tmp_path, fingerprint(other.semantic()), 0)
    path.write_bytes(b"garbage")
    for prev in path.parent.glob("*.prev"):
        prev.unlink()
    with pytest.warns(UserWarning, match="building the setup again"):
        assert node_setup(cfg, 0, tmp_path).built
    assert not node_setup(cfg, 0, tmp_path).built


def test_bad_client_ids_and_unwritable_stores_are_clear_errors(tmp_path):
    cfg = config()
    with pytest.raises(FedriskError, match=r"client 3 is out of range; allowed: 0 \.\. 2"):
        node_setup(cfg, 3, tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(FedriskError, match=r"cannot keep client 0's setup.*--state-dir"):
        node_setup(cfg, 0, tmp_path / "file")
