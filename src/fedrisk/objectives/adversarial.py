r"""Min-max games with a network adversary: the dual player ``y`` is a tree of parameters with its
own model (a discriminator, an adversary), the objective a plain function
``f(x_params, y_params, batch) -> loss`` (issue 30 item 4).

The SGDA family (:mod:`fedrisk.algorithms.sgda`, :mod:`fedrisk.algorithms.fessgda`) solves
``min_x max_{y ∈ Y} (1/M) Σ_i f_i(x, y)`` for any such ``f``: ``x`` are the parameters of the
algorithm's ``model`` (the generator, the classifier), ``y`` those of its ``dual_model``.  An
objective sees one minibatch as a :class:`Batch`: the rows, their labels and attributes, the
noise the algorithm drew for it (games registered with ``noise=True``) and the two models'
forward passes (``batch.model(x, inputs)``, ``batch.dual_model(y, inputs)``).

* :data:`GAME_REGISTRY` / :func:`register_game` — objectives by name, so that a config can say
  ``game = "my_game"`` once a module listed in its ``imports`` has registered it;
* :func:`tree_projection` — ``P_Y`` on a tree (``dual_set`` = none / simplex / box / ball): the
  flat projections of :mod:`fedrisk.objectives.minimax` applied to the concatenation of the
  leaves, so a one-leaf vector is projected exactly as the flat games project it;
* ``"gan"`` — the GAN game of Goodfellow et al. (2014, eq. (1)),
  ``E log σ(D(real)) + E log(1 − σ(D(G(z))))``, with :func:`mixture_metrics` for the 2-D
  mixture-of-Gaussians data (``dataset = "mog_2d"``: modes covered, high-quality samples).

Example:
    >>> import torch
    >>> project = tree_projection("ball", radius=1.0)
    >>> y = project({"w": torch.tensor([[3.0, 0.0]]), "b": torch.tensor([4.0])})
    >>> [round(v, 4) for v in y["w"][0].tolist()], round(float(y["b"]), 4)
    ([0.6, 0.0], 0.8)
    >>> "gan" in GAME_REGISTRY
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn import functional as F

from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.minimax import DUAL_SETS, project_ball, project_box, project_simplex
from fedrisk.registry import Registry
from fedrisk.tree import Tree, tensor_leaves

__all__ = [
    "GAME_REGISTRY",
    "Batch",
    "MinimaxGame",
    "gan_objective",
    "generator_samples",
    "mixture_metrics",
    "register_game",
    "tree_projection",
]


class Batch(NamedTuple):
    """One minibatch as a custom objective ``f(x_params, y_params, batch)`` sees it."""

    inputs: Tensor
    """The rows ``[B, ...]`` (for a GAN: the real samples)."""
    labels: Tensor
    """Their labels ``[B]``."""
    attrs: Mapping[str, Tensor]
    """Their attributes (e.g. ``"group"``), ``[B]`` each."""
    noise: Tensor | None
    """``[B, noise_dim]`` standard normal draws (games registered with ``noise=True``), else None."""
    model: Callable[[Tree, Tensor], Tensor]
    """The primal model's forward pass ``model(x_params, inputs)``."""
    dual_model: Callable[[Tree, Tensor], Tensor] | None
    """The dual model's forward pass ``dual_model(y_params, inputs)`` (None without one)."""


@dataclass(frozen=True)
class MinimaxGame:
    """A registered objective ``f(x, y, batch)`` with what it needs from the algorithm.

    Attributes:
        objective: ``f(x_params, y_params, batch) -> scalar``; ``x`` descends, ``y`` ascends.
        noise: draw ``batch.noise`` (``[B, noise_dim]``, standard normal) for every minibatch.
        metrics: ``metrics(x, y, federation, algorithm) -> {name: float}``, added to every evaluation.
        samples: ``samples(x, algorithm) -> [N, ...]`` what the primal model generates, saved at
            every evaluation of a config run (``DIR/samples/``) and plotted over the rounds.
    """

    objective: Callable[[Tree, Tree, Batch], Tensor]
    noise: bool = False
    metrics: Callable[[Tree, Tree, Any, Any], dict[str, float]] | None = None
    samples: Callable[[Tree, Any], Tensor] | None = None

    def __call__(self, x: Tree, y: Tree, batch: Batch) -> Tensor:
        return self.objective(x, y, batch)


GAME_REGISTRY: Registry[Any] = Registry("game")
"""Network-adversary games by name (``game = "..."`` of the SGDA family; ``fedrisk list`` shows
the algorithms' ``game`` key)."""


def register_game(
    name: str,
    description: str,
    *,
    noise: bool = False,
    metrics: Callable[[Tree, Tree, Any, Any], dict[str, float]] | None = None,
    samples: Callable[[Tree, Any], Tensor] | None = None,
) -> Callable[[Callable[[Tree, Tree, Batch], Tensor]], Callable[[Tree, Tree, Batch], Tensor]]:
    """Register ``f(x_params, y_params, batch)`` as game ``name`` (a config's ``game = name``).

    Example (a module listed in a config's ``imports`` would hold this):
        >>> import torch
        >>> @register_game("doc_adversary", "the adversary scales each row's squared error")
        ... def doc_adversary(x, y, batch):
        ...     err = (batch.model(x, batch.inputs).reshape(-1) - batch.labels) ** 2
        ...     return (batch.dual_model(y, batch.inputs).reshape(-1).sigmoid() * err).mean()
        >>> GAME_REGISTRY.get("doc_adversary").noise
        False
        >>> _ = GAME_REGISTRY._entries.pop("doc_adversary")  # (the example cleans up after itself)
    """

    def deco(fn: Callable[[Tree, Tree, Batch], Tensor]) -> Callable[[Tree, Tree, Batch], Tensor]:
        GAME_REGISTRY.add(name, MinimaxGame(fn, noise, metrics, samples), description)
        return fn

    return deco


# ============================================================================================
# the dual set on a tree
# ============================================================================================


def tree_projection(
    dual_set: str, *, low: float = -1.0, high: float = 1.0, radius: float = 1.0
) -> Callable[[Tree], Tree] | None:
    """``P_Y`` for a tree ``y`` (None for ``dual_set = "none"``): ``box`` clips every parameter
    to ``[low, high]`` (WGAN's weight clipping), ``ball`` and ``simplex`` project the vector of
    all the leaves (``||y|| ≤ radius`` over every parameter; ``Σ y = 1, y ≥ 0``).  Static-shaped
    tensor code: runs under ``torch.func.vmap``.

    Example:
        >>> import torch
        >>> tree_projection("simplex")({"a": torch.tensor([2.0]), "b": torch.tensor([0.0, 0.0])})["a"].tolist()
        [1.0]
        >>> tree_projection("ball", radius=0.0)
        Traceback (most recent call last):
        fedrisk.errors.FedriskError: dual_radius = 0.0 is out of range; allowed: (0.0, inf)
    """
    if dual_set not in DUAL_SETS:
        raise unknown_name("dual_set", dual_set, DUAL_SETS)
    if dual_set == "ball":
        check_range("dual_radius", radius, 0.0, None, low_inclusive=False)
    if dual_set == "box" and low > high:
        raise FedriskError(f"dual_low = {low} must be <= dual_high = {high}")
    if dual_set == "none":
        return None
    flat: Callable[[Tensor], Tensor] = {
        "simplex": project_simplex,
        "box": lambda v: project_box(v, low, high),
        "ball": lambda v: project_ball(v, radius),
    }[dual_set]

    def project(y: Tree) -> Tree:
        if isinstance(y, Tensor):
            return flat(y.reshape(-1)).reshape(y.shape)
        if type(y) is not dict:
            raise FedriskError(f"the {dual_set} projection takes a tensor or a dict of tensors; got {type(y).__name__}")
        names = list(y)
        leaves = [y[k] for k in names]
        if dual_set == "box":  # element-wise: no concatenation needed
            return {k: flat(v) for k, v in zip(names, leaves)}
        vec = flat(torch.cat([v.reshape(-1) for v in leaves]))
        parts = torch.split(vec, [v.numel() for v in leaves])
        return {k: p.reshape(v.shape) for k, p, v in zip(names, parts, leaves)}

    return project


# ============================================================================================
# the GAN game
# ============================================================================================


def generator_samples(x: Tree, algorithm: Any, num_samples: int = 2000) -> Tensor:
    """``G(z)`` for ``num_samples`` noise rows drawn with seed 0 (the same noise at every call).

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.algorithms.sgda import LocalSGDA
        >>> mlp = lambda out: FunctionalModel(build_model("mlp", (2,), out))
        >>> alg = LocalSGDA(model=mlp(2), dual_model=mlp(1), game="gan", noise_dim=2)
        >>> generator_samples(alg.model.init_params(0), alg, 5).shape
        torch.Size([5, 2])
    """
    dtype, device = tensor_leaves(x)[0].dtype, tensor_leaves(x)[0].device
    z = torch.randn(num_samples, algorithm.noise_dim, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    with torch.no_grad():
        return algorithm.model.apply(x, z).reshape(num_samples, -1)


def mixture_metrics(x: Tree, y: Tree, federation: Any, algorithm: Any, num_samples: int = 2000) -> dict[str, float]:
    r"""Sample quality of a generator on a Gaussian mixture (``dataset = "mog_2d"``).

    ``num_samples`` samples ``G(z)`` from fixed noise (seed 0) are assigned to their nearest
    mode centre; a sample is *high quality* when it lies within ``3 σ`` of that centre, and a
    mode is *covered* when at least 2% of the samples are high-quality samples of it (a mode's
    share is 1/8 on the 8-mode ring).  Returns ``modes_covered`` (0 .. number of modes),
    ``high_quality_fraction`` and ``mode_balance`` (the smallest covered share over the largest,
    0 with fewer than two modes covered).  Nothing when the data has no mode centres.

    Example:
        >>> from fedrisk.data import build_federation
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.algorithms.sgda import LocalSGDA
        >>> fed = build_federation("mog_2d", "iid", 2, seed=0, dataset_options={"num_samples": 64})
        >>> gen = FunctionalModel(build_model("mlp", (2,), 2))
        >>> alg = LocalSGDA(model=gen, dual_model=FunctionalModel(build_model("mlp", (2,), 1)), game="gan",
        ...                 noise_dim=2)
        >>> m = mixture_metrics(gen.init_params(0), None, fed, alg)
        >>> sorted(m), 0 <= m["modes_covered"] <= 8
        (['high_quality_fraction', 'mode_balance', 'modes_covered'], True)
    """
    notes = federation.info.get("dataset_meta", {}).get("notes", {})
    if "centers" not in notes:
        return {}
    samples = generator_samples(x, algorithm, num_samples)
    centers = torch.tensor(notes["centers"], dtype=samples.dtype, device=samples.device)
    dist = torch.cdist(samples, centers)
    nearest, which = dist.min(dim=1)
    good = nearest <= 3.0 * float(notes["std"])
    counts = torch.bincount(which[good], minlength=len(centers)).to(torch.float64) / num_samples
    covered = counts >= 0.02
    shares = counts[covered]
    balance = float(shares.min() / shares.max()) if int(covered.sum()) > 1 else 0.0
    return {
        "modes_covered": float(covered.sum()),
        "high_quality_fraction": float(good.to(torch.float64).mean()),
        "mode_balance": balance,
    }


@register_game(
    "gan",
    "GAN (Goodfellow et al. 2014): E log sigmoid(D(real)) + E log(1 - sigmoid(D(G(z)))); "
    "model = generator, dual_model = discriminator",
    noise=True,
    metrics=mixture_metrics,
    samples=lambda x, alg: generator_samples(x, alg, 500),
)
def gan_objective(x: Tree, y: Tree, batch: Batch) -> Tensor:
    r"""``f(θ, φ) = mean log σ(D_φ(real)) + mean log(1 − σ(D_φ(G_θ(z))))`` on one minibatch
    (``log σ(s) = −softplus(−s)``, ``log(1 − σ(s)) = −softplus(s)``): the generator ``G_θ`` (the
    primal model) descends, the discriminator ``D_φ`` (the dual model, one logit per row) ascends.

    Example:
        >>> import torch
        >>> from fedrisk.objectives.adversarial import Batch
        >>> ident = lambda p, t: t * p
        >>> b = Batch(torch.zeros(4, 1), torch.zeros(4), {}, torch.zeros(4, 1), ident, ident)
        >>> round(float(gan_objective(torch.tensor(1.0), torch.tensor(1.0), b)), 4)  # 2 log(1/2)
        -1.3863
    """
    real = batch.inputs
    if batch.noise is None or batch.dual_model is None:
        raise FedriskError("game 'gan' needs noise (algorithm.noise_dim >= 1) and a dual model ([dual_model])")
    fake = batch.model(x, batch.noise.to(real.dtype))
    if fake.shape != real.shape:
        raise FedriskError(
            f"game 'gan': the generator ([model]) outputs {list(fake.shape[1:])} per row but the data rows are "
            f"{list(real.shape[1:])}; set model.num_outputs = {math.prod(real.shape[1:])}"
        )
    d_real, d_fake = batch.dual_model(y, real), batch.dual_model(y, fake)
    if d_real.numel() != real.shape[0]:
        raise FedriskError(
            f"game 'gan': the discriminator ([dual_model]) must give one logit per row; it outputs "
            f"{list(d_real.shape[1:])} per row (set dual_model.num_outputs = 1)"
        )
    return -F.softplus(-d_real).mean() - F.softplus(d_fake).mean()
