"""Models: the BatchNorm-free model zoo and the functional (parameter-dict) interface.

Example:
    >>> import torch
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> fm = FunctionalModel(build_model("logreg", (4,), 3))
    >>> fm.apply(fm.init_params(seed=1), torch.zeros(2, 4)).shape
    torch.Size([2, 3])
"""

import fedrisk.models.games  # noqa: F401  (registers affine_generator, vector)
from fedrisk.models.functional import FunctionalModel, Params, flatten, stack_params, unflatten
from fedrisk.models.zoo import (
    MLP,
    MODELS,
    OUTPUT_ACTIVATIONS,
    FessCNN,
    LogReg,
    ResNet20,
    build_model,
)

__all__ = [
    "MLP",
    "MODELS",
    "OUTPUT_ACTIVATIONS",
    "FessCNN",
    "FunctionalModel",
    "LogReg",
    "Params",
    "ResNet20",
    "build_model",
    "flatten",
    "stack_params",
    "unflatten",
]
