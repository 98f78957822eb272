"""``fedrisk list [KIND [NAME]]``: the registered components of each kind (read from the
source by :mod:`fedrisk.catalog`, without importing torch), or one component's config keys with
their types and defaults.

Example:
    >>> _details("partitioners", "iid")[0]  # doctest: +ELLIPSIS
    'iid: ...'
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from typing import Any

from fedrisk.errors import FedriskError

__all__ = ["KINDS", "cmd_list"]


KINDS = (
    "algorithms",
    "datasets",
    "partitioners",
    "models",
    "aggregators",
    "objectives",
    "executors",
    "metrics",
    "attacks",
)


def _entries(kind: str, catalog: dict[str, list[tuple[str, str]]] | None = None) -> list[tuple[str, str]]:
    if catalog is not None:  # read from the source: no torch import (fedrisk.catalog)
        entries = catalog[kind]
        if kind == "objectives":
            return [("auto", _AUTO_OBJECTIVE), *entries]
        return entries
    if kind == "objectives":
        from fedrisk.objectives.supervised import LOSSES

        return [("auto", _AUTO_OBJECTIVE)] + [(name, desc) for name, (_, desc) in sorted(LOSSES.items())]
    reg = _registry(kind)
    return [] if reg is None else [(e.name, e.description) for e in reg.entries()]


_AUTO_OBJECTIVE = "cross_entropy, or binary_cross_entropy for one output, or mse for regression"

_REGISTRIES = {
    "algorithms": ("fedrisk.algorithms", "ALGORITHMS"),
    "datasets": ("fedrisk.data", "DATASETS"),
    "partitioners": ("fedrisk.data", "PARTITIONERS"),
    "models": ("fedrisk.models", "MODELS"),
    "aggregators": ("fedrisk.aggregators", "AGGREGATORS"),
    "executors": ("fedrisk.runtime", "EXECUTORS"),
    "metrics": ("fedrisk.metrics", "METRICS"),
    "attacks": ("fedrisk.attacks", "ATTACKS"),
}


def _registry(kind: str) -> Any:
    """The registry of ``kind`` (None for kinds without one, or no attacks registered)."""
    if kind not in _REGISTRIES:
        return None
    module, attr = _REGISTRIES[kind]
    return getattr(importlib.import_module(module), attr, None)


def _details(kind: str, name: str) -> list[str]:
    """The config keys of one component: name, type, default."""
    from fedrisk.experiment.schema import REQUIRED, algorithm_fields, format_value, short, signature_options

    reg = _registry(kind)
    if reg is None:
        raise FedriskError(
            f"`fedrisk list {kind} NAME` is not available; details exist for algorithms, datasets, "
            "partitioners, models, aggregators and attacks"
        )
    obj = reg.get(name)
    desc = next(e.description for e in reg.entries() if e.name == name)
    lines = [f"{name}: {desc}", ""]
    if kind == "algorithms":
        fields = algorithm_fields(obj)
        rows = [(k, short(t), "(required)" if d is REQUIRED else format_value(d)) for k, (t, d) in fields.hyper.items()]
        if fields.aggregator:
            rows.append(("aggregator", "name | table", "algorithm default (`fedrisk list aggregators`)"))
        if fields.server_opt:
            rows += [
                ("server_lr", "float", "1.0"),
                ("server_momentum", "float", "0.0"),
                ("server_nesterov", "bool", "false"),
                ("server_optimizer", "str", '"sgd"'),
            ]
        header = "[algorithm] keys"
        if fields.loss:
            lines.append("objective: [objective] name (`fedrisk list objectives`)")
        else:
            lines.append("objective: defined by the algorithm's own keys below")
    else:
        skip = {"datasets": ("data_root",), "partitioners": ("num_clients", "seed")}.get(kind, ())
        positional = {"partitioners": 1, "models": 2}.get(kind, 0)
        opts = signature_options(obj, exclude=skip, skip_positional=positional)
        rows = [
            (k, short(t) if t is not None else "any", "(required)" if d is REQUIRED else format_value(d))
            for k, (t, d) in opts.items()
        ]
        header = {
            "datasets": "[data.dataset_options] keys",
            "partitioners": '[data.partition_options] keys (plus on = "label" | "class" | an attribute)',
            "models": "[model] keys (beside name)",
            "aggregators": "algorithm.aggregator options",
            "attacks": "[attack] keys (beside name, byzantine / num_byzantine)",
        }.get(kind, "options")
    lines.append(header + ":")
    if not rows:
        lines.append("  (none)")
    width = max((len(r[0]) for r in rows), default=0)
    twidth = max((len(r[1]) for r in rows), default=0)
    lines += [f"  {k:<{width}}  {t:<{twidth}}  default {d}" for k, t, d in rows]
    doc = inspect.getdoc(obj) or ""
    if doc:
        lines += ["", doc.split("\n\n")[0]]
    return lines


def cmd_list(args: argparse.Namespace) -> int:
    kinds = KINDS
    if args.kind is not None:
        kind = args.kind if args.kind in KINDS else args.kind + "s"
        if kind not in KINDS:
            from fedrisk.errors import unknown_name

            raise unknown_name("kind", args.kind, KINDS)
        if args.name is not None:
            print("\n".join(_details(kind, args.name)))
            return 0
        kinds = (kind,)
    elif args.name is not None:
        raise FedriskError("give a kind before a name, e.g. `fedrisk list algorithms fedavg`")
    from fedrisk.catalog import catalog

    found = catalog()
    blocks = []
    for kind in kinds:
        entries = _entries(kind, found)
        if not entries and args.kind is None:
            continue
        width = max((len(n) for n, _ in entries), default=0)
        block = [kind] + [f"  {n:<{width}}  {d}" for n, d in entries]
        if not entries:
            block.append("  (none registered)")
        blocks.append("\n".join(block))
    print("\n\n".join(blocks))
    return 0
