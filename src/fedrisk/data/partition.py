"""Partitioners: seeded pure functions from a label (or attribute) array to client index lists.

Every partitioner takes a 1-D integer array (a ``torch.Tensor``, a NumPy array or a list),
a number of clients and a ``seed``, and returns ``list[list[int]]``: one sorted list of row
numbers per client.  The same inputs always give the same output; nothing global is touched.
Each partitioner is registered in :data:`PARTITIONERS` under its name, so a config can say
``partition = "dirichlet"`` with ``alpha = 0.3``.

Bad input raises :class:`~fedrisk.errors.FedriskError` naming the parameter, its value and
the allowed range.

Example:
    >>> labels = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    >>> parts = iid(labels, num_clients=3, seed=0)
    >>> sorted(i for p in parts for i in p) == list(range(9))
    True
    >>> class_disjoint(labels, num_clients=3, seed=0)
    [[6, 7, 8], [0, 1, 2], [3, 4, 5]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedrisk.errors import FedriskError, check_range
from fedrisk.registry import Registry

__all__ = [
    "PARTITIONERS",
    "by_attribute",
    "by_sizes",
    "class_disjoint",
    "class_groups",
    "dirichlet",
    "iid",
    "k_classes",
    "shards",
    "split_indices",
]

Labels = torch.Tensor | np.ndarray | Sequence[int]
Partition = list[list[int]]

PARTITIONERS: Registry[Any] = Registry("partitioner")


# ----------------------------------------------------------------------------- helpers


def as_label_array(labels: Labels, name: str = "labels") -> np.ndarray:
    """``labels`` as a 1-D ``int64`` NumPy array (rejects non-integer values and other shapes)."""
    is_tensor = isinstance(labels, torch.Tensor)
    arr = labels.detach().cpu().numpy() if is_tensor else np.asarray(labels)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise FedriskError(f"{name} must be a 1-D array of integers; got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise FedriskError(f"{name} must hold integers; got dtype {arr.dtype}")
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise FedriskError(f"{name} must hold integer values (class ids); got fractional values")
    return arr.astype(np.int64, copy=False)


def _check_clients(num_clients: int, available: int, what: str = "samples") -> None:
    if not isinstance(num_clients, (int, np.integer)) or isinstance(num_clients, bool):
        raise FedriskError(f"num_clients must be an integer; got {num_clients!r}")
    if available < 1:
        raise FedriskError(f"cannot partition an empty label array (0 {what})")
    if num_clients < 1 or num_clients > available:
        raise FedriskError(
            f"num_clients = {num_clients} is out of range; allowed: [1, {available}] "
            f"(at most one client per {what[:-1] if what.endswith('s') else what}, "
            f"there are {available} {what})"
        )


def _sorted_lists(parts: Sequence[np.ndarray | Sequence[int]]) -> Partition:
    return [sorted(int(i) for i in p) for p in parts]


def _split_evenly(index: np.ndarray, pieces: int) -> list[np.ndarray]:
    return list(np.array_split(index, pieces))


def split_indices(
    labels: Labels, fraction: float, seed: int = 0, *, stratify: bool = True
) -> tuple[list[int], list[int]]:
    """Split rows into ``(keep, held_out)`` with ``held_out`` about ``fraction`` of the rows.

    With ``stratify`` (the default) each class is split separately, so both parts keep the
    class proportions: class ``c`` with ``n_c`` rows gives ``round(fraction * n_c)`` held-out
    rows, but at least one row stays on the keep side.  Both lists are sorted.

    Example:
        >>> keep, held = split_indices([0, 0, 0, 0, 1, 1, 1, 1], 0.25, seed=1)
        >>> len(keep), len(held)
        (6, 2)
        >>> sorted(keep + held) == list(range(8))
        True
    """
    y = as_label_array(labels)
    check_range("fraction", fraction, 0.0, 1.0, high_inclusive=False)
    rng = np.random.default_rng(seed)
    if not stratify:
        perm = rng.permutation(len(y))
        n_out = min(round(fraction * len(y)), max(len(y) - 1, 0))
        return sorted(int(i) for i in perm[n_out:]), sorted(int(i) for i in perm[:n_out])
    keep: list[int] = []
    held: list[int] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_out = min(round(fraction * len(idx)), len(idx) - 1)
        held.extend(int(i) for i in idx[:n_out])
        keep.extend(int(i) for i in idx[n_out:])
    return sorted(keep), sorted(held)


# ----------------------------------------------------------------------------- partitioners


@PARTITIONERS.register("iid", "uniformly random split into near-equal client shares")
def iid(labels: Labels, num_clients: int, seed: int = 0) -> Partition:
    """Shuffle all rows and cut them into ``num_clients`` shares whose sizes differ by ≤ 1.

    Example:
        >>> [len(p) for p in iid(list(range(10)), 3, seed=0)]
        [4, 3, 3]
    """
    y = as_label_array(labels)
    _check_clients(num_clients, len(y))
    perm = np.random.default_rng(seed).permutation(len(y))
    return _sorted_lists(_split_evenly(perm, num_clients))


@PARTITIONERS.register("dirichlet", "per-class Dirichlet(alpha) client proportions (smaller alpha = more skew)")
def dirichlet(
    labels: Labels,
    num_clients: int,
    alpha: float = 0.5,
    seed: int = 0,
    min_size: int = 10,
    max_tries: int = 1000,
    balance: bool = False,
) -> Partition:
    """Label-skewed split: each class is spread over clients by proportions ~ Dir(alpha·1).

    For every class the rows are shuffled and cut at the cumulative proportions of a fresh
    Dirichlet draw.  The whole draw is repeated (up to ``max_tries`` times, from the same
    seeded stream) until every client holds at least ``min_size`` rows.  With
    ``balance=True`` a client that already holds ``len(labels)/num_clients`` rows gets no
    more (the trick of the NIID-Bench code, Li et al. 2022), which makes ``min_size`` far
    easier to meet at small ``alpha``.

    Example:
        >>> labels = [c for c in range(4) for _ in range(50)]
        >>> parts = dirichlet(labels, 4, alpha=0.5, seed=0, min_size=10)
        >>> min(len(p) for p in parts) >= 10, sum(len(p) for p in parts)
        (True, 200)
    """
    y = as_label_array(labels)
    _check_clients(num_clients, len(y))
    check_range("alpha", alpha, 0.0, None, low_inclusive=False)
    check_range("min_size", min_size, 0, None)
    check_range("max_tries", max_tries, 1, None)
    if num_clients * min_size > len(y):
        raise FedriskError(
            f"dirichlet: min_size = {min_size} is out of range for {num_clients} clients and "
            f"{len(y)} samples; allowed: [0, {len(y) // num_clients}] "
            f"(num_clients * min_size must not exceed the number of samples)"
        )
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    cap = len(y) / num_clients
    best = 0
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, alpha))
            if balance:
                p = p * np.array([len(part) < cap for part in parts])
                p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for part, piece in zip(parts, np.split(idx, cuts)):
                part.extend(piece.tolist())
        smallest = min(len(part) for part in parts)
        if smallest >= min_size:
            return _sorted_lists(parts)
        best = max(best, smallest)
    raise FedriskError(
        f"dirichlet: could not give every one of {num_clients} clients at least "
        f"min_size = {min_size} samples with alpha = {alpha} in max_tries = {max_tries} draws "
        f"(the best draw's smallest client had {best}). Use a larger alpha, a smaller min_size, "
        f"fewer clients, balance = true, or more max_tries."
    )


@PARTITIONERS.register("shards", "pathological split: sort by label, cut into shards, deal shards to clients")
def shards(labels: Labels, num_clients: int, shards_per_client: int = 2, seed: int = 0) -> Partition:
    """McMahan et al. (2017) pathological non-IID split.

    Rows are sorted by label (ties in random order), cut into
    ``num_clients * shards_per_client`` contiguous shards of near-equal size, and each client
    receives ``shards_per_client`` shards chosen at random.

    Example:
        >>> labels = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
        >>> parts = shards(labels, 4, shards_per_client=1, seed=0)
        >>> sorted({labels[i] for i in p}.pop() for p in parts)
        [0, 1, 2, 3]
    """
    y = as_label_array(labels)
    _check_clients(num_clients, len(y))
    check_range("shards_per_client", shards_per_client, 1, len(y) // num_clients)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    order = perm[np.argsort(y[perm], kind="stable")]
    pieces = _split_evenly(order, num_clients * shards_per_client)
    dealt = rng.permutation(len(pieces))
    return _sorted_lists(
        [
            np.concatenate([pieces[s] for s in dealt[k * shards_per_client : (k + 1) * shards_per_client]])
            for k in range(num_clients)
        ]
    )


@PARTITIONERS.register("k_classes", "each client holds exactly k classes; a class is shared by its holders")
def k_classes(labels: Labels, num_clients: int, classes_per_client: int = 2, seed: int = 0) -> Partition:
    """Every client holds exactly ``classes_per_client`` classes.

    Clients pick in turn: client ``i`` takes the ``k`` classes held by the fewest clients so
    far, ties broken at random.  So every class is used when ``num_clients * k >= C`` and each
    class is held by ``floor`` or ``ceil`` of ``num_clients * k / C`` clients, while the class
    combinations stay random.  Each class's rows are shuffled and split evenly among the
    clients that hold it; classes no client holds are left out.

    Example:
        >>> labels = [c for c in range(5) for _ in range(6)]
        >>> parts = k_classes(labels, 5, classes_per_client=2, seed=0)
        >>> [len({labels[i] for i in p}) for p in parts]
        [2, 2, 2, 2, 2]
    """
    y = as_label_array(labels)
    _check_clients(num_clients, len(y))
    classes = np.unique(y)
    check_range("classes_per_client", classes_per_client, 1, len(classes))
    rng = np.random.default_rng(seed)
    k = classes_per_client
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    load = np.zeros(len(classes), dtype=np.int64)
    for i in range(num_clients):
        pick = np.lexsort((rng.random(len(classes)), load))[:k]  # fewest holders, random ties
        load[pick] += 1
        for c in classes[pick]:
            holders[int(c)].append(i)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c, who in holders.items():
        if not who:
            continue
        idx = rng.permutation(np.flatnonzero(y == c))
        if len(idx) < len(who):
            raise FedriskError(
                f"k_classes: class {c} has {len(idx)} samples but {len(who)} clients hold it; "
                f"use fewer clients or a smaller classes_per_client (allowed here: each class "
                f"needs at least as many samples as clients holding it)"
            )
        for i, piece in zip(who, _split_evenly(idx, len(who))):
            parts[i].extend(piece.tolist())
    return _sorted_lists(parts)


@PARTITIONERS.register("class_disjoint", "classes shuffled and dealt round-robin; no two clients share a class")
def class_disjoint(
    labels: Labels,
    num_clients: int,
    seed: int = 0,
    groups: Sequence[Sequence[int]] | None = None,
    subdivide: int = 1,
) -> Partition:
    """CODASCA's label skew: deal whole classes to clients so that no class is shared.

    The classes are shuffled and client ``k`` receives ``classes[k::num_clients]`` with all
    their rows.  With ``groups`` (lists of class ids, e.g. the negative and the positive
    classes of a binarised task) each group is shuffled and dealt separately, so every client
    gets classes from every group (CODASCA deals CIFAR-100 classes 0-49 and 50-99 this way).

    ``subdivide = m > 1`` first cuts every class into ``m`` random, equal "sub-classes" that are
    dealt like classes; no two clients then share a sub-class (disjoint samples), and a client
    holds a few sub-classes only.  This is how a 10-class set such as Fashion-MNIST gets more
    clients per group than it has classes (Fashion-MNIST-IH with K = 8: ``subdivide = 2``).

    Example:
        >>> labels = [0, 0, 1, 1, 2, 2, 3, 3]
        >>> class_disjoint(labels, 2, seed=0, groups=[[0, 1], [2, 3]])
        [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    y = as_label_array(labels)
    present = [int(c) for c in np.unique(y)]
    if groups is None:
        groups = [present]
    else:
        groups = [[int(c) for c in g if int(c) in set(present)] for g in groups]
        listed = {c for g in groups for c in g}
        missing = sorted(set(present) - listed)
        if missing:
            raise FedriskError(
                f"class_disjoint: groups leave out classes {missing}; allowed: groups that "
                f"together list every class present ({present})"
            )
        if len(listed) != sum(len(g) for g in groups):
            raise FedriskError("class_disjoint: groups must not share a class")
    if not isinstance(subdivide, (int, np.integer)) or subdivide < 1:
        raise FedriskError(f"class_disjoint: subdivide = {subdivide!r} is out of range; allowed: an integer >= 1")
    smallest = min(len(g) for g in groups) * int(subdivide)
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1 or num_clients > smallest:
        where = "classes" if len(groups) == 1 else "classes in the smallest group"
        if subdivide > 1:
            where = f"sub-classes ({subdivide} per class) in the smallest group"
        raise FedriskError(
            f"num_clients = {num_clients} is out of range; allowed: [1, {smallest}] "
            f"(class_disjoint needs at least one class per client: there are {smallest} {where}; "
            "partition_options.subdivide cuts each class into several sub-classes)"
        )
    rng = np.random.default_rng(seed)
    # unit u = (class c, part j): the rows of class c in its j-th random part
    units: dict[tuple[int, int], np.ndarray] = {}
    for c in present:
        rows = np.flatnonzero(y == c)
        if subdivide > 1:
            rows = rng.permutation(rows)
        for j, part in enumerate(np.array_split(rows, int(subdivide))):
            units[(c, j)] = part
    owned: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for g in groups:
        group_units = [(c, j) for c in g for j in range(int(subdivide))]
        order = rng.permutation(len(group_units))
        for k in range(num_clients):
            owned[k].extend(units[group_units[i]] for i in order[k::num_clients])
    return [sorted(int(i) for part in parts for i in part) for parts in owned]


@PARTITIONERS.register("by_attribute", "natural groups: one client (or m clients) per distinct attribute value")
def by_attribute(values: Labels, num_clients: int | None = None, seed: int = 0) -> Partition:
    """Natural partition by an attribute (a sensitive group, a site, a writer, ...).

    With ``num_clients`` unset (or equal to the number ``G`` of distinct values) client ``g``
    holds the rows whose value is the ``g``-th smallest.  With ``num_clients = m * G`` each
    group's rows are shuffled and split evenly among ``m`` clients (FedTorch's Adult split);
    clients ``g*m .. g*m+m-1`` belong to group ``g``.

    Example:
        >>> by_attribute([1, 0, 1, 0, 2])
        [[1, 3], [0, 2], [4]]
        >>> [len(p) for p in by_attribute([0] * 4 + [1] * 4, num_clients=4, seed=0)]
        [2, 2, 2, 2]
    """
    v = as_label_array(values, "values")
    if len(v) == 0:
        raise FedriskError("cannot partition an empty attribute array (0 samples)")
    groups = np.unique(v)
    G = len(groups)
    if num_clients is None:
        num_clients = G
    if not isinstance(num_clients, (int, np.integer)) or num_clients < G or num_clients % G:
        raise FedriskError(
            f"num_clients = {num_clients} is out of range for by_attribute; allowed: a positive "
            f"multiple of the number of distinct attribute values ({G}: {groups.tolist()})"
        )
    m = num_clients // G
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    for g in groups:
        idx = np.flatnonzero(v == g)
        if len(idx) < m:
            raise FedriskError(
                f"by_attribute: value {int(g)} has {len(idx)} samples, fewer than the {m} "
                f"clients per value; allowed num_clients: multiples of {G} up to "
                f"{G * min(int(np.sum(v == h)) for h in groups)}"
            )
        parts.extend(_split_evenly(rng.permutation(idx) if m > 1 else idx, m))
    return _sorted_lists(parts)


@PARTITIONERS.register("by_sizes", "random disjoint clients of explicitly given sizes")
def by_sizes(labels: Labels, sizes: Sequence[int], seed: int = 0, num_clients: int | None = None) -> Partition:
    """Random disjoint clients with ``sizes[k]`` rows each (rows not dealt are left out).

    ``num_clients``, when given, must equal ``len(sizes)`` (it lets the config runner call
    every partitioner the same way).

    Example:
        >>> [len(p) for p in by_sizes(list(range(10)), [5, 2, 1], seed=0)]
        [5, 2, 1]
    """
    y = as_label_array(labels)
    sizes = [int(s) for s in sizes]
    if not sizes:
        raise FedriskError("sizes must list at least one client size; got []")
    if num_clients is not None and num_clients != len(sizes):
        raise FedriskError(
            f"num_clients = {num_clients} does not match sizes (length {len(sizes)}); "
            f"allowed: num_clients = len(sizes) = {len(sizes)}"
        )
    for k, s in enumerate(sizes):
        if s < 1:
            raise FedriskError(f"sizes[{k}] = {s} is out of range; allowed: [1, {len(y)}]")
    if sum(sizes) > len(y):
        raise FedriskError(
            f"sizes sum to {sum(sizes)}, more than the {len(y)} samples available; allowed: sum(sizes) <= {len(y)}"
        )
    perm = np.random.default_rng(seed).permutation(len(y))
    cuts = np.cumsum(sizes)
    return _sorted_lists(np.split(perm[: cuts[-1]], cuts[:-1]))


@PARTITIONERS.register("class_groups", "client group g (in order) holds classes g, g+1, ... (FRPG: pairs per digit)")
def class_groups(labels: Labels, num_clients: int, classes_per_group: int = 1, seed: int = 0) -> Partition:
    """Deterministic label skew of the Byzantine-robustness papers (RSA, FRPG; spec 002 A6).

    The clients are cut, in order, into ``C`` groups of ``num_clients / C`` (``C`` = number of
    classes; 20 clients and 10 digits: pairs).  Group ``g`` holds the classes ``g, g + 1, ...,
    g + classes_per_group - 1`` (mod C); each class's rows are shuffled and split evenly among
    all clients holding it.  ``classes_per_group = 1`` is reading H1 (workers ``2g, 2g + 1``
    share digit g, so the last four of 20 hold digits 8 and 9); ``classes_per_group = C / 2``
    is the alternative reading H2 (each pair sees half of the classes).

    Example:
        >>> labels = [c for c in range(3) for _ in range(4)]
        >>> [sorted({labels[i] for i in p}) for p in class_groups(labels, 6)]
        [[0], [0], [1], [1], [2], [2]]
        >>> [sorted({labels[i] for i in p}) for p in class_groups(labels, 3, classes_per_group=2)]
        [[0, 1], [1, 2], [0, 2]]
    """
    y = as_label_array(labels)
    _check_clients(num_clients, len(y))
    classes = np.unique(y)
    C = len(classes)
    if num_clients % C:
        raise FedriskError(
            f"class_groups: num_clients = {num_clients} is not allowed with {C} classes; "
            f"it must be a multiple of the number of classes (e.g. {2 * C})"
        )
    check_range("classes_per_group", classes_per_group, 1, C)
    per_group = num_clients // C
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for j, c in enumerate(classes):
        groups = [(j - t) % C for t in range(classes_per_group)]
        who = sorted(g * per_group + m for g in groups for m in range(per_group))
        idx = rng.permutation(np.flatnonzero(y == c))
        if len(idx) < len(who):
            raise FedriskError(f"class_groups: class {c} has {len(idx)} samples for {len(who)} clients holding it")
        for i, piece in zip(who, _split_evenly(idx, len(who))):
            parts[i].extend(piece.tolist())
    return _sorted_lists(parts)
