"""The standard attacks: pinned forged replies, randomness, data poisoning, registry and bad input."""

import re
from statistics import NormalDist

import pytest
import torch

from fedrisk.aggregators import InMemoryReplies
from fedrisk.algorithms.base import FedInfo, RoundContext
from fedrisk.attacks import ALIE, ATTACKS, IPM, GaussianAttack, SameValueAttack, SignFlipAttack, ZeroAttack, alie_z
from fedrisk.attacks.standard import ReplyAttack
from fedrisk.errors import FedriskError
from fedrisk.rng import server_generator

CTX = RoundContext(0, FedInfo(5, (1,) * 5, 2))


def replies() -> InMemoryReplies:
    """Five clients; each reply has a float model tree and an integer leaf (kept as is)."""
    return InMemoryReplies({k: {"p": {"w": torch.tensor([float(k), 2.0 * k])}, "n": torch.tensor(k)} for k in range(5)})


def forged(attack, byz=(3, 4), gen=None) -> dict:
    out = attack.apply(CTX, replies(), list(byz), gen or torch.Generator().manual_seed(0)).as_dict()
    for k in range(5):
        if k not in byz:  # honest replies are untouched
            assert out[k]["p"]["w"].tolist() == [float(k), 2.0 * k]
        assert int(out[k]["n"]) == k  # non-floating leaves are kept
    return out


def test_pinned_forgeries() -> None:
    out = forged(IPM(epsilon=0.5))
    assert out[3]["p"]["w"].tolist() == [-0.5, -1.0] == out[4]["p"]["w"].tolist()  # -0.5 * mean(0, 1, 2)
    assert forged(SignFlipAttack(2.0))[3]["p"]["w"].tolist() == [-6.0, -12.0]
    assert forged(ZeroAttack())[4]["p"]["w"].tolist() == [0.0, 0.0]
    assert forged(SameValueAttack(7.0))[4]["p"]["w"].tolist() == [7.0, 7.0]
    # ALIE: mean - z std over the honest 0, 1, 2 (std with Bessel: 1 and 2)
    assert forged(ALIE(z=1.5))[3]["p"]["w"].tolist() == pytest.approx([1.0 - 1.5, 2.0 - 3.0])
    z = alie_z(5, 2)
    assert forged(ALIE())[3]["p"]["w"].tolist() == pytest.approx([1.0 - z, 2.0 - 2 * z])


def test_alie_z_matches_baruch_et_al() -> None:
    assert alie_z(20, 4) == pytest.approx(0.38532, abs=1e-4)  # s = 7, Phi^-1(13/20)
    assert alie_z(50, 24) == pytest.approx(1.75069, abs=1e-4)  # s = 2, Phi^-1(48/50)
    with pytest.raises(FedriskError, match="0 < f < n"):
        alie_z(5, 0)


def test_alie_z_at_odd_n_the_bounds_of_f_and_a_majority_of_byzantines() -> None:
    # pinned by mutation testing (frpg scope): an odd n, where floor(n/2 + 1) and n/2 + 1 differ
    assert alie_z(21, 4) == pytest.approx(NormalDist().inv_cdf(14 / 21), abs=1e-9)  # s = 11 - 4 = 7
    assert alie_z(5, 1) == pytest.approx(NormalDist().inv_cdf(3 / 5), abs=1e-9)  # f = 1 is allowed
    with pytest.raises(FedriskError, match="0 < f < n"):
        alie_z(5, 5)
    # f > n/2 + 1 gives s < 0 and (n - s)/n > 1: clamped just below 1, a finite z
    assert alie_z(10, 8) == pytest.approx(NormalDist().inv_cdf(1 - 1e-6), abs=1e-9)


def test_gaussian_is_scaled_and_redrawn_every_round() -> None:
    a = forged(GaussianAttack(1e4), gen=server_generator(0, 0, "attack"))
    b = forged(GaussianAttack(1e4), gen=server_generator(0, 1, "attack"))
    again = forged(GaussianAttack(1e4), gen=server_generator(0, 0, "attack"))
    assert not torch.equal(a[3]["p"]["w"], b[3]["p"]["w"])
    assert not torch.equal(a[3]["p"]["w"], a[4]["p"]["w"])  # per client
    assert torch.equal(a[3]["p"]["w"], again[3]["p"]["w"])  # reproducible from the round's generator
    big = GaussianAttack(1e4).forge_leaf(torch.zeros(10000), None, torch.Generator().manual_seed(1))
    assert float(big.std()) == pytest.approx(1e4, rel=0.05)


def test_omniscient_attack_needs_an_honest_reply() -> None:
    with pytest.raises(FedriskError, match="honest"):
        IPM().apply(CTX, replies(), [0, 1, 2, 3, 4], torch.Generator())


@pytest.mark.parametrize(
    ("cls", "kw", "message"),
    [
        (GaussianAttack, {"scale": 0.0}, "gaussian: scale = 0.0 is not allowed; it must be a finite number > 0"),
        (
            GaussianAttack,
            {"scale": float("inf")},
            "gaussian: scale = inf is not allowed; it must be a finite number > 0",
        ),
        (SignFlipAttack, {"scale": -1.0}, "sign_flip: scale = -1.0 is not allowed; it must be a finite number > 0"),
        (IPM, {"epsilon": 0.0}, "ipm: epsilon = 0.0 is not allowed; it must be a finite number > 0"),
        (IPM, {"epsilon": True}, "ipm: epsilon = True is not allowed; it must be a finite number > 0"),
        (ALIE, {"z": float("nan")}, "alie: z = nan is not allowed; it must be a finite number"),
        (ALIE, {"z": "1"}, "alie: z = '1' is not allowed; it must be a finite number"),
        (
            SameValueAttack,
            {"value": float("inf")},
            "same_value: value = inf is not allowed; it must be a finite number",
        ),
    ],
)
def test_bad_attack_options(cls, kw, message) -> None:
    # the whole message: the attack, its option and what is allowed (pinned by mutation testing, frpg scope)
    with pytest.raises(FedriskError, match=f"^{re.escape(message)}$"):
        cls(**kw)


def test_attack_defaults_are_the_papers() -> None:
    # paper 002's Gaussian scale 1e4; a plain sign flip; IPM's epsilon 0.1 (Xie et al.); RSA's same value 100;
    # ALIE's z = 0 meaning Baruch et al.'s z_max, and a given z used from the start (before any apply)
    assert GaussianAttack().scale == 1e4 and SignFlipAttack().scale == 1.0
    assert IPM().epsilon == 0.1 and SameValueAttack().value == 100.0 and ALIE().z == 0.0
    honest = torch.tensor([[0.0], [2.0]])
    assert ALIE(z=2.0).forge_leaf(torch.zeros(1), honest, torch.Generator()).tolist() == pytest.approx([1 - 2 * 2**0.5])


def test_registry_and_config() -> None:
    assert set(ATTACKS.names()) >= {"gaussian", "sign_flip", "alie", "ipm", "zero", "same_value", "label_flip"}
    from fedrisk.experiment.config import resolve_config

    raw = {"data": {"dataset": "wine", "num_clients": 6}, "model": {"name": "logreg"}}
    cfg = resolve_config({**raw, "attack": {"name": "gaussian", "scale": 1e8, "num_byzantine": 2}})
    assert cfg["attack.scale"] == 1e8
    with pytest.raises(FedriskError, match="scale"):
        from fedrisk.experiment.runner import build_simulation

        build_simulation(resolve_config({**raw, "attack": {"name": "gaussian", "scale": -1.0, "num_byzantine": 2}}))


def test_alie_with_two_honest_replies_and_with_one() -> None:
    # pinned by mutation testing (frpg scope): the one-honest-reply rule (std 0) and its threshold
    two = forged(ALIE(z=1.0), byz=(2, 3, 4))  # honest 0 and 1: mean (0.5, 1), Bessel std (0.7071, 1.4142)
    assert two[2]["p"]["w"].tolist() == pytest.approx([0.5 - 0.5**0.5, 1.0 - 2**0.5])
    one = forged(ALIE(z=1.0), byz=(1, 2, 3, 4))  # honest 0 alone: std 0, the forgery is its value
    assert one[1]["p"]["w"].tolist() == [0.0, 0.0]


def test_gaussian_forgery_keeps_the_reply_dtype() -> None:
    # pinned by mutation testing (frpg scope): the cast to the reply's dtype
    floats = InMemoryReplies({k: {"w": torch.tensor([float(k)], dtype=torch.float32)} for k in range(3)})
    out = GaussianAttack(1.0).apply(CTX, floats, [2], torch.Generator().manual_seed(0)).as_dict()
    assert out[2]["w"].dtype == torch.float32  # the noise is drawn in float64


class _Nudge(ReplyAttack):
    """A custom omniscient attack: its own leaf, plus the honest mean, plus noise from the round's generator."""

    name = "nudge"
    omniscient = True

    def forge_leaf(self, own, honest, gen):
        return own + honest.mean(dim=0) + torch.rand(own.shape, generator=gen, dtype=own.dtype)


def test_reply_attack_contract_for_a_custom_omniscient_attack() -> None:
    """``forge_leaf`` gets the Byzantine client's own leaf, the honest leaves stacked and the
    round's generator; integer leaves inside a forged tree (a batch-norm step counter) are kept
    (pinned by mutation testing, frpg scope)."""
    tree = {k: {"p": {"w": torch.tensor([float(k), 1.0]), "steps": torch.tensor(10 + k)}} for k in range(4)}
    out = _Nudge().apply(CTX, InMemoryReplies(tree), [3], torch.Generator().manual_seed(5)).as_dict()
    noise = torch.rand(2, generator=torch.Generator().manual_seed(5))
    assert out[3]["p"]["w"].tolist() == pytest.approx(
        (torch.tensor([3.0, 1.0]) + torch.tensor([1.0, 1.0]) + noise).tolist()
    )
    assert int(out[3]["p"]["steps"]) == 13 and out[3]["p"]["steps"].dtype == torch.int64


def test_a_non_omniscient_attack_runs_with_every_client_byzantine() -> None:
    out = SignFlipAttack(2.0).apply(CTX, replies(), [0, 1, 2, 3, 4], torch.Generator()).as_dict()
    assert [out[k]["p"]["w"].tolist() for k in range(5)] == [[-2.0 * k, -4.0 * k] for k in range(5)]
