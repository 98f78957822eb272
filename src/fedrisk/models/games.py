r"""Parameter containers of FESS-GDA's synthetic games (spec ``shared/specs/001_fessgda.md``).

* ``affine_generator`` — the 1-D WGAN generator of §4.1, ``G_{μ,σ}(z) = μ + σ z`` (parameters
  ``mu``, ``sigma``; initial values are options, the paper gives none; spec §6-10 asks for
  ``σ > 0`` at the start).
* ``vector`` — a bare parameter vector ``x ∈ R^{num_outputs}`` (the NC-SC quadratic game's
  ``x``); its output is ``x`` itself, repeated for every input row.

Example:
    >>> import torch
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> g = FunctionalModel(build_model("affine_generator", (1,), 1))
    >>> p = g.init_params(0)
    >>> sorted(p), g.apply(p, torch.tensor([[0.0], [2.0]])).tolist()
    (['mu', 'sigma'], [1.0, 3.0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from fedrisk.errors import FedriskError, check_range
from fedrisk.models.zoo import MODELS

__all__ = ["AffineGenerator", "ParameterVector"]


class AffineGenerator(nn.Module):
    """``z -> mu + sigma * z[:, 0]`` (output ``[N]``)."""

    def __init__(self, mu: float, sigma: float) -> None:
        super().__init__()
        self.mu0, self.sigma0 = float(mu), float(sigma)
        self.mu = nn.Parameter(torch.empty(()))
        self.sigma = nn.Parameter(torch.empty(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.mu.fill_(self.mu0)
            self.sigma.fill_(self.sigma0)

    def forward(self, z: Tensor) -> Tensor:
        return self.mu + self.sigma * z.reshape(z.shape[0], -1)[:, 0]

    @staticmethod
    def functional_forward(params: Mapping[str, Tensor], z: Tensor) -> Tensor:
        """``forward`` with the parameters given (no ``functional_call`` overhead)."""
        return params["mu"] + params["sigma"] * z.reshape(z.shape[0], -1)[:, 0]


class ParameterVector(nn.Module):
    """A vector parameter ``x`` (``init`` everywhere); ``forward`` returns ``x`` for every row."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.init = float(init)
        self.x = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.x.fill_(self.init)

    def forward(self, inputs: Tensor) -> Tensor:
        return self.x.expand(inputs.shape[0], -1)

    @staticmethod
    def functional_forward(params: Mapping[str, Tensor], inputs: Tensor) -> Tensor:
        """``forward`` with the parameters given."""
        return params["x"].expand(inputs.shape[0], -1)


@MODELS.register("affine_generator", "1-D WGAN generator mu + sigma z (FESS-GDA §4.1; options mu, sigma)")
def affine_generator(input_shape: Sequence[int], num_outputs: int, *, mu: float = 1.0, sigma: float = 1.0) -> nn.Module:
    """Build :class:`AffineGenerator` (inputs ``[N, 1]``: the noise ``z``)."""
    if tuple(input_shape) != (1,) or num_outputs != 1:
        raise FedriskError(
            f"model 'affine_generator' takes 1-D noise and has one output; got input_shape {tuple(input_shape)}, "
            f"num_outputs {num_outputs}"
        )
    return AffineGenerator(mu, sigma)


@MODELS.register("vector", "a bare parameter vector of size num_outputs (the x of a synthetic game)")
def vector(input_shape: Sequence[int], num_outputs: int, *, init: float = 0.0) -> nn.Module:
    """Build :class:`ParameterVector` of dimension ``num_outputs``."""
    check_range("model 'vector': num_outputs", num_outputs, 1)
    return ParameterVector(int(num_outputs), init)
