"""Models: the model zoo (with the papers' ResNet-18 / ResNet-20 / DenseNet-121) and the
functional (parameter-dict) interface, BatchNorm running statistics included.

Example:
    >>> import torch
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> fm = FunctionalModel(build_model("logreg", (4,), 3))
    >>> fm.apply(fm.init_params(seed=1), torch.zeros(2, 4)).shape
    torch.Size([2, 3])
"""

import fedrisk.models.games  # noqa: F401  (registers affine_generator, vector)
from fedrisk.models.densenet import DenseNet, densenet121
from fedrisk.models.functional import FunctionalModel, Params, flatten, stack_params, unflatten
from fedrisk.models.resnet import ResNet18, resnet18
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
    "DenseNet",
    "FessCNN",
    "FunctionalModel",
    "LogReg",
    "Params",
    "ResNet18",
    "ResNet20",
    "build_model",
    "densenet121",
    "flatten",
    "resnet18",
    "stack_params",
    "unflatten",
]
