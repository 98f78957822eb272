"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020, Algorithm 1).

The server keeps the model ``x`` and a server control variate ``c``; every client keeps its own
control variate ``c_i`` (persistent client state).  One round r, in the paper's notation:

    server:  sample S (|S| = ``clients_per_round``, all N clients when None); send (x, c)
    client i in S:
        y_i <- x
        for k = 1..K:   y_i <- y_i - eta_l (g_i(y_i) - c_i + c)                  (line 10)
        c_i+ <- (I)  g_i(x)                    gradient at the server model     (line 12)
                (II) c_i - c + (x - y_i) / (K eta_l)
        reply (Delta y_i, Delta c_i) = (y_i - x, c_i+ - c_i);  c_i <- c_i+        (line 13)
    server:
        Delta x = (1/|S|) sum_{i in S} Delta y_i                                  (line 16)
        x <- x + eta_g Delta x
        c <- c + (|S|/N) (1/|S|) sum_{i in S} Delta c_i = c + (1/N) sum_{i in S} Delta c_i  (line 17)

Resolved choices (recorded here as the contract asks):

* **Reply.**  Clients send the differences ``(Delta y_i, Delta c_i)`` exactly as in Algorithm 1,
  line 13; the ledger therefore counts ``2 x |params|`` values up and ``2 x |params|`` down
  (the payload is ``(x, c)``) per client per round, SCAFFOLD's doubled communication.
* **Control-variate update.**  ``control_option="II"`` (the default; the paper's experiments use
  it: "cheaper and usually suffices") or ``"I"``.  Option I evaluates ``g_i(x)`` on a *fresh*
  minibatch of ``batch_size`` rows drawn in :meth:`Scaffold.draw` after the K local batches
  (one extra gradient evaluation per round).
* **Weights.**  ``weighting="uniform"`` is the paper's.  ``weighting="samples"`` is offered for
  unequal client sizes: ``Delta x = sum_{S} n_i Delta y_i / sum_{S} n_i`` and
  ``c <- c + sum_{i in S} (n_i / n) Delta c_i``.  Both rules keep the invariant
  ``c = sum_i w_i c_i`` over *all* clients (``w_i = 1/N`` or ``n_i/n``) under partial
  participation, so the corrections ``c - c_i`` average to zero with the weights used to
  average the models; full-batch SCAFFOLD then converges to the minimiser of
  ``sum_i w_i f_i`` (for ``"samples"``: the pooled-data minimiser).
* **Initial control variates** are zero (``c = c_i = 0``), as in the paper's experiments; the
  first round is then a FedAvg round.
* A client dropped by ``on_client_failure="skip"`` keeps its old ``c_i`` and contributes no
  ``Delta c_i``, which preserves the invariant above.

Example:
    >>> import torch
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> alg = Scaffold(model=FunctionalModel(build_model("logreg", (4,), 3)), loss=cross_entropy,
    ...                lr=0.05, local_steps=5, control_option="II")
    >>> alg.global_lr, alg.weighting
    (1.0, 'uniform')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    FedInfo,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.algorithms.local import (
    batch,
    check_local_sgd,
    sample_batch,
    sample_batches,
    sgd_steps,
    supervised_objective,
)
from fedrisk.algorithms.primal_dual import control_variate_difference
from fedrisk.autodiff import value_and_grad
from fedrisk.errors import check_range, unknown_name
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_axpy, tree_map, tree_scale, tree_sub, tree_zeros_like

CONTROL_OPTIONS = ("I", "II")
WEIGHTINGS = ("uniform", "samples")


@dataclass(frozen=True)
class Scaffold(Algorithm):
    """SCAFFOLD with control-variate option I or II (Karimireddy et al. 2020, Algorithm 1).

    Args:
        model: a functional model (``init_params``, ``apply``).
        loss: ``loss(outputs, labels)``.
        lr: eta_l, the local learning rate.
        local_steps: K, local steps per round.
        batch_size: local minibatch size (also the size of option I's extra minibatch).
        global_lr: eta_g, the server step size (``x <- x + eta_g Delta x``); 1 = averaging.
        control_option: ``"I"`` (``c_i+ = g_i(x)``) or ``"II"`` (``c_i - c + (x - y_i)/(K eta_l)``).
        weighting: ``"uniform"`` (the paper) or ``"samples"`` (see the module docstring).
        clients_per_round: |S| (None = every client every round).
        sampling: ``"with_replacement"`` or ``"shuffle"`` minibatches.

    Server state ``{"params": x, "control": c}``; client state ``{"control": c_i}``; payload
    ``{"params": x, "control": c}``; reply ``{"delta_params": Delta y_i, "delta_control": Delta c_i}``.
    """

    name: ClassVar[str] = "scaffold"
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lr: float = 0.1
    local_steps: int = 1
    batch_size: int = 32
    global_lr: float = 1.0
    control_option: str = "II"
    weighting: str = "uniform"
    clients_per_round: int | None = None
    sampling: str = "with_replacement"

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, self.clients_per_round)
        check_range("global_lr", self.global_lr, 0.0, None, low_inclusive=False)
        if self.control_option not in CONTROL_OPTIONS:
            raise unknown_name("control_option", self.control_option, CONTROL_OPTIONS)
        if self.weighting not in WEIGHTINGS:
            raise unknown_name("weighting", self.weighting, WEIGHTINGS)

    def check(self, fed: FedInfo) -> None:
        if self.clients_per_round is not None:
            check_range("clients_per_round", self.clients_per_round, 1, fed.num_clients)

    # -- set-up ---------------------------------------------------------------------------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"params": params, "control": tree_zeros_like(params)}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"control": tree_zeros_like(params)}

    # -- server: lines 4-5 (sample S, send (x, c)) ---------------------------------------
    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        return RoundPlan(clients, broadcast={"params": server_state["params"], "control": server_state["control"]})

    # -- client: lines 7-13 -----------------------------------------------------------------
    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        draws = {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}
        if self.control_option == "I":
            # a fresh minibatch for g_i(x), drawn after the K local batches
            draws["control_batch"] = sample_batch(rng, num_samples, self.batch_size, self.sampling)
        return draws

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        x, c, c_i = payload["params"], payload["control"], state["control"]
        objective = supervised_objective(self.model.apply, self.loss)
        shift = tree_sub(c, c_i)  # the drift correction c - c_i, fixed during the round

        def corrected(params: Tree, g: Tree) -> Tree:  # g_i(y_i) - c_i + c   (line 10)
            return tree_map(torch.add, g, shift)

        y_i, loss = sgd_steps(objective, x, data, draws["batches"], self.lr, corrected)
        if self.control_option == "I":  # c_i+ = g_i(x)                       (line 12, I)
            _, c_plus = value_and_grad(objective)(x, *batch(data, draws["control_batch"]))
        else:  # c_i+ = c_i - c + (x - y_i) / (K eta_l)                        (line 12, II)
            c_plus = control_variate_difference(c_i, c, x, y_i, self.local_steps, self.lr)  # CODASCA's eq. (6)
        reply = {"delta_params": tree_sub(y_i, x), "delta_control": tree_sub(c_plus, c_i)}
        return ClientResult(reply, {"control": c_plus}, {"loss": loss})

    # -- server: lines 16-17 ----------------------------------------------------------------
    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        fed = ctx.fed
        if self.weighting == "uniform":
            delta_x = replies.mean("delta_params")
            # (|S|/N) * mean_S Delta c_i = (1/N) * sum_S Delta c_i
            delta_c = tree_scale(1.0 / fed.num_clients, replies.sum("delta_control"))
        else:
            delta_x = replies.mean("delta_params", fed.size_weights(replies.clients))
            total = fed.total_size
            delta_c = replies.sum("delta_control", {k: fed.client_sizes[k] / total for k in replies.clients})
        return {
            "params": tree_axpy(self.global_lr, delta_x, server_state["params"]),
            "control": tree_map(torch.add, server_state["control"], delta_c),
        }

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["params"]
