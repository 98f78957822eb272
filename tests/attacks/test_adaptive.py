"""Adaptive attacks: forged replies against each defence by hand, the line search's budget and
optimality, Mimic's choice, NaN / inf handling, the breakdown check, bad input, a short FRPG run."""

from __future__ import annotations

import pytest
import torch

from fedrisk.aggregators import CenteredClipping, InMemoryReplies, Krum, StaticClipping, TrimmedMean
from fedrisk.aggregators.robust import coordinate_median
from fedrisk.algorithms import FRPG, RobustSGD
from fedrisk.algorithms.base import FedInfo, RoundContext
from fedrisk.attacks import ATTACKS, IPM, MaxNorm, Mimic, NonFiniteAttack, OptALIE, OptIPM, line_maximize
from fedrisk.attacks.defence import Defence, defence_from_spec, defence_of
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.executor import ClientFailure
from fedrisk.runtime.simulation import Simulation

D = torch.float64
CTX = RoundContext(3, FedInfo(6, (1,) * 6, 2))


def honest_rows(n: int = 4, d: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=D) + 1.0


def replies_of(rows: torch.Tensor, byz: int = 2) -> InMemoryReplies:
    """Honest rows for clients 0..h-1, then ``byz`` Byzantine clients (their own rows: zeros), plus an int leaf."""
    h = rows.shape[0]
    out = {k: {"g": {"w": rows[k].clone()}, "n": torch.tensor(k)} for k in range(h)}
    out.update({h + i: {"g": {"w": torch.zeros_like(rows[0])}, "n": torch.tensor(h + i)} for i in range(byz)})
    return InMemoryReplies(out)


def forge(attack, rows: torch.Tensor, byz: int = 2) -> torch.Tensor:
    h = rows.shape[0]
    out = attack.apply(CTX, replies_of(rows, byz), list(range(h, h + byz)), torch.Generator().manual_seed(0)).as_dict()
    for k in range(h):
        assert torch.equal(out[k]["g"]["w"], rows[k])  # honest replies untouched
    assert [int(out[k]["n"]) for k in out] == list(range(h + byz))  # integer leaves kept
    return torch.stack([out[h + i]["g"]["w"] for i in range(byz)])


# ----------------------------------------------------------------------------- max_norm
def test_max_norm_sends_the_defence_bound_along_minus_the_honest_mean() -> None:
    rows = honest_rows()
    mu = rows.mean(dim=0)
    unit = mu / torch.linalg.vector_norm(mu)
    frpg = forge(MaxNorm(defence={"name": "frpg", "lam": 1.6}), rows)
    assert torch.allclose(frpg, (-1.6 * unit).expand(2, -1))
    clip = forge(MaxNorm(defence={"name": "static_clipping", "tau": 0.3}), rows)
    assert torch.allclose(clip[0], -0.3 * unit)
    cc = forge(MaxNorm(defence={"name": "centered_clipping", "tau": 0.5}), rows)  # from the honest median
    assert torch.allclose(cc[0], coordinate_median(rows) - 0.5 * unit)
    fixed = forge(MaxNorm(norm=7.0, defence="median"), rows)
    assert torch.allclose(fixed[1], -7.0 * unit)


def test_max_norm_against_arc_uses_the_clipping_norm() -> None:
    rows = honest_rows(8)
    # n = 10, f = 2: k = floor(2 * 2 * 8 / 10) = 3 rows clipped; two forged rows among them leave the
    # (k + 1)-th largest norm overall = the 2nd largest honest norm
    out = forge(MaxNorm(defence={"name": "trimmed_mean", "f": 2, "pre": "arc"}), rows)
    second = torch.linalg.vector_norm(rows, dim=1).sort(descending=True).values[1]
    assert float(torch.linalg.vector_norm(out[0])) == pytest.approx(float(second))


def test_max_norm_without_a_bound_is_refused_or_line_searched() -> None:
    with pytest.raises(FedriskError, match=r"admits replies of any norm.*unbounded = 'line_search'"):
        forge(MaxNorm(defence="median", unbounded="error"), honest_rows())
    rows = honest_rows()
    searched = forge(MaxNorm(defence="median", evaluations=12), rows)
    assert torch.equal(searched, forge(OptIPM(evaluations=12, defence="median"), rows))
    with pytest.raises(FedriskError, match="unbounded = 'x' is not allowed"):
        MaxNorm(unbounded="x")
    with pytest.raises(FedriskError, match="needs the server's defence"):
        forge(MaxNorm(), honest_rows())  # "auto" outside a Simulation


# ----------------------------------------------------------------------------- the line search
def test_line_maximize_budget_and_optimum() -> None:
    calls: list[float] = []

    def fn(t: float) -> float:
        calls.append(t)
        return -((t - 5.3) ** 2)

    for evaluations in (3, 7, 16, 20):
        calls.clear()
        t, v = line_maximize(fn, 0.0, 64.0, evaluations)
        assert len(calls) == evaluations and all(0 <= c <= 64 for c in calls)
        assert v == max(fn(c) for c in list(calls))
    calls.clear()
    t, _ = line_maximize(fn, 0.0, 64.0, 20)
    assert abs(t - 5.3) < 0.2
    for low, high in ((1.0, 1.0), (2.0, 1.0), (-1.0, 1.0), (0.0, float("inf"))):
        with pytest.raises(FedriskError, match=r"range \[low, high\].*needs 0 <= low < high"):
            line_maximize(fn, low, high)
    with pytest.raises(FedriskError, match=r"evaluations = 21 .*\[3, 20\]"):
        line_maximize(fn, 0.0, 1.0, 21)


class _Counting:
    def __init__(self, inner: Defence) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self, x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        self.calls += 1
        return self.inner.aggregate(x, gen)


@pytest.mark.parametrize("cls", [OptIPM, OptALIE])
@pytest.mark.parametrize("spec", ["median", {"name": "krum", "f": 2}, {"name": "frpg", "lam": 1.0}, "mean"])
def test_opt_attacks_spend_at_most_20_evaluations_and_beat_the_fixed_scales(cls, spec) -> None:
    rows = honest_rows(6, 8, seed=1)
    attack = cls(evaluations=20, defence=spec)
    counter = _Counting(attack.defence)
    attack.defence = Defence(attack.defence.name, counter, attack.defence.radius, attack.defence.centre)
    forged = forge(attack, rows)
    assert counter.calls == 20
    # independently: the distance of the aggregate from mu_h at the chosen scale and at fixed scales
    agg = defence_from_spec(spec).aggregate
    mu = rows.mean(dim=0)

    def distance(row: torch.Tensor) -> float:
        return float(torch.linalg.vector_norm(agg(torch.cat([rows, row.expand(2, -1)]), None) - mu))

    std = rows.std(dim=0)
    fixed = [(-e * mu) if cls is OptIPM else (mu - e * std) for e in (0.1, 0.5, 1.0, 2.0)]
    assert distance(forged[0]) >= max(distance(r) for r in fixed) - 1e-9
    assert attack.last_scale is not None and 0 <= attack.last_scale <= 64


def test_opt_ipm_against_the_mean_takes_the_top_of_the_range() -> None:
    rows = honest_rows()
    out = forge(OptIPM(high=10.0, defence="mean"), rows)
    assert torch.allclose(out[0], -10.0 * rows.mean(dim=0))


# ----------------------------------------------------------------------------- mimic
def test_mimic_copies_the_honest_reply_with_the_largest_principal_component() -> None:
    rows = honest_rows(7, 6, seed=2)
    rows[4] += torch.tensor([4.0, -3.0, 0.0, 0.0, 1.0, 0.0], dtype=D)  # the heterogeneous worker
    out = forge(Mimic(), rows)
    dev = rows - rows.mean(dim=0)
    top = torch.linalg.svd(dev, full_matrices=False).Vh[0]  # independent: SVD instead of the Gram eigh
    chosen = int(torch.argmax((dev @ top).abs()))
    assert chosen == 4
    assert torch.equal(out[0], rows[chosen]) and torch.equal(out[1], rows[chosen])


# ----------------------------------------------------------------------------- NaN / inf
def test_nonfinite_replies_are_excluded_or_named() -> None:
    rows = honest_rows(5)
    for value in ("nan", "inf", "-inf"):
        r = NonFiniteAttack(value).apply(CTX, replies_of(rows), [5, 6], torch.Generator())
        with pytest.raises(FedriskError, match=r"clients \[5, 6\] contain NaN/inf"):
            Krum(f=2)(r, "g")
        kept = TrimmedMean(f=1, nonfinite="exclude")(r, "g")["w"]
        assert torch.allclose(kept, TrimmedMean(f=1).rule(rows, 1))
    with pytest.raises(FedriskError, match="value = 'NaN' is not allowed; valid choices: nan, inf, -inf"):
        NonFiniteAttack("NaN")


def test_nonfinite_replies_through_a_plain_sum_stop_the_run_naming_the_byzantine_clients() -> None:
    alg = RobustSGD(model=_model(), loss=cross_entropy, lr=0.5)
    sim = Simulation(alg, _federation(), dtype=D, attack=NonFiniteAttack("inf"), byzantine=[6, 7])
    with pytest.raises(ClientFailure, match=r"Byzantine clients \[6, 7\] sent NaN/inf replies"):
        sim.step()


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_frpg_raises_naming_the_nonfinite_workers_or_excludes_them(value: str) -> None:
    """FRPG's server (algorithm.nonfinite): "raise" names the workers; "exclude" drops their
    messages, which is the run in which they stay silent (each sends g = 0)."""
    sim = Simulation(_frpg(), _federation(), dtype=D, attack=NonFiniteAttack(value), byzantine=[6, 7])
    with pytest.raises(FedriskError, match=r"^frpg: the messages g of workers \[6, 7\] contain NaN/inf \(set algo"):
        sim.step()
    silent = type("Silent", (NonFiniteAttack,), {"forge_leaf": lambda self, own, honest, gen: torch.zeros_like(own)})
    runs = []
    for attack, alg in (
        (NonFiniteAttack(value), FRPG(**{**_frpg().__dict__, "nonfinite": "exclude"})),
        (silent(), _frpg()),
    ):
        sim = Simulation(alg, _federation(), dtype=D, attack=attack, byzantine=[6, 7])
        for _ in range(3):
            sim.step()
        runs.append(sim.server_state["v"])
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-12, atol=1e-14)  # zeros summed in, or not
    weight = runs[0]["linear.weight"]
    assert bool(torch.isfinite(weight).all()) and float(weight.abs().sum()) > 0


# ----------------------------------------------------------------------------- defence, breakdown, bad input
def test_defence_is_read_from_the_algorithm() -> None:
    assert defence_of(_frpg()).radius(honest_rows(), 2) == 1.6
    sgd = RobustSGD(model=_model(), loss=cross_entropy, aggregator=StaticClipping(tau=0.25))
    assert defence_of(sgd).radius(honest_rows(), 2) == 0.25
    cc = RobustSGD(model=_model(), loss=cross_entropy, aggregator=CenteredClipping(tau=2.0))
    assert defence_of(cc).centre is coordinate_median
    with pytest.raises(FedriskError, match="cannot tell how algorithm 'x' aggregates"):
        defence_of(type("Alg", (), {"name": "x"})())


def test_fraction_above_the_breakdown_point_is_refused_before_round_0() -> None:
    krum = RobustSGD(model=_model(), loss=cross_entropy, aggregator=Krum(f=1))
    msg = r"2 of 8 clients are Byzantine, above what Krum\(f=1.*tolerates \(1: it was"
    with pytest.raises(FedriskError, match=msg):
        Simulation(krum, _federation(), dtype=D, attack=IPM(), byzantine=[6, 7])
    median = RobustSGD(model=_model(), loss=cross_entropy, aggregator=defence_and_agg("median"))
    with pytest.raises(FedriskError, match=r"4 of 8 clients .* \(3: its breakdown point is 1/2"):
        Simulation(median, _federation(), dtype=D, attack=OptIPM(), byzantine=[4, 5, 6, 7])
    Simulation(_frpg(), _federation(), dtype=D, attack=MaxNorm(), byzantine=[2, 3, 4, 5, 6, 7])  # no count claim


def test_an_omniscient_attack_without_honest_replies_names_the_round() -> None:
    rows = honest_rows(2)
    for attack in (MaxNorm(norm=1.0), Mimic(), OptIPM(defence="mean")):
        with pytest.raises(FedriskError, match="needs the honest replies of the round; round 3 has none"):
            attack.apply(CTX, InMemoryReplies({0: {"g": rows[0]}, 1: {"g": rows[1]}}), [0, 1], torch.Generator())


@pytest.mark.parametrize(
    ("cls", "kw", "match"),
    [
        (OptIPM, {"low": 5.0, "high": 5.0}, r"opt_ipm: the line-search range \[low, high\] = \[5, 5\] is empty"),
        (OptALIE, {"low": -1.0}, r"opt_alie: the line-search range .* is empty"),
        (OptIPM, {"evaluations": 25}, r"evaluations = 25 is not allowed; .*\[3, 20\]"),
        (MaxNorm, {"norm": -1.0}, "norm = -1.0 is not allowed"),
        (MaxNorm, {"defence": "nope"}, "unknown aggregator|nope"),
        (MaxNorm, {"defence": {"name": "frpg", "tau": 1}}, "unknown options"),
    ],
)
def test_bad_options(cls, kw, match) -> None:
    with pytest.raises(FedriskError, match=match):
        cls(**kw)


def test_registry_and_config_with_a_defence_table() -> None:
    assert {"max_norm", "opt_ipm", "opt_alie", "mimic", "nonfinite"} <= set(ATTACKS.names())
    from fedrisk.experiment.config import resolve_config
    from fedrisk.experiment.runner import build_simulation

    raw = {"data": {"dataset": "wine", "num_clients": 6}, "model": {"name": "logreg"}}
    attack = {"name": "opt_ipm", "num_byzantine": 1, "evaluations": 8, "defence": {"name": "krum", "f": 1}}
    sim = build_simulation(resolve_config({**raw, "attack": attack})).simulation
    assert sim.attack.evaluations == 8 and sim.attack.defence.name.startswith("Krum(f=1")
    sim.step()


# ----------------------------------------------------------------------------- helpers
FEATURES, CLASSES = 6, 3


def defence_and_agg(name: str):
    from fedrisk.aggregators import AGGREGATORS

    return AGGREGATORS.get(name)()


def _model() -> FunctionalModel:
    return FunctionalModel(build_model("logreg", (FEATURES,), CLASSES))


def _frpg() -> FRPG:
    return FRPG(model=_model(), loss=cross_entropy, lipschitz=10.0)


def _federation(num_clients: int = 8, n: int = 30) -> Federation:
    g = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(CLASSES, FEATURES, generator=g, dtype=D)

    def samples(c: int, m: int) -> Samples:
        y = torch.full((m,), c) if c >= 0 else torch.randint(0, CLASSES, (m,), generator=g)
        return Samples(centres[y] + torch.randn(m, FEATURES, generator=g, dtype=D), y)

    clients = [samples(k * CLASSES // num_clients, n) for k in range(num_clients)]
    return Federation("blobs", clients, num_classes=CLASSES, test=samples(-1, 300))


def _run(alg, attack, byz, rounds: int) -> Simulation:
    sim = Simulation(alg, _federation(), dtype=D, attack=attack, byzantine=byz)
    for _ in range(rounds):
        sim.step()
    return sim


def _accuracy(sim: Simulation) -> float:
    test = sim.federation.test
    logits = sim.algorithm.predict(sim.algorithm.global_params(sim.server_state), test.x)
    return float((logits.argmax(1) == test.y).double().mean())
