"""The federated data container: per-client training samples plus evaluation sets.

A :class:`Samples` is a plain bundle of tensors (features ``x``, labels ``y`` and optional
per-sample attributes such as a sensitive group).  A :class:`Federation` holds one
``Samples`` per client, optional per-client test and validation splits, and global validation /
test sets.

Example:
    >>> import torch
    >>> from fedrisk.data.federation import Federation, Samples
    >>> s = Samples(torch.randn(6, 2), torch.tensor([0, 1, 0, 1, 1, 0]))
    >>> fed = Federation(name="toy", clients=[s.subset([0, 1, 2]), s.subset([3, 4, 5])], num_classes=2)
    >>> fed.num_clients, fed.client_sizes
    (2, (3, 3))
    >>> fed.partition_report().counts
    [[2, 1], [1, 2]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class Samples:
    """Features, labels and optional per-sample attributes of one data split.

    ``attrs`` maps a name (e.g. ``"group"`` for a sensitive attribute) to a tensor whose first
    dimension equals ``len(x)``.
    """

    x: Tensor
    y: Tensor
    attrs: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.x.shape[0]
        if self.y.shape[0] != n:
            raise ValueError(f"Samples: x has {n} rows but y has {self.y.shape[0]}")
        for name, value in self.attrs.items():
            if value.shape[0] != n:
                raise ValueError(f"Samples: attribute {name!r} has {value.shape[0]} rows, expected {n}")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def positive_ratio(self) -> float:
        """The fraction of rows with label ``1`` (``0.0`` for an empty split)."""
        return float((self.y == 1).float().mean()) if len(self) else 0.0

    def subset(self, index: Sequence[int] | Tensor) -> Samples:
        """The rows ``index`` (a list, array or tensor of row numbers)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return Samples(self.x[idx], self.y[idx], {k: v[idx] for k, v in self.attrs.items()})

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Samples:
        """Cast floating features / attributes to ``dtype`` and move everything to ``device``."""

        def move(t: Tensor) -> Tensor:
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t.to(device) if device is not None else t

        return Samples(move(self.x), move(self.y), {k: move(v) for k, v in self.attrs.items()})

    @staticmethod
    def concat(parts: Sequence[Samples]) -> Samples:
        """Stack several splits row-wise (they must carry the same attributes)."""
        if not parts:
            raise ValueError("Samples.concat needs at least one part")
        keys = set(parts[0].attrs)
        return Samples(
            torch.cat([p.x for p in parts]),
            torch.cat([p.y for p in parts]),
            {k: torch.cat([p.attrs[k] for p in parts]) for k in keys},
        )


@dataclass(frozen=True)
class PartitionReport:
    """Per-client sample counts, overall and per class (``counts[client][class]``)."""

    counts: list[list[int]]
    class_names: list[str]

    @property
    def sizes(self) -> list[int]:
        return [sum(row) for row in self.counts]

    def to_dict(self) -> dict:
        return {"class_names": self.class_names, "counts": self.counts, "sizes": self.sizes}

    def to_markdown(self) -> str:
        head = "| client | n | " + " | ".join(self.class_names) + " |"
        rule = "|---" * (len(self.class_names) + 2) + "|"
        rows = [f"| {i} | {sum(r)} | " + " | ".join(str(c) for c in r) + " |" for i, r in enumerate(self.counts)]
        return "\n".join([head, rule, *rows])


@dataclass
class Federation:
    """A federated dataset: one training split per client plus evaluation sets.

    Attributes:
        name: a short description (dataset + partition) used in reports.
        clients: the training samples of each client (client ids are list positions).
        num_classes: the number of label values (2 for binary tasks, labels in {0, 1}).
        client_tests: optional held-out samples of each client (personalised evaluation).
        client_validations: optional validation samples of each client, drawn from its training
            rows (personalised model selection; disjoint from ``clients`` and ``client_tests``).
        validation: optional global validation set.
        test: optional global test set.
        class_names: display names of the classes.
        info: free-form metadata (dataset parameters, positive ratios, ...).
    """

    name: str
    clients: list[Samples]
    num_classes: int
    client_tests: list[Samples] | None = None
    client_validations: list[Samples] | None = None
    validation: Samples | None = None
    test: Samples | None = None
    class_names: list[str] | None = None
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.clients:
            raise ValueError("Federation needs at least one client")
        if self.client_tests is not None and len(self.client_tests) != len(self.clients):
            raise ValueError(f"Federation: {len(self.client_tests)} client test splits for {len(self.clients)} clients")
        if self.client_validations is not None and len(self.client_validations) != len(self.clients):
            raise ValueError(
                f"Federation: {len(self.client_validations)} client validation splits for {len(self.clients)} clients"
            )
        if self.class_names is None:
            self.class_names = [str(c) for c in range(self.num_classes)]

    def client_splits(self, split: str) -> list[Samples] | None:
        """The per-client splits named ``split`` (``"test"`` or ``"validation"``), or None."""
        if split not in ("test", "validation"):
            raise ValueError(f"Federation.client_splits: unknown split {split!r}; allowed: test, validation")
        return self.client_tests if split == "test" else self.client_validations

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def client_sizes(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.clients)

    def class_counts(self) -> list[list[int]]:
        """``counts[client][class]`` of the training splits (labels must be integer classes)."""
        out = []
        for c in self.clients:
            y = c.y.long().reshape(-1)
            out.append(torch.bincount(y, minlength=self.num_classes).tolist())
        return out

    def partition_report(self) -> PartitionReport:
        """Counts per client and class; regression targets (float labels) get one "all" column."""
        if any(c.y.is_floating_point() for c in self.clients):
            return PartitionReport([[len(c)] for c in self.clients], ["all"])
        return PartitionReport(self.class_counts(), list(self.class_names or []))

    def pooled(self) -> Samples:
        """All clients' training samples in one split (for centralised training)."""
        return Samples.concat(self.clients)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Federation:
        def conv(s: Samples | None) -> Samples | None:
            return None if s is None else s.to(dtype, device)

        return Federation(
            name=self.name,
            clients=[c.to(dtype, device) for c in self.clients],
            num_classes=self.num_classes,
            client_tests=None if self.client_tests is None else [c.to(dtype, device) for c in self.client_tests],
            client_validations=None
            if self.client_validations is None
            else [c.to(dtype, device) for c in self.client_validations],
            validation=conv(self.validation),
            test=conv(self.test),
            class_names=self.class_names,
            info=dict(self.info),
        )
