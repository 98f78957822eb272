r"""Federated stochastic gradient descent-ascent: Local SGDA, Local SGDA+, FSGDA, Fed-Norm-SGDA(+)
and SAGDA — the baselines of FESS-GDA's paper (spec ``shared/specs/001_fessgda.md`` §2.5-2.6);
FESS-GDA itself is :mod:`fedrisk.algorithms.fessgda`.

The problem is eq. (1), ``min_x max_{y ∈ Y} (1/M) Σ_i f_i(x, y)``.  Every algorithm here runs
one communication round as (spec §2.1 with ``p = 0``)::

    server:  S_t ← m of the M clients, uniformly without replacement; send (x_t, y_t)
    client i ∈ S_t:  (x, y) ← (x_t, y_t);  for k = 1..K  (one minibatch ξ_k per step):
                 g_x = ∇_x f_i(x, y; ξ_k),  g_y = ∇_y f_i(x, y; ξ_k)      # simultaneous, same ξ
                 x ← x − η_{x,l} g_x;   y ← P_Y(y + η_{y,l} g_y)           # y projected every step
             send (x, y)
    server:  x̄, ȳ = the means over S_t (1/m each)
             Local SGDA (Deng & Mahdavi 2021):  x_{t+1} = x̄,  y_{t+1} = P_Y(ȳ)
             FSGDA (Yang et al. 2022a):         x_{t+1} = x_t + η_{x,g}(x̄ − x_t),  y_{t+1} = P_Y(y_t + η_{y,g}(ȳ − y_t))

The local loop is the shared primal-dual engine :func:`fedrisk.algorithms.primal_dual.local_sgda`
(with its ``lr_dual`` for ``η_{y,l}``).  The variants, each cited in its class docstring
(Fed-Norm-SGDA(+) and SAGDA in :mod:`fedrisk.algorithms.sgda_baselines`, re-exported here):

* :class:`LocalSGDAPlus` / :class:`FedNormSGDAPlus` — the y-steps use a snapshot ``x̂`` of the
  global x, refreshed every ``snapshot_period`` (S) rounds;
* :class:`FedNormSGDA` — clients send the normalised update ``h_i = Δ_i / (η_l τ_i)``, the
  server steps ``−τ_eff η_g η_l Σ_i w_i h_i`` (Sharma, Panda & Joshi 2023);
* :class:`SAGDA` — FSGDA with the control variate ``g_i(w) − g_i(w_t) + v_t`` built from the
  sampled clients' stochastic gradients at ``w_t`` (Yang, Zhang, Fang & Liu 2022).

Games (``game``; the objective is defined by the algorithm's hyper-parameters, pure functions in
:mod:`fedrisk.objectives.minimax`):

* ``"fair_class"`` — eq. (2) over classes, ``Σ_c y_c F_c(x)``, ``Y`` = the simplex of dimension
  ``num_classes`` (``F̂_c`` = the batch's mean cross-entropy of class ``c``, 0 if absent — spec
  §6-11; a one-output model is read as a binary logit);
* ``"fair_group"`` — the same over the groups of the sensitive attribute ``group_attr``
  (``dual_dim`` = the number of groups);
* ``"wgan"`` — the 1-D WGAN of §4.1 (``y = φ ∈ R²``, unconstrained, ``wgan_lambda`` = λ; the
  rows' target is the real point, the model the generator);
* ``"quadratic"`` — the NC-SC game of §7.2-B2 (``y ∈ R^{dual_dim}``, ``A`` seeded by
  ``quadratic_seed``, ``c = quadratic_curvature``, ``μ = quadratic_mu``; the model is a ``vector``);
* a network game — ``y`` the parameters of ``dual_model`` and ``f`` a plain function
  ``f(x_params, y_params, batch)``: a registered name (``"gan"``, or one a config's ``imports``
  registered) or ``objective_fn=f`` in Python (:mod:`fedrisk.algorithms.adversary`).

``dual_set`` (``"auto"``: the game's own ``Y``) chooses ``Y`` = none / simplex / box
(``[dual_low, dual_high]``) / ball (``dual_radius``); ``P_Y`` is applied after every ascent step
and in the server step.

Game metrics (:meth:`LocalSGDA.state_metrics`, added to every evaluation): ``generator_error``
``(μ − μ̂)² + (σ − σ̂)²`` (wgan), ``grad_phi_norm`` ``||∇Φ(x)||`` (quadratic),
``test_worst_group_accuracy`` (fair_group), ``dual_max`` (the largest dual weight, fair games).

Example:
    >>> from fedrisk.data import build_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = build_federation("digits", "iid", 4, seed=0, dataset_options={"flatten": True})
    >>> alg = FSGDA(model=FunctionalModel(build_model("logreg", (64,), 10)), lr=0.1, global_lr=1.5,
    ...             local_steps=2, batch_size=16)
    >>> sim = Simulation(alg, fed, seed=0)
    >>> _ = sim.step()
    >>> y = sim.server_state["y"]
    >>> y.shape, round(float(y.sum()), 6), bool((y >= 0).all())
    (torch.Size([10]), 1.0, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.adversary import (
    check_network_game,
    init_network_dual,
    network_batch,
    network_objective_check,
)
from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    FedInfo,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.algorithms.local import check_sampling, sample_batches
from fedrisk.algorithms.primal_dual import Directions, LocalWindow, flat_directions, local_sgda, server_extrapolate
from fedrisk.autodiff import in_functorch_transform, value_and_grad
from fedrisk.errors import FedriskError, check_int, check_range, unknown_name
from fedrisk.models.functional import FunctionalModel
from fedrisk.objectives.adversarial import GAME_REGISTRY, Batch, MinimaxGame, tree_projection
from fedrisk.objectives.minimax import (
    DUAL_SETS,
    make_projection,
    per_sample_cross_entropy,
    quadratic_game,
    quadratic_grad_phi,
    quadratic_matrix,
    weighted_group_loss,
    wgan_affine_directions,
    wgan_objective,
)
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tensor_leaves, tree_all_finite

__all__ = [
    "FSGDA",
    "GAMES",
    "SAGDA",
    "FedNormSGDA",
    "FedNormSGDAPlus",
    "LocalSGDA",
    "LocalSGDAPlus",
    "check_finite_state",
    "per_sample_cross_entropy",
    "quadratic_matrix",
]

GAMES = ("fair_class", "fair_group", "wgan", "quadratic")
WEIGHTINGS = ("uniform", "samples")
TRAIN, ESTIMATE = "train", "estimate"


def check_finite_state(name: str, round: int, state: Mapping[str, Any], what: Mapping[str, str]) -> None:
    """Stop a diverging run naming the round and the first non-finite variable of ``what``.

    Example:
        >>> import torch
        >>> state = {"x": torch.ones(1), "y": torch.tensor([float("nan")])}
        >>> check_finite_state("fsgda", 3, state, {"x": "x (primal)", "y": "y (dual)"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        fedrisk.errors.FedriskError: fsgda diverged in round 3: y (dual) became NaN/inf; lower the learning rates ...
    """
    for key, label in what.items():
        if key in state and not tree_all_finite(state[key]):
            raise FedriskError(
                f"{name} diverged in round {round}: {label} became NaN/inf; lower the learning rates "
                "(the last good checkpoint is kept)"
            )


def _noise(noise: Tensor | None) -> tuple[Tensor, ...]:
    """The optional noise argument of ``objective`` / ``gradients`` (left out for the vector games,
    so that subclasses written as ``objective(x, y, data, idx)`` keep working)."""
    return () if noise is None else (noise,)


def _positive(name: str, value: float | None) -> None:
    if value is not None:
        check_range(name, value, 0.0, None, low_inclusive=False)


# ============================================================================================
# Local SGDA: the shared round, the games
# ============================================================================================


@dataclass(frozen=True)
class LocalSGDA(Algorithm):
    """Local SGDA (Deng & Mahdavi, AISTATS 2021): K local simultaneous SGDA steps, then the plain
    average of the sampled clients' ``(x, y)`` (``y`` projected onto ``Y``).

    Args:
        model: the functional model whose parameters are ``x``.
        lr: ``η_{x,l}``, the local primal step.
        lr_dual: ``η_{y,l}`` (None: the same as ``lr``).
        local_steps: K.
        batch_size: minibatch size of every local step.
        clients_per_round: m (None: all M clients every round).
        sampling: ``"with_replacement"`` or ``"shuffle"`` minibatches.
        game / dual_dim / group_attr / wgan_lambda / quadratic_*: the objective (module docstring).
        dual_model / objective_fn / noise_dim: a network game (module docstring): the dual
            player's functional model, ``f(x_params, y_params, batch)`` (None: ``game``'s), the
            size of the noise drawn per row for games that draw it (the GAN's generator input).
        dual_set / dual_low / dual_high / dual_radius: ``Y`` (``"auto"``: the game's own).
        freeze_dual: keep ``y = y_0`` (no dual steps): the ERM baseline of spec §7.2-B3 (uniform
            weights on the simplex) with the same rounds, minibatches and primal steps.
        stationarity: also report the full-batch stationarity measures of Def. 2.1 (with ``l = 1``),
            ``stationarity_x = ||∇_x f(x, y)||`` and ``stationarity_y = ||P_Y(y + ∇_y f(x, y)) − y||``
            of eq. (1) over all clients' training rows (one pass over the data per evaluation).
    """

    name: ClassVar[str] = "local_sgda"
    batched_draw: ClassVar[bool] = True
    scorer: ClassVar[bool] = False
    uses_snapshot: ClassVar[bool] = False

    model: Any
    lr: float = 0.01
    lr_dual: float | None = None
    local_steps: int = 10
    batch_size: int = 100
    clients_per_round: int | None = None
    sampling: str = "with_replacement"
    game: str = "fair_class"
    dual_dim: int | None = None
    group_attr: str = "group"
    wgan_lambda: float = 0.001
    quadratic_curvature: float = 1.0
    quadratic_mu: float = 1.0
    quadratic_seed: int = 0
    freeze_dual: bool = False
    stationarity: bool = False
    dual_model: FunctionalModel | None = None
    objective_fn: Callable[[Tree, Tree, Batch], Tensor] | MinimaxGame | None = None
    noise_dim: int = 0
    dual_set: str = "auto"
    dual_low: float = -1.0
    dual_high: float = 1.0
    dual_radius: float = 1.0

    def __post_init__(self) -> None:
        _positive("lr", self.lr)
        _positive("lr_dual", self.lr_dual)
        check_int("local_steps", self.local_steps, 1)
        check_int("batch_size", self.batch_size, 1)
        check_sampling(self.sampling)
        if self.clients_per_round is not None:
            check_int("clients_per_round", self.clients_per_round, 1)
        if self.game not in GAMES and self.game not in GAME_REGISTRY and self.objective_fn is None:
            raise unknown_name("game", self.game, [*GAMES, *GAME_REGISTRY.names()])
        if self.dual_set not in ("auto", *DUAL_SETS):
            raise unknown_name("dual_set", self.dual_set, ("auto", *DUAL_SETS))
        _positive("dual_radius", self.dual_radius)
        if self.dual_low > self.dual_high:
            raise FedriskError(f"dual_low = {self.dual_low} must be <= dual_high = {self.dual_high}")
        check_int("noise_dim", self.noise_dim, 0)
        game = self.game_spec
        if game is None and self.dual_model is not None:
            raise FedriskError(
                f"dual_model is for network games (a registered game or objective_fn=); game {self.game!r} has a "
                f"vector y; allowed games with a dual model: {', '.join(GAME_REGISTRY.names())}"
            )
        if game is not None and game.noise and self.noise_dim < 1:
            raise FedriskError(f"game {self.game!r} draws generator noise: set noise_dim >= 1 (the generator's input)")
        if game is not None and self.stationarity:
            raise FedriskError("stationarity is computed for the vector games only; set stationarity = false")
        if self.dual_dim is not None:
            check_int("dual_dim", self.dual_dim, 1)
        check_range("wgan_lambda", self.wgan_lambda, 0.0, None)
        _positive("quadratic_mu", self.quadratic_mu)

    @property
    def lr_y(self) -> float:
        """``η_{y,l}``."""
        return self.lr if self.lr_dual is None else self.lr_dual

    @property
    def game_spec(self) -> MinimaxGame | None:
        """The network game (``objective``, or the registered ``game``), None for a vector game."""
        if self.objective_fn is not None:
            return self.objective_fn if isinstance(self.objective_fn, MinimaxGame) else MinimaxGame(self.objective_fn)
        return GAME_REGISTRY.get(self.game) if self.game in GAME_REGISTRY else None

    # -- the game -----------------------------------------------------------------------
    def check(self, fed: FedInfo) -> None:
        if self.clients_per_round is not None and self.clients_per_round > fed.num_clients:
            raise FedriskError(
                f"clients_per_round = {self.clients_per_round} exceeds the number of clients M = {fed.num_clients}; "
                f"allowed: 1 <= m <= {fed.num_clients}"
            )
        if self.game_spec is not None:
            check_network_game(self, fed)
        else:
            self.dual_dimension(fed)

    def dual_dimension(self, fed: FedInfo) -> int:
        """The dimension of ``y`` for this game on ``fed`` (raises on a mismatch)."""
        if self.game == "fair_class":
            if self.dual_dim is not None and self.dual_dim != fed.num_classes:
                raise FedriskError(
                    f"game 'fair_class': the simplex dimension dual_dim = {self.dual_dim} does not match the number "
                    f"of classes {fed.num_classes}; set dual_dim = {fed.num_classes} or leave it unset"
                )
            return fed.num_classes
        if self.game == "wgan":
            if self.dual_dim not in (None, 2):
                raise FedriskError(f"game 'wgan': the discriminator has 2 parameters; got dual_dim = {self.dual_dim}")
            return 2
        if self.dual_dim is None:
            what = f"the number of groups of attribute {self.group_attr!r}" if self.game == "fair_group" else "d2"
            raise FedriskError(f"game {self.game!r} needs dual_dim ({what})")
        return self.dual_dim

    @property
    def feasible_set(self) -> str:
        """``Y``: ``dual_set``, or (``"auto"``) the simplex for the fair games and ``R^d`` otherwise."""
        if self.dual_set != "auto":
            return self.dual_set
        return "simplex" if self.game.startswith("fair") and self.objective_fn is None else "none"

    def projection(self, fed: FedInfo) -> Callable[[Tree], Tree] | None:
        """``P_Y`` (checking a vector y's shape), or None for ``Y = R^d``."""
        bounds = {"low": self.dual_low, "high": self.dual_high, "radius": self.dual_radius}
        if self.game_spec is not None:
            return tree_projection(self.feasible_set, **bounds)
        dim = self.dual_dimension(fed)
        return None if self.feasible_set == "none" else make_projection(self.feasible_set, dim, **bounds)

    def init_dual(self, fed: FedInfo, like: Tensor, gen: torch.Generator | None = None) -> Tree:
        """``y_0``: the uniform weights on the simplex, 0 otherwise (φ = 0 for the WGAN); a
        network dual's seeded initialisation (``gen``), projected onto ``Y``."""
        if self.game_spec is not None:
            return init_network_dual(self, like, gen if gen is not None else torch.Generator(), self.projection(fed))
        dim = self.dual_dimension(fed)
        if self.feasible_set == "simplex":
            return torch.full((dim,), 1.0 / dim, dtype=like.dtype, device=like.device)
        return torch.zeros(dim, dtype=like.dtype, device=like.device)

    def objective(self, x: Tree, y: Tree, data: LocalData, idx: Tensor, noise: Tensor | None = None) -> Tensor:
        """``f_i(x, y; ξ)`` on the rows ``idx`` of the client's data (``noise``: a network game's draws)."""
        if (game := self.game_spec) is not None:
            return game(x, y, network_batch(self, data, idx, noise))
        inputs, labels = data.x[idx], data.y[idx]
        if self.game == "wgan":
            return wgan_objective(labels.to(y.dtype), self.model.apply(x, inputs).reshape(-1), y, self.wgan_lambda)
        if self.game == "quadratic":
            (xv,) = tensor_leaves(x)
            a = quadratic_matrix(self.quadratic_seed, y.shape[-1], xv.shape[-1], xv.dtype).to(xv.device)
            return quadratic_game(xv, y, inputs, a, self.quadratic_curvature, self.quadratic_mu)
        per_sample = per_sample_cross_entropy(self.model.apply(x, inputs), labels)
        groups = labels if self.game == "fair_class" else data.attrs[self.group_attr][idx]
        return weighted_group_loss(per_sample, groups, y)

    def gradients(
        self, x: Tree, y: Tree, data: LocalData, idx: Tensor, noise: Tensor | None = None
    ) -> tuple[Tensor, Tree, Tree]:
        """``(f, ∇_x f, ∇_y f)`` at ``(x, y)`` on one minibatch (one backward pass; the WGAN with
        the affine generator in closed form, :func:`~fedrisk.objectives.minimax.wgan_affine_directions`)."""
        if self.game == "wgan" and self.objective_fn is None and isinstance(x, Mapping) and set(x) == {"mu", "sigma"}:
            z, real = data.x[idx].reshape(idx.shape[-1], -1)[:, 0].to(y.dtype), data.y[idx].to(y.dtype)
            value, g_mu, g_sigma, g_phi = wgan_affine_directions(x["mu"], x["sigma"], z, real, y, self.wgan_lambda)
            return value, {"mu": g_mu, "sigma": g_sigma}, g_phi
        value, (gx, gy) = value_and_grad(lambda xy: self.objective(xy[0], xy[1], data, idx, *_noise(noise)))((x, y))
        return value, gx, gy

    def check_data(self, fed: FedInfo, data: Sequence[LocalData]) -> None:
        """``fair_group``: every client has the attribute ``group_attr`` and its ids lie in
        ``[0, dual_dim)``; a network game's objective fits its models — checked once before the
        run, whatever the executor (eager, never inside ``vmap``)."""
        if (game := self.game_spec) is not None:
            network_objective_check(self, game, data)
        for k, local in enumerate(data):
            self._check_data(local, fed, k)

    def _check_data(self, data: LocalData, fed: FedInfo, client: int | None = None) -> None:
        """:meth:`check_data` for one client; in a round (e.g. a deployed client that no
        simulation checked) the id range only when eager."""
        if self.game != "fair_group" or self.objective_fn is not None:
            return
        if self.group_attr not in data.attrs:
            raise FedriskError(
                f"game 'fair_group': the data has no attribute {self.group_attr!r}; "
                f"attributes: {', '.join(sorted(data.attrs)) or '(none)'} (set group_attr)"
            )
        if in_functorch_transform():  # no Python branching on values under vmap: checked before the run
            return
        groups = data.attrs[self.group_attr][: int(data.size)]
        if groups.numel() and (int(groups.min()) < 0 or int(groups.max()) >= self.dual_dimension(fed)):
            who = "the client's" if client is None else f"client {client}'s"
            raise FedriskError(
                f"game 'fair_group': {who} attribute {self.group_attr!r} has group ids from {int(groups.min())} to "
                f"{int(groups.max())} but the simplex dimension dual_dim = {self.dual_dim}; "
                f"allowed ids: 0 .. {self.dual_dimension(fed) - 1} (set dual_dim to the number of groups)"
            )

    # -- server -------------------------------------------------------------------------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        y0 = self.init_dual(ctx.fed, tensor_leaves(params)[0], gen)
        if (
            self.game == "quadratic" and self.game_spec is None
        ):  # draw (and cache) A now: clients cannot draw it under vmap
            (xv,) = tensor_leaves(params)
            quadratic_matrix(self.quadratic_seed, y0.shape[-1], xv.shape[-1], xv.dtype)
        state = {"x": params, "y": y0}
        if self.uses_snapshot:
            state["snapshot"] = params
        return state

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        return RoundPlan(clients, broadcast=self.broadcast(server_state))

    def broadcast(self, server_state: Tree) -> dict[str, Any]:
        """What every sampled client receives: ``(x_t, y_t)`` (+ the snapshot ``x̂`` of the "+" variants)."""
        out = {"x": server_state["x"], "y": server_state["y"]}
        if self.uses_snapshot:
            out["snapshot"] = server_state["snapshot"]
        return out

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        new = self.server_step(ctx, server_state, replies)
        if self.uses_snapshot:
            refresh = (ctx.round + 1) % self.snapshot_period == 0  # type: ignore[attr-defined]
            new["snapshot"] = new["x"] if refresh else server_state["snapshot"]
        check_finite_state(self.name, ctx.round, new, {"x": "x (primal)", "y": "y (dual)", "z": "z (smoothing anchor)"})
        return new

    def server_step(self, ctx: RoundContext, server_state: Tree, replies: Replies) -> dict[str, Any]:
        """Local SGDA: ``x_{t+1} = x̄``, ``y_{t+1} = P_Y(ȳ)`` (uniform means over S_t)."""
        return {"x": replies.mean("x"), "y": self._project(ctx, replies.mean("y"))}

    def _project(self, ctx: RoundContext, y: Tree) -> Tree:
        proj = self.projection(ctx.fed)
        return y if proj is None else proj(y)

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["x"]

    # -- client -------------------------------------------------------------------------
    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        draws = {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}
        if (game := self.game_spec) is not None and game.noise:  # [K, B, noise_dim] standard normal
            draws["noise"] = rng.normal((self.local_steps, self.batch_size, self.noise_dim))
        return draws

    def directions(self, payload: Mapping[str, Any], data: LocalData, draws: Tree) -> Directions:
        """Step ``k``'s ``(f, ∇_x f_i, ∇_y f_i)`` at ``(x_k, y_k)`` on minibatch ``ξ_k``; the "+"
        variants take ``∇_y`` at ``(x̂, y_k)`` (the snapshot)."""
        batches, noise = draws["batches"], draws.get("noise")
        snapshot = payload.get("snapshot")

        def fn(t: int, x: Tree, y: Tree) -> tuple[Tensor, Tree, Tree]:
            z = None if noise is None else noise[t]
            loss, gx, gy = self.gradients(x, y, data, batches[t], *_noise(z))
            if snapshot is not None:
                _, _, gy = self.gradients(snapshot, y, data, batches[t], *_noise(z))
            return loss, gx, gy

        return flat_directions(fn, payload["x"], payload["y"])

    def local_window(self, ctx: RoundContext, payload: Mapping[str, Any], data: LocalData, draws: Tree) -> LocalWindow:
        """Alg. 1's client loop: K simultaneous steps, ``y`` projected after every step."""
        self._check_data(data, ctx.fed)
        return local_sgda(
            self.directions(payload, data, draws),
            payload["x"],
            payload["y"],
            self.local_steps,
            self.lr,
            lr_dual=0.0 if self.freeze_dual else self.lr_y,
            project_dual=self.projection(ctx.fed),
        )

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        w = self.local_window(ctx, payload, data, draws)
        return ClientResult({"x": w.v, "y": w.alpha}, state, {"loss": w.loss})

    # -- evaluation ---------------------------------------------------------------------
    def state_metrics(self, server_state: Tree, federation: Any) -> dict[str, float]:
        """The game's own metrics of the server iterate (module docstring)."""
        x, y = server_state["x"], server_state["y"]
        out: dict[str, float] = {}
        if (game := self.game_spec) is not None:
            return {} if game.metrics is None else game.metrics(x, y, federation, self)
        if self.game == "wgan" and isinstance(x, Mapping) and {"mu", "sigma"} <= set(x):
            notes = federation.info.get("dataset_meta", {}).get("notes", {})
            mu_hat, sigma_hat = float(notes.get("target_mu", 0.0)), float(notes.get("target_sigma", 0.1))
            out["generator_error"] = float((x["mu"] - mu_hat) ** 2 + (x["sigma"] - sigma_hat) ** 2)
        elif self.game == "quadratic":
            (xv,) = tensor_leaves(x)
            b = torch.stack([c.x.to(xv.dtype).mean(0) for c in federation.clients]).mean(0)  # eq. (1): 1/M Σ_i
            a = quadratic_matrix(self.quadratic_seed, y.shape[-1], xv.shape[-1], xv.dtype).to(xv.device)
            grad = quadratic_grad_phi(xv, a, b, self.quadratic_curvature, self.quadratic_mu)
            out["grad_phi_norm"] = float(torch.linalg.vector_norm(grad))
        else:
            out["dual_max"] = float(y.max())
            if self.stationarity:
                out.update(self.stationarity_measures(x, y, federation))
            test = federation.test
            if self.game == "fair_group" and test is not None and self.group_attr in test.attrs and len(test):
                from fedrisk.metrics import worst_group_accuracy

                with torch.no_grad():
                    scores = self.model.apply(x, test.x.to(tensor_leaves(x)[0].dtype))
                out["test_worst_group_accuracy"] = worst_group_accuracy(scores, test.y, test.attrs[self.group_attr])
        return out

    def stationarity_measures(self, x: Tree, y: Tensor, federation: Any) -> dict[str, float]:
        """Def. 2.1 with ``l = 1`` on the full training data: ``||∇_x f||`` and
        ``||P_Y(y + ∇_y f) − y||`` for ``f = (1/M) Σ_i f_i`` (eq. (1), every row of every client)."""

        def f(xy: tuple[Tree, Tensor]) -> Tensor:
            total = []
            for c in federation.clients:
                data = LocalData(c.x.to(y.dtype), c.y, torch.tensor(len(c)), dict(c.attrs))
                total.append(self.objective(xy[0], xy[1], data, torch.arange(len(c), device=c.x.device)))
            return torch.stack(total).mean()

        _, (gx, gy) = value_and_grad(f)((x, y))
        grad_x = torch.sqrt(sum((g.to(torch.float64) ** 2).sum() for g in tensor_leaves(gx)))
        proj = self.projection(federation)
        step = (y + gy) if proj is None else proj(y + gy)
        return {"stationarity_x": float(grad_x), "stationarity_y": float(torch.linalg.vector_norm(step - y))}


@dataclass(frozen=True)
class FSGDA(LocalSGDA):
    """FSGDA (Yang, Zhang, Fang & Liu 2022a): Local SGDA with global step sizes,
    ``x_{t+1} = x_t + η_{x,g}(x̄ − x_t)``, ``y_{t+1} = P_Y(y_t + η_{y,g}(ȳ − y_t))`` (η_g > 1 extrapolates).

    Args (beyond :class:`LocalSGDA`):
        global_lr: ``η_{x,g}``.
        global_lr_dual: ``η_{y,g}`` (None: the same as ``global_lr``).
    """

    name: ClassVar[str] = "fsgda"

    global_lr: float = 1.0
    global_lr_dual: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("global_lr", self.global_lr)
        _positive("global_lr_dual", self.global_lr_dual)

    @property
    def global_lr_y(self) -> float:
        """``η_{y,g}``."""
        return self.global_lr if self.global_lr_dual is None else self.global_lr_dual

    def server_step(self, ctx: RoundContext, server_state: Tree, replies: Replies) -> dict[str, Any]:
        """:func:`~fedrisk.algorithms.primal_dual.server_extrapolate` with ``(η_{x,g}, η_{y,g})`` and ``P_Y``."""
        x, y = self.global_step(ctx, server_state, replies)
        return {"x": x, "y": y}

    def global_step(self, ctx: RoundContext, server_state: Tree, replies: Replies) -> tuple[Tree, Tensor]:
        """``x_t + η_{x,g}(x̄ − x_t)`` and ``P_Y(y_t + η_{y,g}(ȳ − y_t))`` (uniform means over S_t)."""
        x, y = server_state["x"], server_state["y"]
        return server_extrapolate(
            x, replies.mean("x"), y, replies.mean("y"), self.global_lr, self.global_lr_y, self.projection(ctx.fed)
        )


@dataclass(frozen=True)
class _Snapshot:
    """The "+" variants: the y-ascent uses a snapshot ``x̂`` refreshed every ``snapshot_period``
    (S) rounds (see ``uses_snapshot`` in :class:`LocalSGDA`)."""

    uses_snapshot: ClassVar[bool] = True

    snapshot_period: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        check_int("snapshot_period", self.snapshot_period, 1)


@dataclass(frozen=True)
class LocalSGDAPlus(_Snapshot, LocalSGDA):
    """Local SGDA+ (Deng & Mahdavi 2021, as analysed for NC-C by Sharma et al. 2022): Local SGDA
    whose y-ascent uses a stale ``x̂``, ``y ← P_Y(y + η_{y,l} ∇_y f_i(x̂, y; ξ))``; the server sets
    ``x̂ = x_{t+1}`` after every ``snapshot_period`` (S) rounds.  (The original refreshes every S
    local iterations; here S counts rounds so that x̂ is a global iterate every client shares.)
    """

    name: ClassVar[str] = "local_sgda_plus"


# Fed-Norm-SGDA(+) and SAGDA live in fedrisk.algorithms.sgda_baselines (built on FSGDA above);
# importing them here keeps ``from fedrisk.algorithms.sgda import SAGDA`` working.
from fedrisk.algorithms.sgda_baselines import SAGDA, FedNormSGDA, FedNormSGDAPlus  # noqa: E402
