"""CODA+ / CODASCA second pass (issue 16): the paper's experimental protocol, the correctness
fixes and the paths the first suite left unexercised.

* control variates kept across stages (the paper's experiments and the official code), the
  Alg. 4 restart as an option;
* the server's extrapolated dual projected onto the feasible set (AUCM: α ≥ 0);
* the official code's stage rule: each client's prox reference on its *own* local-iterate
  average (``last_local_average_ref``), the cross-client variant named for what it does;
* ``local_sgda`` applying a dual shift given without a primal one;
* Theorem 1's heterogeneous schedule (``rounds_growth``) and the large-``η̃`` warning;
* the margin projection when active, a growing window in training, weight decay alone, CODA
  keeping α when the pooled batch lacks a class, and a mid-stage resume.

float64 throughout; equalities to 1e-12.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch
from torch import Tensor

import fedrisk
from fedrisk.aggregators.base import InMemoryReplies
from fedrisk.algorithms.base import RoundContext
from fedrisk.algorithms.codasca import CODA, CODASCA, CODAPlus, LargeEffectiveStepWarning
from fedrisk.algorithms.primal_dual import local_sgda
from fedrisk.data.federation import Federation
from fedrisk.errors import FedriskError
from fedrisk.runtime.simulation import fed_info
from fedrisk.tree import tree_flatten_vector, tree_map

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the helpers of the first-pass tests
from test_codasca import F64, flat, max_diff, mlp, sim_of, small_fed

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-12
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "codasca"


KW = {"lr": 0.2, "window": 2, "stage_iters": 4, "batch_size": 8}


# --------------------------------------------------------------------------------------------
# fix 1: the control variates survive the stage boundary (the paper's experiments, the code)
# --------------------------------------------------------------------------------------------


def test_codasca_keeps_the_control_variates_across_stages_by_default() -> None:
    """Default: after a stage's last window c and c^k are the round's values (not zero), and the
    next stage's first window is corrected by them; ``reset_control_variates=True`` restarts
    them at zero (Alg. 4's box), making that window a plain CODA+ window."""
    fed = small_fed()
    assert CODASCA(model=None).reset_control_variates is False
    keep = sim_of(CODASCA(model=mlp(), **KW), fed)
    reset = sim_of(CODASCA(model=mlp(), reset_control_variates=True, **KW), fed)
    plus = sim_of(CODAPlus(model=mlp(), stage_output="random", **KW), fed)
    for _ in range(2):  # stage 0: R = 2 windows
        keep.step(), reset.step(), plus.step()
    assert float(tree_flatten_vector(keep.server_state["c_v"]).abs().max()) > 1e-6
    assert float(keep.client_states[0]["c_alpha"].abs()) > 0
    assert float(tree_flatten_vector(reset.server_state["c_v"]).abs().max()) == 0
    assert torch.equal(flat(keep.server_state), flat(reset.server_state))  # stage 0 is the same
    keep.step(), reset.step()
    assert float((flat(keep.server_state) - flat(reset.server_state)).abs().max()) > 1e-6


def test_shipped_configs_follow_the_papers_protocol() -> None:
    """Every shipped config resolves for every algorithm of its grid, and CODASCA keeps the
    control variates and uses the code's stage rule."""
    from fedrisk.experiment.config import load_config

    paths = sorted(CONFIGS.glob("*.toml"))
    assert paths
    for path in paths:
        raw = tomllib.loads(path.read_text())
        names = raw.get("sweep", {}).get("grid", {}).get("algorithm.name", [raw["algorithm"]["name"]])
        for name in names:
            cfg = load_config(path, [f"algorithm.name={name!r}"])
            if name == "codasca":
                assert cfg["algorithm.reset_control_variates"] is False, path.name
            if name in ("codasca", "codaplus"):
                assert cfg["algorithm.stage_output"] == "last_local_average_ref", path.name


# --------------------------------------------------------------------------------------------
# fix 2: the extrapolated dual is projected
# --------------------------------------------------------------------------------------------


def _aggregate_with_alpha(alg: CODASCA, alpha_prev: float, alpha_mean: float) -> Tensor:
    fed = small_fed()
    sim = sim_of(alg, fed)
    state = {**sim.server_state, "alpha": torch.tensor(alpha_prev, dtype=F64)}
    ctx = RoundContext(0, fed_info(fed))
    plan = alg.configure(ctx, state, torch.Generator())
    replies = {
        k: {
            "v": state["v"],
            "alpha": torch.tensor(alpha_mean, dtype=F64),
            "c_v": tree_map(torch.zeros_like, state["v"]),
            "c_alpha": torch.zeros((), dtype=F64),
        }
        for k in range(fed.num_clients)
    }
    return alg.aggregate(ctx, state, plan, InMemoryReplies(replies), torch.Generator())["alpha"]


def test_extrapolated_dual_is_projected_for_the_margin_loss() -> None:
    """α_prev = 0.5, mean 0, η_g = 1.5: 0.5 + 1.5 (0 − 0.5) = −0.25, projected to 0 (AUCM);
    eq. (2) has no constraint, so −0.25 stays."""
    kw = {"model": mlp(), "global_lr": 1.5, "stage_iters": None}
    assert float(_aggregate_with_alpha(CODASCA(auc_loss="margin", **kw), 0.5, 0.0)) == 0.0
    assert float(_aggregate_with_alpha(CODASCA(auc_loss="square", **kw), 0.5, 0.0)) == pytest.approx(-0.25)
    assert float(_aggregate_with_alpha(CODASCA(auc_loss="margin", **kw), 0.5, 1.0)) == pytest.approx(1.25)


# --------------------------------------------------------------------------------------------
# fix 3: the official code's stage rule (each client's own local-iterate average)
# --------------------------------------------------------------------------------------------


def test_last_local_average_ref_is_each_clients_own_average() -> None:
    """The code's update_regularizer: client k's next prox reference is the average of *its own*
    local iterates over the stage; the iterate continues from the last server iterate.  The
    clients' references differ, and their mean is Alg. 2's cross-client average."""
    fed = small_fed()
    runs = {
        out: sim_of(CODAPlus(model=mlp(), stage_output=out, **KW), fed)
        for out in ("average", "last", "last_local_average_ref", "last_global_average_ref")
    }
    for s in runs.values():
        s.step(), s.step()
    local, avg = runs["last_local_average_ref"], runs["average"].server_state
    assert torch.equal(flat(local.server_state), flat(runs["last"].server_state))
    assert "ref" not in local.server_state  # nothing is re-sent: each client keeps its own
    refs = [local.client_states[k]["ref"] for k in range(fed.num_clients)]
    assert max_diff(refs[0], refs[1]) > 1e-6
    mean_ref = tree_map(lambda *xs: sum(xs) / len(xs), *refs)
    assert max_diff(mean_ref, avg["v"]) < TOL
    # the cross-client variant: every client gets the stage average from the broadcast
    glob = runs["last_global_average_ref"]
    assert max_diff(glob.server_state["ref"], avg["v"]) < TOL
    for s in runs.values():
        s.step()
    assert max_diff(local.client_states[1]["ref"], refs[1]) == 0  # kept through the next stage
    assert max_diff(glob.client_states[1]["ref"], avg["v"]) < TOL
    # the stage's last window: the local rule uploads no iterate sums
    ups = {k: s.step().bytes_up for k, s in runs.items()}
    assert ups["last_local_average_ref"] == ups["last"] < ups["average"] == ups["last_global_average_ref"]


def test_the_old_ambiguous_stage_output_name_is_explained() -> None:
    with pytest.raises(FedriskError, match=r"last_local_average_ref.*last_global_average_ref"):
        CODAPlus(model=None, stage_output="last_average_ref")


# --------------------------------------------------------------------------------------------
# fix 4: local_sgda applies a dual shift given alone
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sum_directions", [False, True])
def test_local_sgda_applies_a_dual_shift_without_a_primal_one(sum_directions: bool) -> None:
    v0, a0 = torch.tensor([1.0, -2.0], dtype=F64), torch.tensor(0.5, dtype=F64)
    g, ga, sa = torch.tensor([0.3, 0.1], dtype=F64), torch.tensor(-0.2, dtype=F64), torch.tensor(0.05, dtype=F64)
    out = local_sgda(
        lambda t, v, a: (v[0].sum(), [g], [ga]), v0, a0, 2, 0.1, shift_alpha=sa, sum_directions=sum_directions
    )
    assert float((out.v - (v0 - 0.2 * g)).abs().max()) < 1e-15
    assert abs(float(out.alpha - (a0 + 0.2 * (ga + sa)))) < 1e-15
    out = local_sgda(lambda t, v, a: (v[0].sum(), [g], [ga]), v0, a0, 1, 0.1, shift_v=-g, sum_directions=sum_directions)
    assert float((out.v - v0).abs().max()) < 1e-15 and abs(float(out.alpha - (a0 + 0.1 * ga))) < 1e-15


# --------------------------------------------------------------------------------------------
# item 5: Theorem 1's heterogeneous schedule, the large-η̃ warning
# --------------------------------------------------------------------------------------------


def test_theorem_one_heterogeneous_schedule() -> None:
    """η_s = η/3^s, I_s ∝ η_s^{-1/2}, T_s = R_s I_s ∝ 1/η_s: window_growth = rounds_growth = √3."""
    g = 3**0.5
    alg = CODAPlus(model=None, lr=0.9, window=4, stage_iters=16, window_growth=g, rounds_growth=g)
    slots = [alg.schedule(r) for r in range(4 + 7 + 12 + 1)]
    stages = [[s for s in slots if s.stage == k] for k in range(3)]
    assert [len(s) for s in stages] == [4, 7, 12]
    assert [s[0].steps for s in stages] == [4, 7, 12]
    assert [s[-1].kind for s in stages] == ["stage_end"] * 3 and slots[-1] == (3, 0, 21, 0.9 / 27, "train")
    for s in stages:
        eta, steps = s[0].lr, len(s) * s[0].steps
        assert steps * eta == pytest.approx(16 * 0.9, rel=0.15)  # T_s ∝ 1/η_s
        assert s[0].steps * eta**0.5 == pytest.approx(4 * 0.9**0.5, rel=0.1)  # I_s ∝ η_s^{-1/2}
    # with CODA's extra round per stage, and the same walk for a fixed R
    coda = CODA(model=None, window=2, stage_iters=4, rounds_growth=2.0)
    assert [coda.schedule(r).kind for r in range(2 + 1 + 4 + 1)] == ["train", "stage_end", "dual_reset"] + [
        "train"
    ] * 3 + ["stage_end", "dual_reset"]
    with pytest.raises(FedriskError, match=r"rounds_growth = 2\.0 needs stages"):
        CODAPlus(model=None, stage_iters=None, rounds_growth=2.0)
    with pytest.raises(FedriskError, match=r"rounds_growth = 0\.5 is out of range"):
        CODAPlus(model=None, rounds_growth=0.5)


def test_large_effective_step_warns() -> None:
    with pytest.warns(LargeEffectiveStepWarning, match=r"eta_tilde = .* = 51\.2 exceeds 1\.0"):
        CODASCA(model=None, lr=0.1, window=512)
    with pytest.warns(LargeEffectiveStepWarning, match="growing by 2 per stage"):
        CODASCA(model=None, lr=0.01, window=4, window_growth=3.0, lr_decay=1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CODASCA(model=None, lr=0.1, window=8, global_lr=1.1)  # η̃ = 0.88
        CODASCA(model=None, lr=0.2, window=4, window_growth=2.0, lr_decay=2.0)  # Theorem 2: η̃ = 0.8 fixed
        CODASCA(model=None, lr=0.25, window=2, global_lr=2.0)  # η̃ = 1.0, at the limit: no warning
        CODASCA(model=None, lr=0.1, window=2, stage_iters=None)  # no stages: nothing grows
    # pinned by mutation testing (codasca scope): η̃ multiplies the global step in
    with pytest.warns(LargeEffectiveStepWarning, match=r"= 0\.3 \* 2\.0 \* 2 = 1\.2 exceeds"):
        CODASCA(model=None, lr=0.3, window=2, global_lr=2.0)


def test_the_effective_step_warning_points_at_the_caller_and_says_what_to_do() -> None:
    """The whole advice, ``growing`` only when the window really grows faster than the step
    shrinks, and the warning attributed to the line that built the algorithm (``stacklevel``)."""
    with pytest.warns(LargeEffectiveStepWarning) as record:
        CODASCA(model=None, lr=0.5, window=4, window_growth=2.0, lr_decay=2.0)  # η̃ = 2 > 1, fixed over stages
    (warning,) = record
    text = str(warning.message)
    # the caller's frame: outside the library and outside pytest (under mutation testing mutmut's
    # trampoline adds a frame of its own, so the exact file is not asserted)
    library = str(Path(fedrisk.__file__).resolve().parent)
    assert not str(Path(warning.filename).resolve()).startswith(library)
    assert "_pytest" not in warning.filename and warning.filename != "<string>"  # not the dataclass __init__
    assert "growing" not in text
    assert text.endswith(
        "exceeds 1.0: Theorem 2 needs eta_tilde <= min(1/(3l + 3l^2/mu_2), mu_2/(40 l^2)) and the spec's "
        "heterogeneous toy diverges at 1.28; CODASCA may oscillate or diverge. Lower lr or window "
        "(or keep window_growth <= lr_decay)"
    )


# --------------------------------------------------------------------------------------------
# item 6: the paths the first suite left unexercised
# --------------------------------------------------------------------------------------------


def test_margin_projection_is_active_and_keeps_the_dual_feasible() -> None:
    """AUCM with a tiny margin on a logit scorer: without the projection the dual turns negative;
    with it every iterate stays ≥ 0 and the trajectory differs (the clamp was active)."""

    class Unprojected(CODAPlus):
        def dual_projection(self) -> None:
            return None

    kw = {"auc_loss": "margin", "margin": 0.01, "lr": 0.5, "window": 4, "stage_iters": None, "batch_size": 8}
    fed = small_fed()
    projected = sim_of(CODAPlus(model=mlp(activation=None), **kw), fed)
    free = sim_of(Unprojected(model=mlp(activation=None), **kw), fed)
    a, b = [], []
    for _ in range(12):
        projected.step(), free.step()
        a.append(float(projected.server_state["alpha"]))
        b.append(float(free.server_state["alpha"]))
    assert min(a) >= 0 and min(b) < 0
    assert a[0] != b[0]  # the clamp acted inside the very first window


def _toy_fed(K: int = 3, d: int = 4, seed: int = 0) -> tuple[Federation, Tensor]:
    """Client k's row block [M_k | rhs_k] of the game f_k = ½ vᵀA_k v − b_kᵀv + α c_kᵀv − ½ α²."""
    from fedrisk.data.federation import Samples

    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(K, d, d, generator=g, dtype=F64)
    A = 0.5 * torch.eye(d, dtype=F64) + 0.5 * Q @ Q.transpose(1, 2) / d
    b, c = torch.randn(K, d, generator=g, dtype=F64), torch.randn(K, d, generator=g, dtype=F64)
    M = torch.zeros(K, d + 1, d + 2, dtype=F64)
    M[:, :d, :d], M[:, :d, d], M[:, d, :d], M[:, d, d], M[:, :d, d + 1] = A, c, c, -1.0, b
    clients = [Samples(M[k], torch.zeros(d + 1, dtype=torch.long)) for k in range(K)]
    return Federation("toy", clients, 2), M


class _Toy:
    """The game through the family's hooks (exact gradients, no minibatches)."""

    def check(self, fed: Any) -> None: ...

    def init_primal(self, params: Tensor) -> Tensor:
        return params

    def init_objective_state(self, ctx: Any, client: int, params: Tensor) -> dict:
        return {}

    def draw(self, ctx: Any, client: Any, num_samples: Any, rng: Any) -> dict:
        return {}

    def objective_directions(self, state: dict, data: Any, draws: dict, v: Tensor, alpha: Tensor) -> Any:
        d = data.x.shape[-2] - 1
        M, rhs = data.x[..., : d + 1], data.x[..., d + 1]

        def directions(t: int, xs: list[Tensor], ys: list[Tensor]) -> tuple:
            grad = M @ torch.cat([xs[0], ys[0].reshape(1)]) - rhs
            return grad.sum(), [grad[:d]], [grad[d]]

        return directions


class ToyPlus(_Toy, CODAPlus):
    name = "toy_plus_growth"


class ToySCA(_Toy, CODASCA):
    name = "toy_sca_growth"


def reference_growing_stages(alg: CODAPlus, M: Tensor, stages: int) -> Tensor:
    """Alg. 1 + 2 transcribed with stage-dependent I_s, R_s, η_s; output = (1/K)(1/T_s) Σ_k Σ_t."""
    K, d = M.shape[0], M.shape[1] - 1
    v, a = torch.zeros(d, dtype=F64), torch.zeros((), dtype=F64)
    for s in range(stages):
        I, R, lr = alg.stage_window(s), alg.stage_rounds(s), alg.stage_lr(s)
        ref, total = v, torch.zeros(d + 1, dtype=F64)
        for _ in range(R):
            ends = []
            for k in range(K):
                vk, ak = v, a
                for _ in range(I):
                    grad = M[k, :, : d + 1] @ torch.cat([vk, ak.reshape(1)]) - M[k, :, d + 1]
                    vk, ak = vk - lr * (grad[:d] + alg.prox_coef * (vk - ref)), ak + lr * grad[d]
                    total = total + torch.cat([vk, ak.reshape(1)])
                ends.append(torch.cat([vk, ak.reshape(1)]))
            mean = torch.stack(ends).mean(0)
            v, a = mean[:d], mean[d]
        out = total / (K * R * I)
        v, a = out[:d], out[d]
    return torch.cat([v, a.reshape(1)])


def test_growing_windows_and_rounds_train_with_the_right_stage_average() -> None:
    """window_growth = 2, rounds_growth = 1.5: the simulation's Alg. 2 output after every stage
    equals the step-by-step transcription (the stage-average divisor is T_s = R_s · I_s)."""
    fed, M = _toy_fed()
    alg = ToyPlus(model=None, lr=0.1, window=2, window_growth=2.0, rounds_growth=1.5, stage_iters=4, prox_coef=0.1)
    sim = sim_of(alg, fed, init_params=torch.zeros(M.shape[1] - 1, dtype=F64))
    for stages in (1, 2, 3):
        while sim.round < sum(alg.stage_rounds(s) for s in range(stages)):
            sim.step()
        assert float((flat(sim.server_state) - reference_growing_stages(alg, M, stages)).abs().max()) < TOL
    assert [alg.stage_rounds(s) for s in range(3)] == [2, 3, 4]
    # CODASCA's random output draws its round among the stage's own R_s windows
    sca = ToySCA(model=None, lr=0.05, window=2, window_growth=2.0, rounds_growth=2.0, stage_iters=2, prox_coef=0.1)
    picks: dict[int, set] = {}
    for seed in range(6):
        sim = sim_of(sca, fed, seed=seed, init_params=torch.zeros(M.shape[1] - 1, dtype=F64))
        for _ in range(1 + 2 + 4):
            slot = sca.schedule(sim.round)
            sim.step()
            picks.setdefault(slot.stage, set()).add(int(sim.server_state["pick"]))
    assert picks[0] == {0} and picks[1] <= {0, 1} and picks[2] <= {0, 1, 2, 3} and len(picks[2]) > 1


@pytest.mark.parametrize("sum_directions", [False, True])
def test_weight_decay_alone(sum_directions: bool) -> None:
    """v_{t+1} = v_t − η(g + wd·v_t) with no prox and no shift (both evaluation forms)."""
    v0, a0 = torch.tensor([1.0, -2.0], dtype=F64), torch.tensor(0.5, dtype=F64)
    g, ga = torch.tensor([0.3, 0.1], dtype=F64), torch.tensor(-0.2, dtype=F64)
    out = local_sgda(
        lambda t, v, a: (v[0].sum(), [g], [ga]), v0, a0, 2, 0.1, weight_decay=0.05, sum_directions=sum_directions
    )
    v1 = v0 - 0.1 * (g + 0.05 * v0)
    v2 = v1 - 0.1 * (g + 0.05 * v1)
    assert float((out.v - v2).abs().max()) < 1e-15 and abs(float(out.alpha - (a0 + 0.2 * ga))) < 1e-15
    if sum_directions:  # eq. (7)'s directions include the decay
        assert float((out.direction_sum[0] - (2 * g + 0.05 * (v0 + v1))).abs().max()) < 1e-15
    # through the algorithm: weight decay only changes the primal, as the formula says
    fed = small_fed()
    kw = {"model": mlp(), "lr": 0.2, "window": 2, "stage_iters": None, "batch_size": 8, "prox_coef": 0.0}
    a, b = sim_of(CODAPlus(weight_decay=0.1, **kw), fed), sim_of(CODAPlus(**kw), fed)
    a.step(), b.step()
    assert max_diff(a.server_state["v"], b.server_state["v"]) > 1e-6


def test_coda_keeps_alpha_when_the_pooled_batch_lacks_a_class() -> None:
    fed = small_fed()
    alg = CODA(model=mlp(), **KW, reset_batch_size=5)
    sim = sim_of(alg, fed)
    state = {**sim.server_state, "alpha": torch.tensor(0.37, dtype=F64)}
    zero, one = torch.zeros((), dtype=F64), torch.ones((), dtype=F64)
    for pos_count, neg_count in ((zero, one), (one, zero)):
        reply = {"pos_sum": zero, "pos_count": pos_count, "neg_sum": 0.5 * neg_count, "neg_count": neg_count}
        new = alg.dual_reset_aggregate(state, InMemoryReplies({k: reply for k in range(fed.num_clients)}))
        assert float(new["alpha"]) == 0.37 and torch.equal(flat(new), flat(state))
    reply = {"pos_sum": 0.8 * one, "pos_count": one, "neg_sum": 0.3 * one, "neg_count": one}
    new = alg.dual_reset_aggregate(state, InMemoryReplies({k: reply for k in range(fed.num_clients)}))
    assert float(new["alpha"]) == pytest.approx(0.3 - 0.8)


@pytest.mark.parametrize(
    ("cls", "extra", "stop"),
    [
        (CODASCA, {"stage_output": "random", "stage_iters": 6}, 1),
        (CODASCA, {"stage_output": "last_local_average_ref", "stage_iters": 6}, 4),
        (CODASCA, {"stage_output": "average", "control_variate": "gradient_mean", "stage_iters": 6}, 2),
        (CODA, {"stage_iters": 6, "reset_batch_size": 10}, 5),
    ],
)
def test_mid_stage_resume_equals_the_uninterrupted_run(cls: type, extra: dict, stop: int) -> None:
    """state_dict after ``stop`` rounds (inside a stage of R = 3 windows), written and read back
    with torch.save / torch.load(weights_only=True), then continued: bitwise the uninterrupted run."""
    import io

    fed = small_fed()
    alg = cls(model=mlp(), **{**KW, **extra})
    whole = sim_of(alg, fed, seed=3)
    part = sim_of(alg, fed, seed=3)
    for _ in range(stop):
        part.step()
    buf = io.BytesIO()
    torch.save(part.state_dict(), buf)
    buf.seek(0)
    resumed = sim_of(alg, fed, seed=3)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    kinds = []
    for _ in range(8):
        whole.step()
    while resumed.round < 8:
        kinds.append(resumed.step().kind)
    assert torch.equal(flat(whole.server_state), flat(resumed.server_state))
    for k in range(fed.num_clients):
        assert max_diff(whole.client_states[k], resumed.client_states[k]) == 0
    assert "stage_end" in kinds
