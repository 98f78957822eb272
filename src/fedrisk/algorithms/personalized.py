"""Personalised-FL baselines next to PERM (paper 003 compares localised FedAvg, Per-FedAvg and
pFedMe; Ditto and APFL complete the usual set).  Each is FedAvg's round (broadcast w, local
steps, server average) plus a per-client personal model kept in the client's state and
evaluated on the client's own test split.

* :class:`LocalizedFedAvg` — FedAvg + local fine-tuning ("localized FedAvg", PERM §4): the
  personal model is the received global model after ``finetune_steps`` local SGD steps.
* :class:`PerFedAvg` — Fallah, Mokhtari and Ozdaglar, "Personalized Federated Learning with
  Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020.  Objective
  ``(1/N) sum_i f_i(w - a grad f_i(w))`` (their eq. (3)); local step (their Alg. 1 with the
  first-order "FO" and Hessian-free "HF" estimates, Sec. 5)::

      w_tmp = w - a grad f(w; D)
      FO:  w <- w - b grad f(w_tmp; D')
      HF:  w <- w - b (g - a d),   g = grad f(w_tmp; D'),
           d = [grad f(w + delta g; D'') - grad f(w - delta g; D'')] / (2 delta)   (Hessian-vector product)

  The personal model is one step of size a from the received w on a fresh batch.
* :class:`PFedMe` — Dinh, Tran and Nguyen, "Personalized Federated Learning with Moreau
  Envelopes", NeurIPS 2020, Alg. 1: per local step, K inner GD steps on
  ``h(theta) = f(theta; D) + (lam/2) ||theta - w_i||^2`` (theta warm-started across local
  steps, from w at the round's start), then ``w_i <- w_i - eta lam (w_i - theta)``; the server
  sets ``w <- (1 - beta) w + beta sum_i p_i w_i``.  The personal model is theta_i.
* :class:`Ditto` — Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning
  Through Personalization", ICML 2021, Alg. 1: FedAvg on w, and a persistent personal model
  ``v_k <- v_k - eta_p (grad f_k(v_k) + lam (v_k - w^r))`` for ``personal_steps`` steps per round.
* :class:`APFL` — Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", 2020,
  Alg. 1: local w_i and personal v_i steps with the mixed model ``v_bar = a_i v_i + (1 - a_i) w_i``::

      w_i <- w_i - eta grad f(w_i; D)
      v_i <- v_i - eta a_i grad f(v_bar; D)          (the gradient of f(v_bar) w.r.t. v_i)
      a_i <- clip(a_i - eta_a <v_i - w_i, grad f(v_bar; D)>, 0, 1)    (their eq. (10); eta_a = 0 keeps a_i fixed)

  the server averages w_i; the personal model is ``a_i v_i + (1 - a_i) w`` with the current global w.

Resolved choices: personal models of fine-tuning / Per-FedAvg / pFedMe are computed in
``client_update`` from the model the client received in its last round (evaluation never reads
client data), so they lag the global model by one round; clients that have not yet taken part
evaluate their initial model.

Example:
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> alg = Ditto(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, lam=0.1)
    >>> alg.personalized, alg.personal_steps
    (True, 1)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fedrisk.algorithms.base import ClientResult, LocalData, RoundContext
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.local import batch, sample_batch, sample_batches, sgd_step, sgd_steps, supervised_objective
from fedrisk.autodiff import value_and_grad
from fedrisk.errors import check_range, unknown_name
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_flatten_vector, tree_lerp, tree_map, tree_scale, tree_vdot

PER_FEDAVG_VARIANTS = ("fo", "hf")


@dataclass(frozen=True)
class _Personal(FedAvg):
    """FedAvg's round plus a personal model in the client state (``{"personal": params}``)."""

    personalized: ClassVar[bool] = True

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"personal": params}

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return client_state["personal"]

    def objective(self):
        return supervised_objective(self.model.apply, self.loss)


@dataclass(frozen=True)
class LocalizedFedAvg(_Personal):
    """FedAvg whose personal model is the received global model fine-tuned locally.

    Args (besides :class:`~fedrisk.algorithms.fedavg.FedAvg`'s):
        finetune_steps: local SGD steps of the fine-tuning.
        finetune_lr: their step size.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> LocalizedFedAvg(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy).finetune_steps
        20
    """

    name: ClassVar[str] = "fedavg_ft"

    finetune_steps: int = 20
    finetune_lr: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("finetune_steps", self.finetune_steps, 0)
        check_range("finetune_lr", self.finetune_lr, 0.0, low_inclusive=False)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        out = super().draw(ctx, client, num_samples, rng)
        out["finetune"] = sample_batches(rng, num_samples, self.finetune_steps, self.batch_size, self.sampling)
        return out

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        result = super().client_update(ctx, payload, state, data, draws)
        personal = payload["params"]
        if self.finetune_steps:
            personal, _ = sgd_steps(self.objective(), personal, data, draws["finetune"], self.finetune_lr)
        return ClientResult(result.reply, {"personal": personal}, result.metrics)


@dataclass(frozen=True)
class PerFedAvg(_Personal):
    """Per-FedAvg (Fallah et al., 2020, Alg. 1): local MAML steps, server average.

    Args (besides FedAvg's; ``lr`` is the outer step b):
        inner_lr: a, the adaptation step (also the personalisation step at evaluation).
        variant: ``"fo"`` (first order) or ``"hf"`` (Hessian-free, finite differences).
        hf_delta: delta of the finite-difference Hessian-vector product.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> PerFedAvg(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, variant="so")
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: unknown variant 'so'. Valid choices: fo, hf
    """

    name: ClassVar[str] = "perfedavg"

    inner_lr: float = 0.05
    variant: str = "fo"
    hf_delta: float = 1e-3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("inner_lr", self.inner_lr, 0.0, low_inclusive=False)
        check_range("hf_delta", self.hf_delta, 0.0, low_inclusive=False)
        if self.variant not in PER_FEDAVG_VARIANTS:
            raise unknown_name("variant", self.variant, PER_FEDAVG_VARIANTS)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        # D, D', D'' for each local step, then the personalisation batch
        return {
            "batches": sample_batches(rng, num_samples, 3 * self.local_steps, self.batch_size, self.sampling),
            "personal": sample_batch(rng, num_samples, self.batch_size, self.sampling),
        }

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        vg = value_and_grad(self.objective())
        a, b, delta = self.inner_lr, self.lr, self.hf_delta
        w, losses = payload["params"], []
        idx = draws["batches"]
        for t in range(self.local_steps):
            loss, g = vg(w, *batch(data, idx[3 * t]))
            w_tmp = sgd_step(w, g, a)
            _, g_outer = vg(w_tmp, *batch(data, idx[3 * t + 1]))
            if self.variant == "hf":  # (I - a H) g_outer with H g by central differences on D''
                x2, y2 = batch(data, idx[3 * t + 2])
                g_plus = vg(tree_map(lambda p, d: p + delta * d, w, g_outer), x2, y2)[1]
                g_minus = vg(tree_map(lambda p, d: p - delta * d, w, g_outer), x2, y2)[1]
                g_outer = tree_map(lambda go, gp, gm: go - a * (gp - gm) / (2 * delta), g_outer, g_plus, g_minus)
            w = sgd_step(w, g_outer, b)
            losses.append(loss)
        # personalisation: one step of size a from the received model (their evaluation protocol)
        _, g = vg(payload["params"], *batch(data, draws["personal"]))
        personal = sgd_step(payload["params"], g, a)
        return ClientResult({"params": w}, {"personal": personal}, {"loss": torch.stack(losses).mean()})


@dataclass(frozen=True)
class PFedMe(_Personal):
    """pFedMe (Dinh et al., 2020, Alg. 1).

    Args (besides FedAvg's; ``lr`` is eta, ``local_steps`` is R, ``batch_size`` is |D|):
        lam: lambda of the Moreau envelope.
        personal_lr: the inner step on theta.
        inner_steps: K, inner steps per local step.
        beta: the server's mixing (beta = 1: plain averaging).

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> PFedMe(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy).inner_steps
        5
    """

    name: ClassVar[str] = "pfedme"

    lam: float = 15.0
    personal_lr: float = 0.05
    inner_steps: int = 5
    beta: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("lam", self.lam, 0.0, low_inclusive=False)
        check_range("personal_lr", self.personal_lr, 0.0, low_inclusive=False)
        check_range("inner_steps", self.inner_steps, 1)
        check_range("beta", self.beta, 0.0, low_inclusive=False)

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        vg = value_and_grad(self.objective())
        lam = self.lam
        w = theta = payload["params"]
        losses = []
        for t in range(self.local_steps):
            x, y = batch(data, draws["batches"][t])
            for _ in range(self.inner_steps):  # theta ~ argmin f(theta; D) + lam/2 ||theta - w||^2
                loss, g = vg(theta, x, y)
                theta = tree_map(lambda th, gi, wi: th - self.personal_lr * (gi + lam * (th - wi)), theta, g, w)
            w = tree_map(lambda wi, th: wi - self.lr * lam * (wi - th), w, theta)
            losses.append(loss)
        return ClientResult({"params": w}, {"personal": theta}, {"loss": torch.stack(losses).mean()})

    def aggregate(self, ctx: RoundContext, server_state: Tree, plan: Any, replies: Any, gen: torch.Generator) -> Tree:
        new = super().aggregate(ctx, server_state, plan, replies, gen)
        old = server_state["params"]  # beta = 1: exactly the average (0 * old + 1 * mean)
        new["params"] = tree_map(lambda o, m: (1 - self.beta) * o + self.beta * m, old, new["params"])
        return new


@dataclass(frozen=True)
class Ditto(_Personal):
    """Ditto (Li et al., 2021, Alg. 1): FedAvg on w plus a regularised personal model v_k.

    Args (besides FedAvg's):
        lam: lambda, the pull of v_k towards the received global model.
        personal_lr: eta_p.
        personal_steps: personal SGD steps per round.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> Ditto(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, lam=-1.0)
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: lam = -1.0 is out of range; allowed: [0.0, inf)
    """

    name: ClassVar[str] = "ditto"

    lam: float = 0.1
    personal_lr: float = 0.05
    personal_steps: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("lam", self.lam, 0.0)
        check_range("personal_lr", self.personal_lr, 0.0, low_inclusive=False)
        check_range("personal_steps", self.personal_steps, 1)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        out = super().draw(ctx, client, num_samples, rng)
        out["personal"] = sample_batches(rng, num_samples, self.personal_steps, self.batch_size, self.sampling)
        return out

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        result = super().client_update(ctx, payload, state, data, draws)
        anchor, lam = payload["params"], self.lam

        def prox(params: Tree, g: Tree) -> Tree:
            return tree_map(lambda gi, p, w: gi + lam * (p - w), g, params, anchor)

        v, _ = sgd_steps(self.objective(), state["personal"], data, draws["personal"], self.personal_lr, prox)
        return ClientResult(result.reply, {"personal": v}, result.metrics)


@dataclass(frozen=True)
class APFL(FedAvg):
    """APFL (Deng et al., 2020, Alg. 1): local w_i, personal v_i, adaptive mixing a_i.

    Args (besides FedAvg's; ``lr`` is eta for w and v):
        mix: the initial a_i in [0, 1].
        mix_lr: eta_a, the step of the a_i update (0 keeps a_i = mix).

    Client state: ``v`` (personal part) and ``mix`` (a_i).  Personal model: ``a_i v_i + (1 - a_i) w``.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> APFL(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy).mix
        0.5
    """

    name: ClassVar[str] = "apfl"
    personalized: ClassVar[bool] = True

    mix: float = 0.5
    mix_lr: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("mix", self.mix, 0.0, 1.0)
        check_range("mix_lr", self.mix_lr, 0.0)

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"v": params, "mix": torch.tensor(self.mix, dtype=tree_flatten_vector(params).dtype)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        vg = value_and_grad(supervised_objective(self.model.apply, self.loss))
        w, v, a = payload["params"], state["v"], state["mix"]
        losses = []
        for t in range(self.local_steps):
            x, y = batch(data, draws["batches"][t])
            loss, g_w = vg(w, x, y)
            v_bar = tree_lerp(w, v, a)  # a v + (1 - a) w
            _, g_bar = vg(v_bar, x, y)
            a_next = a
            if self.mix_lr:  # d f(v_bar) / d a = <v - w, grad f(v_bar)>, at the step's old iterates
                a_next = (a - self.mix_lr * tree_vdot(tree_map(lambda vi, wi: vi - wi, v, w), g_bar)).clamp(0.0, 1.0)
            v = sgd_step(v, tree_scale(a, g_bar), self.lr)
            w = sgd_step(w, g_w, self.lr)
            a = a_next
            losses.append(loss)
        return ClientResult({"params": w}, {"v": v, "mix": a}, {"loss": torch.stack(losses).mean()})

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return tree_lerp(server_state["params"], client_state["v"], client_state["mix"])
