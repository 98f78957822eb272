r"""Synthetic data of FESS-GDA's minimax games (spec ``shared/specs/001_fessgda.md``), registered in
:data:`~fedrisk.data.loaders.DATASETS` so that a config can name them.

``wgan_1d`` (§4.1): ``n`` noise values ``z_j ~ N(0, 1)`` and real points
``x_j = μ̂ + σ̂ z_j``.  A row is ``x = [z_j]`` (the generator's input) with target ``y = x_j`` (the
real point paired with it): the generator ``G(z_j) = μ + σ z_j`` uses the *same* ``z_j`` as the
data (the objective as the paper writes it, spec §6-10).  ``iid`` partitioning with 10 clients
gives the paper's "evenly divided into 10 disjoint sets".  The test split holds ``z = ±1`` with
targets ``μ̂ ± σ̂``, so that the ``mse`` of the generator on it is exactly the paper's metric
``(μ − μ̂)² + (σ − σ̂)²``.  The targets are in ``meta.notes`` (``target_mu``, ``target_sigma``).

``nc_sc_quadratic`` (§7.2-B2): client ``i``'s rows are ``r = b + δ_i + noise_std · ξ`` in
``R^{d2}`` with ``Σ_i δ_i = 0`` and ``||δ_i|| ≈ heterogeneity``; ``attrs["client"]`` says whose
row it is (``partition = "by_attribute"``).  The game itself (the matrix ``A``, ``c``, ``μ``) is
the algorithm's (``game = "quadratic"``).

``fair_groups_toy`` (§7.2-B3): a synthetic binary task with ``num_groups`` groups of unequal size
and difficulty for eq. (2) over groups.  Features ``x ~ N(0, I_dim)``; group ``g``'s label is
``1[w_g · x > 0]`` (flipped with probability ``label_noise``) with ``w_g`` the shared unit
direction ``u`` tilted by ``tilt · g / (num_groups − 1)`` towards a random unit direction, so
no linear rule fits every group and the small, most-tilted groups lose under ERM.  Group sizes
halve from group to group (``largest`` rows for group 0); the test split has ``test_per_group``
rows of every group.  ``attrs["group"]`` holds the group id (``game = "fair_group"``,
``group_attr = "group"``).

``mog_2d`` (issue 30, the network-adversary GAN): the standard 2-D mixture of ``num_modes``
Gaussians with standard deviation ``std`` centred on a ring of radius ``radius`` (8 modes,
``σ = 0.02``, radius 2 by default, as in the unrolled-GAN and VEEGAN papers).  A row is a real
point; its label is the mode it was drawn from, so a label-skew partitioner (``k_classes`` with
``classes_per_client = 2``) gives every client a subset of the modes.  The centres and ``std``
are in ``meta.notes`` (``game = "gan"``'s metrics read them).

Example:
    >>> tr, te, meta = wgan_1d_data(num_samples=4, seed=0)
    >>> tr.x.shape, te.y.tolist(), meta.notes["target_sigma"]
    (torch.Size([4, 1]), [0.10000000149011612, -0.10000000149011612], 0.1)
"""

from __future__ import annotations

import math

import torch

from fedrisk.data.federation import Samples
from fedrisk.data.loaders import DATASETS, DatasetMeta, LoadedDataset
from fedrisk.data.transforms import derive_seed
from fedrisk.errors import check_range

__all__ = ["fair_groups_toy_data", "mog_2d_data", "nc_sc_quadratic_data", "wgan_1d_data"]


def _gen(seed: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, tag))


@DATASETS.register("wgan_1d", "FESS-GDA §4.1: z ~ N(0,1) and real points mu + sigma z (1-D WGAN)")
def wgan_1d_data(
    *, seed: int = 0, num_samples: int = 10000, target_mu: float = 0.0, target_sigma: float = 0.1
) -> LoadedDataset:
    """The 1-D WGAN data of §4.1 (see the module docstring)."""
    check_range("num_samples", num_samples, 1, None)
    check_range("target_sigma", target_sigma, 0.0, None, low_inclusive=False)
    z = torch.randn(num_samples, 1, generator=_gen(seed, "wgan_1d"))
    train = Samples(z, target_mu + target_sigma * z[:, 0])
    zt = torch.tensor([[1.0], [-1.0]])
    test = Samples(zt, target_mu + target_sigma * zt[:, 0])
    meta = DatasetMeta(
        "wgan_1d",
        1,
        ["real"],
        task="regression",
        source="generated",
        notes={"target_mu": target_mu, "target_sigma": target_sigma},
    )
    return LoadedDataset(train, test, meta)


@DATASETS.register("nc_sc_quadratic", "FESS-GDA spec B2: rows b + delta_i + noise of the NC-SC quadratic game")
def nc_sc_quadratic_data(
    *,
    seed: int = 0,
    num_clients: int = 10,
    samples_per_client: int = 100,
    dim: int = 10,
    heterogeneity: float = 1.0,
    noise_std: float = 0.01,
) -> LoadedDataset:
    """Rows of the NC-SC quadratic game (see the module docstring).

    Example:
        >>> tr, te, meta = nc_sc_quadratic_data(num_clients=2, samples_per_client=3, dim=4)
        >>> tr.x.shape, tr.attrs["client"].tolist(), len(te)
        (torch.Size([6, 4]), [0, 0, 0, 1, 1, 1], 0)
    """
    for name, v in (("num_clients", num_clients), ("samples_per_client", samples_per_client), ("dim", dim)):
        check_range(name, v, 1, None)
    check_range("heterogeneity", heterogeneity, 0.0, None)
    check_range("noise_std", noise_std, 0.0, None)
    g = _gen(seed, "nc_sc_quadratic")
    b = torch.randn(dim, generator=g)
    delta = torch.randn(num_clients, dim, generator=g)
    delta = delta - delta.mean(0)
    delta = heterogeneity * delta / delta.norm(dim=1, keepdim=True).clamp(min=1e-12) if num_clients > 1 else delta
    who = torch.arange(num_clients).repeat_interleave(samples_per_client)
    rows = b + delta[who] + noise_std * torch.randn(len(who), dim, generator=g)
    train = Samples(rows, torch.zeros(len(who)), {"client": who})
    test = Samples(torch.zeros(0, dim), torch.zeros(0), {"client": torch.zeros(0, dtype=torch.int64)})
    meta = DatasetMeta(
        "nc_sc_quadratic",
        1,
        ["target"],
        task="regression",
        source="generated",
        attr_names={"client": [str(k) for k in range(num_clients)]},
        notes={"natural_attribute": "client", "b": b.tolist()},
    )
    return LoadedDataset(train, test, meta)


@DATASETS.register("fair_groups_toy", "FESS-GDA spec B3: 5 groups of unequal size and difficulty (attr 'group')")
def fair_groups_toy_data(
    *,
    seed: int = 0,
    num_groups: int = 5,
    dim: int = 10,
    largest: int = 2400,
    tilt: float = 2.0,
    label_noise: float = 0.02,
    test_per_group: int = 1000,
) -> LoadedDataset:
    """The form (2) toy of spec §7.2-B3 (see the module docstring).

    Example:
        >>> tr, te, meta = fair_groups_toy_data(largest=16, test_per_group=2)
        >>> len(tr), tr.attrs["group"].bincount().tolist(), len(te), meta.num_classes
        (31, [16, 8, 4, 2, 1], 10, 2)
    """
    for name, v in (("num_groups", num_groups), ("dim", dim), ("largest", largest)):
        check_range(name, v, 1, None)
    check_range("test_per_group", test_per_group, 0, None)
    check_range("tilt", tilt, 0.0, None)
    check_range("label_noise", label_noise, 0.0, 0.5)
    g = _gen(seed, "fair_groups_toy")
    u = torch.randn(dim, generator=g)
    u = u / u.norm()
    frac = torch.arange(num_groups, dtype=torch.float32) / max(num_groups - 1, 1)
    tilted = u + tilt * frac[:, None] * torch.nn.functional.normalize(torch.randn(num_groups, dim, generator=g), dim=1)
    w = torch.nn.functional.normalize(tilted, dim=1)

    def draw(counts: list[int]) -> Samples:
        group = torch.repeat_interleave(torch.arange(num_groups), torch.tensor(counts, dtype=torch.long))
        x = torch.randn(len(group), dim, generator=g)
        label = ((x * w[group]).sum(1) > 0).long()
        flip = torch.rand(len(group), generator=g) < label_noise
        return Samples(x, torch.where(flip, 1 - label, label), {"group": group})

    train = draw([largest >> k for k in range(num_groups)])
    test = draw([test_per_group] * num_groups)
    meta = DatasetMeta(
        "fair_groups_toy",
        2,
        ["0", "1"],
        source="generated",
        attr_names={"group": [str(k) for k in range(num_groups)]},
        notes={"group_sizes": [largest >> k for k in range(num_groups)], "tilt": tilt},
    )
    return LoadedDataset(train, test, meta)


@DATASETS.register("mog_2d", "2-D mixture of Gaussians on a ring (label = mode; the GAN example, game = 'gan')")
def mog_2d_data(
    *,
    seed: int = 0,
    num_samples: int = 8000,
    num_modes: int = 8,
    radius: float = 2.0,
    std: float = 0.02,
    test_samples: int = 800,
) -> LoadedDataset:
    """The ring of Gaussians (see the module docstring): ``num_samples`` training and
    ``test_samples`` test points, the modes drawn uniformly.

    Example:
        >>> tr, te, meta = mog_2d_data(num_samples=16, test_samples=8)
        >>> tr.x.shape, meta.num_classes, [round(v, 3) for v in meta.notes["centers"][2]]
        (torch.Size([16, 2]), 8, [0.0, 2.0])
    """
    check_range("num_samples", num_samples, 1, None)
    check_range("num_modes", num_modes, 1, None)
    check_range("test_samples", test_samples, 0, None)
    check_range("radius", radius, 0.0, None, low_inclusive=False)
    check_range("std", std, 0.0, None, low_inclusive=False)
    g = _gen(seed, "mog_2d")
    angles = 2 * math.pi * torch.arange(num_modes, dtype=torch.float64) / num_modes
    centers = (radius * torch.stack([torch.cos(angles), torch.sin(angles)], 1)).to(torch.float32)
    centers = torch.where(centers.abs() < 1e-6, torch.zeros_like(centers), centers)

    def draw(n: int) -> Samples:
        mode = torch.randint(0, num_modes, (n,), generator=g)
        return Samples(centers[mode] + std * torch.randn(n, 2, generator=g), mode)

    train, test = draw(num_samples), draw(test_samples)
    meta = DatasetMeta(
        "mog_2d",
        num_modes,
        [str(k) for k in range(num_modes)],
        source="generated",
        notes={"centers": centers.tolist(), "std": std, "radius": radius},
    )
    return LoadedDataset(train, test, meta)
