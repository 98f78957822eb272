"""Seeded pure transforms of :class:`~fedrisk.data.federation.Samples`.

Each function returns new ``Samples`` (inputs are never modified) and draws its randomness
from its own ``seed``:

* :func:`binarize` - classes to {0, 1}, optionally subsampling positives to a target ratio
  (LibAUC's ``ImbalancedDataGenerator``);
* :func:`balance_classes` - subsample the majority class of a binary set down to 50/50;
* :func:`add_feature_noise` - additive Gaussian input noise (FeDXL's per-client offsets);
* :func:`flip_labels` - symmetric label noise;
* :func:`label_flip_attack` - FRPG's Byzantine label flipping ``y -> C - 1 - y``;
* :func:`standardize` - zero mean / unit variance with the training statistics.

Example:
    >>> import torch
    >>> s = Samples(torch.zeros(10, 2), torch.tensor([0, 1, 2, 3, 4] * 2))
    >>> b = binarize(s, positive_classes=[3, 4])
    >>> b.y.tolist(), b.attrs["class"].tolist()[:5]
    ([0, 0, 0, 1, 1, 0, 0, 0, 1, 1], [0, 1, 2, 3, 4])
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor

from fedrisk.data.federation import Samples
from fedrisk.errors import FedriskError, check_range

__all__ = [
    "add_feature_noise",
    "balance_classes",
    "binarize",
    "derive_seed",
    "flip_labels",
    "label_flip_attack",
    "positive_count_for_ratio",
    "standardize",
]


def derive_seed(seed: int, *tags: str | int) -> int:
    """An independent 63-bit seed for one named use of ``seed`` (e.g. ``"partition"``, client 3).

    Deriving one seed per step keeps the steps independent: turning label noise on does not
    change the partition drawn from the same run seed.

    Example:
        >>> derive_seed(0, "partition") == derive_seed(0, "partition")
        True
        >>> derive_seed(0, "partition") != derive_seed(0, "label_noise", 3)
        True
    """
    words = [int(seed) % (1 << 64), *(zlib.crc32(str(t).encode()) for t in tags)]
    state = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def positive_count_for_ratio(imratio: float, num_negatives: int) -> int:
    """How many positives give positive fraction ``imratio`` next to ``num_negatives`` negatives.

    LibAUC's rule: ``int(imratio / (1 - imratio) * num_negatives)``.

    Example:
        >>> positive_count_for_ratio(0.1, 500)
        55
    """
    check_range("imratio", imratio, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    return int(imratio / (1.0 - imratio) * num_negatives)


def binarize(
    samples: Samples,
    positive_classes: Iterable[int],
    imratio: float | None = None,
    seed: int = 0,
    *,
    per_class: bool = False,
    keep_class: bool = True,
) -> Samples:
    """Relabel to {0, 1} (1 = a class in ``positive_classes``) and optionally subsample positives.

    With ``imratio`` every negative is kept and ``int(imratio/(1-imratio) * n_neg)`` positives
    are kept, chosen at random (LibAUC's ``ImbalancedDataGenerator``), so the positive fraction
    is ``imratio`` up to rounding.  With ``per_class=True`` that budget is spread over the
    positive classes in proportion to their sizes, rounding down per class (CODASCA keeps
    ``int(0.1/0.9*500) = 55`` images of every positive CIFAR-100 class).  Rows keep their
    original order.  The original class is stored as ``attrs["class"]`` unless
    ``keep_class=False`` (or it is already there).

    Raises FedriskError if there are fewer positives than the ratio needs.

    Example:
        >>> import torch
        >>> s = Samples(torch.zeros(20, 1), torch.arange(20) % 2)
        >>> b = binarize(s, [1], imratio=0.2, seed=0)
        >>> len(b), int(b.y.sum())
        (12, 2)
    """
    pos = sorted({int(c) for c in positive_classes})
    if not pos:
        raise FedriskError("positive_classes must list at least one class; got []")
    y = samples.y.reshape(-1).long()
    is_pos = torch.isin(y, torch.tensor(pos, dtype=torch.long))
    attrs = dict(samples.attrs)
    if keep_class and "class" not in attrs:
        attrs["class"] = y.clone()
    out = Samples(samples.x, is_pos.long(), attrs)
    if imratio is None:
        return out
    n_neg = int((~is_pos).sum())
    n_pos = int(is_pos.sum())
    want = positive_count_for_ratio(imratio, n_neg)
    if want > n_pos:
        raise FedriskError(
            f"imratio = {imratio} needs {want} positives next to {n_neg} negatives but only "
            f"{n_pos} positives exist; allowed: imratio <= {n_pos / (n_pos + n_neg):.4f} "
            f"for these positive_classes"
        )
    g = _generator(seed)
    pos_idx = torch.nonzero(is_pos).reshape(-1)
    if per_class:
        chosen = []
        for c in pos:
            idx_c = torch.nonzero(y == c).reshape(-1)
            take = int(want * len(idx_c) / n_pos)
            chosen.append(idx_c[torch.randperm(len(idx_c), generator=g)[:take]])
        keep_pos = torch.cat(chosen) if chosen else pos_idx[:0]
    else:
        keep_pos = pos_idx[torch.randperm(n_pos, generator=g)[:want]]
    keep = torch.sort(torch.cat([torch.nonzero(~is_pos).reshape(-1), keep_pos])).values
    return out.subset(keep)


def balance_classes(samples: Samples, seed: int = 0) -> Samples:
    """Subsample the larger class of a binary set so both classes have the same count.

    Example:
        >>> import torch
        >>> s = Samples(torch.zeros(6, 1), torch.tensor([0, 0, 0, 0, 1, 1]))
        >>> balance_classes(s).y.tolist()
        [0, 0, 1, 1]
    """
    y = samples.y.reshape(-1).long()
    if y.numel() and (int(y.min()) < 0 or int(y.max()) > 1):
        raise FedriskError("balance_classes needs binary labels in {0, 1}")
    g = _generator(seed)
    idx = [torch.nonzero(y == c).reshape(-1) for c in (0, 1)]
    n = min(len(i) for i in idx)
    keep = torch.cat([i[torch.randperm(len(i), generator=g)[:n]] for i in idx])
    return samples.subset(torch.sort(keep).values)


def add_feature_noise(samples: Samples, std: float, seed: int = 0, mean: float = 0.0) -> Samples:
    """Add fixed Gaussian noise ``N(mean, std^2)`` to every feature.

    FeDXL makes clients heterogeneous with a per-client mean ``(k - K/2) * 0.01`` and
    ``std = 0.2``.  (FeDXL redraws the noise at every minibatch; this draws it once, which
    makes the client's data a fixed, reproducible sample.)

    Example:
        >>> import torch
        >>> s = Samples(torch.zeros(1000, 3), torch.zeros(1000, dtype=torch.long))
        >>> noisy = add_feature_noise(s, std=0.5, seed=0, mean=1.0)
        >>> round(noisy.x.mean().item(), 1), round(noisy.x.std().item(), 1)
        (1.0, 0.5)
    """
    check_range("std", std, 0.0, None)
    x = samples.x if samples.x.is_floating_point() else samples.x.float()
    noise = torch.randn(x.shape, generator=_generator(seed), dtype=x.dtype)
    return Samples(x + mean + std * noise, samples.y, dict(samples.attrs))


def flip_labels(samples: Samples, rate: float, num_classes: int, seed: int = 0) -> Samples:
    """Symmetric label noise: ``round(rate * n_c)`` rows of each class ``c`` get a new label.

    A flipped label is drawn uniformly from the ``num_classes - 1`` *other* classes (for a
    binary task: the other class; FeDXL flips 20% of positives and 20% of negatives).

    Example:
        >>> import torch
        >>> s = Samples(torch.zeros(10, 1), torch.tensor([0] * 5 + [1] * 5))
        >>> int((flip_labels(s, 0.4, 2, seed=0).y != s.y).sum())
        4
    """
    check_range("rate", rate, 0.0, 1.0)
    check_range("num_classes", num_classes, 2, None)
    y = samples.y.reshape(-1).long()
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise FedriskError(
            f"flip_labels: labels must lie in [0, {num_classes - 1}] for num_classes = "
            f"{num_classes}; got values in [{int(y.min())}, {int(y.max())}]"
        )
    g = _generator(seed)
    new = y.clone()
    for c in torch.unique(y).tolist():
        idx = torch.nonzero(y == c).reshape(-1)
        n_flip = round(rate * len(idx))
        flip = idx[torch.randperm(len(idx), generator=g)[:n_flip]]
        shift = torch.randint(1, num_classes, (n_flip,), generator=g)
        new[flip] = (c + shift) % num_classes
    return Samples(samples.x, new.reshape(samples.y.shape).to(samples.y.dtype), dict(samples.attrs))


def label_flip_attack(y: Tensor, num_classes: int) -> Tensor:
    """Byzantine label flipping (FRPG / RSA experiments): ``y -> num_classes - 1 - y``.

    Example:
        >>> import torch
        >>> label_flip_attack(torch.tensor([0, 3, 9]), 10).tolist()
        [9, 6, 0]
    """
    check_range("num_classes", num_classes, 2, None)
    return (num_classes - 1 - y).to(y.dtype)


def standardize(train: Samples, *others: Samples, eps: float = 1e-12) -> tuple[Samples, ...]:
    """Zero-mean, unit-variance features using the statistics of ``train`` only.

    Statistics are per feature (per entry of ``x.shape[1:]``); a constant feature is only
    centred.  Returns ``(train, *others)`` transformed.

    Example:
        >>> import torch
        >>> tr = Samples(torch.tensor([[0.0], [2.0]]), torch.tensor([0, 1]))
        >>> te = Samples(torch.tensor([[4.0]]), torch.tensor([1]))
        >>> [s.x.reshape(-1).tolist() for s in standardize(tr, te)]
        [[-1.0, 1.0], [3.0]]
    """
    x = train.x.float()
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    std = torch.where(std > eps, std, torch.ones_like(std))

    def apply(s: Samples) -> Samples:
        return Samples((s.x.float() - mean) / std, s.y, dict(s.attrs))

    return tuple(apply(s) for s in (train, *others))
