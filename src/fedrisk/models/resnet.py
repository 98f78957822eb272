"""ResNet-18 (He et al. 2016) with BatchNorm, in torchvision's layout.

The five papers' image experiments use ResNet-18 / ResNet-20 / DenseNet-121.  torchvision's
builds are not imported (its wheel is tied to a CUDA build of torch that the CPU install does
not match, and fedrisk downloads nothing); this is a transcription of the same architecture,
with the same module names, so that a ``state_dict`` of torchvision's ``resnet18`` loads into
``resnet18(..., stem="imagenet")`` (``run.init_from`` a ``.pt`` file of it; the
``num_batches_tracked`` counters are ignored).

* ``stem="cifar"`` (default): a 3x3 stride-1 convolution and no max-pool, the CIFAR variant
  of the papers' code (LibAUC's / kuangliu's ResNet-18) for 32x32 and 28x28 inputs;
* ``stem="imagenet"``: torchvision's 7x7 stride-2 convolution and 3x3 max-pool.

Then four stages of two :class:`BasicBlock` (64, 128, 256, 512 channels; stride 2 at the start
of stages 2-4, with a 1x1 convolution + BatchNorm projection, He et al.'s option B), global
average pooling and a linear head ``fc``.  ``norm="group"`` swaps every BatchNorm for a
GroupNorm of ``num_groups`` groups (no running statistics).

Example:
    >>> import torch
    >>> net = resnet18((3, 32, 32), 10)
    >>> net(torch.zeros(2, 3, 32, 32)).shape, sum(p.numel() for p in net.parameters())
    (torch.Size([2, 10]), 11173962)
    >>> [n for n, _ in net.named_parameters()][:4]
    ['conv1.weight', 'bn1.weight', 'bn1.bias', 'layer1.0.conv1.weight']
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from fedrisk.errors import FedriskError, unknown_name
from fedrisk.models.zoo import MODELS, _check_outputs, _image_shape, _ZooModel

__all__ = ["BasicBlock", "ResNet18", "norm_layer", "resnet18"]

NORMS = ("batch", "group")


def norm_layer(norm: str, channels: int, num_groups: int) -> nn.Module:
    """``BatchNorm2d(channels)`` or ``GroupNorm(num_groups, channels)``."""
    return nn.BatchNorm2d(channels) if norm == "batch" else nn.GroupNorm(num_groups, channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with normalisation and a residual connection (torchvision's
    ``BasicBlock``: ``conv1, bn1, conv2, bn2, downsample``)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, num_groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(norm, c_out, num_groups)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = norm_layer(norm, c_out, num_groups)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), norm_layer(norm, c_out, num_groups)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(_ZooModel):
    """ResNet-18; see the module docstring."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_outputs: int,
        stem: str = "cifar",
        norm: str = "batch",
        num_groups: int = 32,
        widths: Sequence[int] = (64, 128, 256, 512),
        output_activation: str | None = None,
    ) -> None:
        super().__init__(input_shape, output_activation)
        c0 = widths[0]
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(input_shape[0], c0, 7, stride=2, padding=3, bias=False)
        else:
            self.conv1 = nn.Conv2d(input_shape[0], c0, 3, stride=1, padding=1, bias=False)
        self.bn1 = norm_layer(norm, c0, num_groups)
        self.relu = nn.ReLU()
        self.maxpool: nn.Module = nn.MaxPool2d(3, stride=2, padding=1) if stem == "imagenet" else nn.Identity()
        c_in = c0
        for i, c_out in enumerate(widths):
            stride = 1 if i == 0 else 2
            blocks = [BasicBlock(c_in, c_out, stride, norm, num_groups), BasicBlock(c_out, c_out, 1, norm, num_groups)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
            c_in = c_out
        self.fc = nn.Linear(c_in, num_outputs)
        self.num_stages = len(widths)

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], *self.input_shape)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self._finish(self.fc(x.mean(dim=(2, 3))))


@MODELS.register("resnet18", "ResNet-18 with BatchNorm, torchvision layout (options: stem, norm, widths)")
def resnet18(
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    stem: str = "cifar",
    norm: str = "batch",
    num_groups: int = 32,
    widths: Sequence[int] = (64, 128, 256, 512),
    output_activation: str | None = None,
) -> nn.Module:
    """Build :class:`ResNet18`: ``stem`` ``"cifar"`` (3x3, for 28x28 / 32x32 inputs) or
    ``"imagenet"`` (7x7 + max-pool, torchvision's), ``norm`` ``"batch"`` or ``"group"``,
    ``widths`` the four stage widths (smaller ones for quick tests), the input channels from
    ``input_shape``.

    Example:
        >>> sum(p.numel() for p in resnet18((1, 28, 28), 1, widths=[4, 8, 8, 8]).parameters())
        7685
    """
    shape = _image_shape(input_shape, "resnet18")
    if stem not in ("cifar", "imagenet"):
        raise unknown_name("resnet18 stem", str(stem), ["cifar", "imagenet"])
    if norm not in NORMS:
        raise unknown_name("resnet18 norm", str(norm), NORMS)
    widths = tuple(int(w) for w in widths)
    if len(widths) != 4 or min(widths) < 1:
        raise FedriskError(f"model 'resnet18': widths must be four positive stage widths; got {list(widths)}")
    if norm == "group" and any(w % num_groups for w in widths):
        raise FedriskError(f"model 'resnet18': num_groups = {num_groups} must divide every stage width {list(widths)}")
    return ResNet18(shape, _check_outputs(num_outputs, "resnet18"), stem, norm, num_groups, widths, output_activation)
