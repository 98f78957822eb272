"""The benchmark model as a plain ``nn.Sequential``, shared by ``simulation_speed.py`` and
``flower_workload.py`` (which runs in ``.venv-bench`` and must not import fedrisk).

Example:
    >>> [type(m).__name__ for m in mlp([128])]
    ['Linear', 'ReLU', 'Linear']
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def mlp(hidden: Sequence[int], inputs: int = 64, outputs: int = 10) -> nn.Sequential:
    """``inputs``-hidden-...-``outputs`` with ReLUs between (logistic regression for ``hidden=[]``);
    the same layers and parameter order as fedrisk's ``mlp`` / ``logreg`` models."""
    widths = [inputs, *hidden, outputs]
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
