"""Payload / reply encoding into Flower records, on loopback: through Flower's own protobuf
serialisation and back, bit for bit, without a network."""

from __future__ import annotations

import math

import pytest
import torch

from fedrisk.errors import FedriskError

pytest.importorskip("flwr", reason="the flower extra (scripts/setup.sh installs it)")

from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from fedrisk.deploy.records import CARRIED_DTYPES, Meta, decode, encode, message_type


def over_the_wire(content):
    """What the other side reads: Flower's protobuf of the RecordDict, serialised to bytes and parsed."""
    data = recorddict_to_proto(content).SerializeToString()
    proto = ProtoRecordDict()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto)


def same(a, b) -> bool:
    """Bit-identical trees (tensors: dtype, shape and bytes; NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if a.dtype == torch.bool:
            return a.equal(b)
        return a.contiguous().reshape(-1).view(torch.uint8).equal(b.contiguous().reshape(-1).view(torch.uint8))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def test_every_carried_dtype_and_tree_shape_round_trips_bit_exactly():
    g = torch.Generator().manual_seed(0)
    tree = {
        "params": {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g, dtype=torch.float64)},
        "cv": [torch.randn(2, generator=g).to(dtype) for dtype in CARRIED_DTYPES if dtype.is_floating_point],
        "ints": (torch.tensor([1, -2, 3], dtype=torch.int64), torch.tensor([True, False]), torch.tensor(7)),
        "other": [torch.arange(6, dtype=torch.int8), torch.arange(3, dtype=torch.uint8), torch.ones(2, 0)],
        "complex": torch.randn(2, generator=g, dtype=torch.complex64),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
        "nan": torch.tensor([math.nan, math.inf, -0.0]),
        "alpha": 0.1 + 0.2,
        "special": [math.nan, -math.inf, None, True, 3, "x"],
        "empty": {},
    }
    sent = Meta(round=5, client=2, seed=11, kind="estimation", experiment="ab")
    back, meta = decode(over_the_wire(encode(tree, sent)))
    assert same(tree, back)
    assert meta == sent
    back["params"]["w"].add_(1.0)  # decoded tensors are writable copies
    assert not torch.equal(back["params"]["w"], tree["params"]["w"])


def test_a_real_server_state_round_trips(tmp_path):
    from fedrisk.experiment import resolve_config
    from fedrisk.experiment.runner import build_simulation

    cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 3}, "algorithm": {"name": "scaffold"}})
    sim = build_simulation(cfg).simulation
    for tree in (sim.server_state, sim.client_states[1], sim.algorithm.global_params(sim.server_state)):
        back, _ = decode(over_the_wire(encode(tree, Meta(round=0, client=1, seed=0))))
        assert same(tree, back)


def test_bfloat16_and_foreign_leaves_give_clear_errors():
    tree = {"params": {"w": torch.zeros(2), "b": torch.zeros(2, dtype=torch.bfloat16)}}
    with pytest.raises(FedriskError, match=r"\['params'\]\['b'\] has dtype bfloat16.*allowed: float16, float32"):
        encode(tree, Meta(round=1, client=0, seed=0))
    with pytest.raises(FedriskError, match=r"<root> has dtype bfloat16"):
        encode(torch.zeros(1, dtype=torch.bfloat16), Meta(round=1, client=0, seed=0))
    with pytest.raises(FedriskError, match=r"\['rng'\] is a Generator; allowed: tensors"):
        encode({"rng": torch.Generator()}, Meta(round=1, client=0, seed=0))


def test_foreign_content_and_bad_message_types_are_refused():
    from flwr.app import ConfigRecord, RecordDict

    with pytest.raises(FedriskError, match=r"not a fedrisk payload: it lacks fedrisk\.arrays, fedrisk\.tree"):
        decode(RecordDict({"fedrisk.meta": ConfigRecord({"round": 1})}))
    assert message_type("estimation") == "train.estimation"
    with pytest.raises(FedriskError, match="not one of Flower's; allowed: train, evaluate, query"):
        message_type(base="fit")
    with pytest.raises(FedriskError, match="cannot name a Flower action"):
        message_type("a.b")
