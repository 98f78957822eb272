"""DenseNet (Huang et al. 2017) with BatchNorm, in torchvision's layout.

A transcription of torchvision's ``DenseNet`` (not imported: see :mod:`fedrisk.models.resnet`)
with the same module names (``features.conv0``, ``features.denseblock1.denselayer1.norm1``,
``features.transition1.conv``, ``features.norm5``, ``classifier``), so a ``state_dict`` of
torchvision's ``densenet121`` loads into ``densenet121(..., stem="imagenet")``.

Each dense layer is the bottleneck ``BN-ReLU-Conv1x1(bn_size * k)-BN-ReLU-Conv3x3(k)`` whose
``k = growth_rate`` new channels are concatenated to its input (eq. 2 of the paper); each
transition halves the channels (compression 0.5) with ``BN-ReLU-Conv1x1`` and a 2x2 average
pool.  ``block_config`` counts the layers per dense block: ``(6, 12, 24, 16)`` with
``growth_rate = 32`` and 64 initial features is DenseNet-121; smaller values give a smaller
DenseNet with the same blocks.  ``stem="cifar"`` (default) starts with a 3x3 stride-1
convolution and no pooling (for 28x28 / 32x32 inputs), ``"imagenet"`` with torchvision's 7x7
stride-2 convolution, BN-ReLU and 3x3 max-pool.

Example:
    >>> import torch
    >>> net = densenet121((3, 32, 32), 10)
    >>> net(torch.zeros(2, 3, 32, 32)).shape, sum(p.numel() for p in net.parameters())
    (torch.Size([2, 10]), 6956298)
    >>> tiny = densenet121((1, 28, 28), 1, growth_rate=4, block_config=[1, 1], num_init_features=8)
    >>> tiny(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 1])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.models.zoo import MODELS, _check_outputs, _image_shape, _ZooModel

__all__ = ["DenseNet", "densenet121"]


class _DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(c_in)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(c_in, bn_size * growth_rate, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(out)))


class _DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers: int, c_in: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        for i in range(num_layers):
            self.add_module(f"denselayer{i + 1}", _DenseLayer(c_in + i * growth_rate, growth_rate, bn_size))

    def forward(self, x: Tensor) -> Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(c_in)
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(c_in, c_out, 1, bias=False)
        self.pool = nn.AvgPool2d(2, stride=2)


class DenseNet(_ZooModel):
    """DenseNet-BC; see the module docstring."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_outputs: int,
        growth_rate: int = 32,
        block_config: Sequence[int] = (6, 12, 24, 16),
        num_init_features: int = 64,
        bn_size: int = 4,
        stem: str = "cifar",
        output_activation: str | None = None,
    ) -> None:
        super().__init__(input_shape, output_activation)
        features = nn.Sequential()
        if stem == "imagenet":
            conv0 = nn.Conv2d(input_shape[0], num_init_features, 7, stride=2, padding=3, bias=False)
            features.add_module("conv0", conv0)
            features.add_module("norm0", nn.BatchNorm2d(num_init_features))
            features.add_module("relu0", nn.ReLU())
            features.add_module("pool0", nn.MaxPool2d(3, stride=2, padding=1))
        else:
            features.add_module("conv0", nn.Conv2d(input_shape[0], num_init_features, 3, padding=1, bias=False))
        c = num_init_features
        for i, num_layers in enumerate(block_config):
            features.add_module(f"denseblock{i + 1}", _DenseBlock(num_layers, c, growth_rate, bn_size))
            c += num_layers * growth_rate
            if i != len(block_config) - 1:
                features.add_module(f"transition{i + 1}", _Transition(c, c // 2))
                c //= 2
        features.add_module("norm5", nn.BatchNorm2d(c))
        self.features = features
        self.classifier = nn.Linear(c, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], *self.input_shape)
        out = F.relu(self.features(x))
        return self._finish(self.classifier(out.mean(dim=(2, 3))))


@MODELS.register("densenet121", "DenseNet-121 (BC) with BatchNorm, torchvision layout (options: block_config, ...)")
def densenet121(
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    growth_rate: int = 32,
    block_config: Sequence[int] = (6, 12, 24, 16),
    num_init_features: int = 64,
    bn_size: int = 4,
    stem: str = "cifar",
    output_activation: str | None = None,
) -> nn.Module:
    """Build :class:`DenseNet` (DenseNet-121 by default; ``block_config``, ``growth_rate``,
    ``num_init_features`` and ``bn_size`` make a smaller one with the same blocks).

    Example:
        >>> densenet121((3, 32, 32), 2, block_config=[2, 2], growth_rate=8).classifier
        Linear(in_features=56, out_features=2, bias=True)
    """
    shape = _image_shape(input_shape, "densenet121")
    if stem not in ("cifar", "imagenet"):
        raise unknown_name("densenet121 stem", str(stem), ["cifar", "imagenet"])
    blocks = tuple(int(b) for b in block_config)
    if not blocks or min(blocks) < 1:
        raise FedriskError(f"model 'densenet121': block_config must list >= 1 layers per block; got {list(blocks)}")
    side = min(shape[1:]) // (4 if stem == "imagenet" else 1)
    if side >> (len(blocks) - 1) < 1:
        raise FedriskError(
            f"model 'densenet121': {len(blocks) - 1} transitions halve {shape[1]}x{shape[2]} images below one pixel; "
            "use fewer blocks"
        )
    for name, value in (("growth_rate", growth_rate), ("num_init_features", num_init_features), ("bn_size", bn_size)):
        check_range(f"model 'densenet121': {name}", value, 1)
    outputs = _check_outputs(num_outputs, "densenet121")
    return DenseNet(shape, outputs, growth_rate, blocks, num_init_features, bn_size, stem, output_activation)
