"""The model zoo: networks built by name from :data:`MODELS`.

Every model maps an input batch ``[N, *input_shape]`` to ``[N, num_outputs]`` (so a one-output
scorer gives ``[N, 1]``).  The small ones here keep no running statistics (GroupNorm or no
normalisation); ``resnet20(norm="batch")``, ``resnet18`` (:mod:`fedrisk.models.resnet`) and
``densenet121`` (:mod:`fedrisk.models.densenet`) have BatchNorm, whose running statistics
are federated state (:mod:`fedrisk.runtime.norm_stats`).  All work with
``torch.func.functional_call`` and ``torch.func.vmap`` (see
:class:`fedrisk.models.functional.FunctionalModel`).  Inputs may also arrive flattened
(``[N, prod(input_shape)]``): image models reshape them to ``[N, C, H, W]``.

Every factory has the signature ``factory(input_shape, num_outputs, **options)`` and accepts
``output_activation`` in ``{None, "none", "sigmoid"}``; ``"sigmoid"`` squashes the outputs
into ``[0, 1]`` (the scores used by the AUC losses).  Use :func:`build_model` to build from a
config; it turns bad names and options into :class:`~fedrisk.errors.FedriskError`.

Example:
    >>> import torch
    >>> net = build_model("cnn", (3, 32, 32), 10)
    >>> net(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    >>> scorer = build_model("mlp", (64,), 1, hidden=[32], output_activation="sigmoid")
    >>> scores = scorer(torch.randn(5, 64))
    >>> scores.shape, bool(((scores > 0) & (scores < 1)).all())
    (torch.Size([5, 1]), True)
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.registry import Registry

__all__ = [
    "MLP",
    "MODELS",
    "OUTPUT_ACTIVATIONS",
    "FessCNN",
    "LogReg",
    "ResNet20",
    "build_model",
    "cnn",
    "logreg",
    "mlp",
    "resnet20",
]

OUTPUT_ACTIVATIONS = ("none", "sigmoid")
"""Allowed ``output_activation`` values (``None`` means ``"none"``)."""

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")
"""Model factories ``factory(input_shape, num_outputs, **options) -> nn.Module`` by name."""


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------


def _shape(input_shape: Sequence[int], model: str) -> tuple[int, ...]:
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d < 1 for d in shape):
        raise FedriskError(
            f"model {model!r}: input_shape must be a non-empty tuple of positive sizes "
            f"(the shape of one sample); got {tuple(input_shape)}"
        )
    return shape


def _image_shape(input_shape: Sequence[int], model: str) -> tuple[int, int, int]:
    shape = _shape(input_shape, model)
    if len(shape) != 3:
        raise FedriskError(
            f"model {model!r} needs an image input_shape (channels, height, width); "
            f"got {shape}. Use 'mlp' or 'logreg' for flat features"
        )
    return shape  # type: ignore[return-value]


def _activation(output_activation: str | None) -> str:
    name = "none" if output_activation is None else str(output_activation)
    if name not in OUTPUT_ACTIVATIONS:
        raise unknown_name("output_activation", name, OUTPUT_ACTIVATIONS)
    return name


def _sizes(values: Sequence[int], option: str, model: str) -> tuple[int, ...]:
    if isinstance(values, (int, str)) or not all(isinstance(v, int) for v in values):
        raise FedriskError(f"model {model!r}: option {option!r} must be a list of positive integers; got {values!r}")
    for v in values:
        check_range(f"model {model!r}: each entry of {option!r}", v, 1)
    return tuple(values)


class _ZooModel(nn.Module):
    """Shared plumbing: the sample shape and the optional output activation."""

    def __init__(self, input_shape: tuple[int, ...], output_activation: str | None) -> None:
        super().__init__()
        self.input_shape = input_shape
        self.output_activation = _activation(output_activation)

    def _finish(self, out: Tensor) -> Tensor:
        return torch.sigmoid(out) if self.output_activation == "sigmoid" else out


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------


class LogReg(_ZooModel):
    """A single linear layer on the flattened input (logistic / softmax regression);
    ``bias=False`` drops the intercept (PERM's synthetic experiment, spec 003 pitfall P11)."""

    def __init__(
        self, input_shape: tuple[int, ...], num_outputs: int, output_activation: str | None = None, bias: bool = True
    ) -> None:
        super().__init__(input_shape, output_activation)
        self.linear = nn.Linear(math.prod(input_shape), num_outputs, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self._finish(self.linear(x.flatten(1)))

    def functional_forward(self, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """``forward`` as a pure function of ``params`` (skips functional_call's overhead)."""
        return self._finish(F.linear(x.flatten(1), params["linear.weight"], params.get("linear.bias")))


class MLP(_ZooModel):
    """Fully connected ReLU network on the flattened input: ``in -> hidden... -> out``.

    ``linear_names`` lists its linear layers' parameter prefixes, input first (``layers.0``,
    ``layers.2``, ...), for code that works on the layers directly (the fused local SGD of
    :mod:`fedrisk.algorithms.fused`).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_outputs: int,
        hidden: Sequence[int] = (128,),
        output_activation: str | None = None,
    ) -> None:
        super().__init__(input_shape, output_activation)
        widths = [math.prod(input_shape), *hidden]
        layers: list[nn.Module] = []
        for w_in, w_out in itertools.pairwise(widths):
            layers += [nn.Linear(w_in, w_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_outputs))
        self.layers = nn.Sequential(*layers)
        self.linear_names = [f"layers.{i}" for i, m in enumerate(self.layers) if isinstance(m, nn.Linear)]

    def forward(self, x: Tensor) -> Tensor:
        return self._finish(self.layers(x.flatten(1)))

    def functional_forward(self, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """``forward`` as a pure function of ``params`` (skips functional_call's overhead)."""
        h = x.flatten(1)
        last = len(self.linear_names) - 1
        for i, name in enumerate(self.linear_names):
            h = F.linear(h, params[f"{name}.weight"], params[f"{name}.bias"])
            if i < last:
                h = torch.relu(h)
        return self._finish(h)


class FessCNN(_ZooModel):
    """The CNN of FESS-GDA's Table 3 (fair CIFAR-10 classification).

    ``[conv3x3(pad 1) + ReLU + maxpool2]`` for each entry of ``channels`` (16, 32, 64), then
    ``[FC + ReLU]`` for each entry of ``hidden`` (512, 64), then an FC output layer.  The
    flattened size is ``channels[-1] * (H // 2**k) * (W // 2**k)`` for ``k`` conv stages:
    1024 for 32x32 CIFAR (581,866 parameters with 10 outputs), 576 for 28x28 MNIST.
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_outputs: int,
        channels: Sequence[int] = (16, 32, 64),
        hidden: Sequence[int] = (512, 64),
        output_activation: str | None = None,
    ) -> None:
        super().__init__(input_shape, output_activation)
        c, h, w = input_shape
        convs: list[nn.Module] = []
        for c_in, c_out in zip([c, *channels[:-1]], channels):
            convs += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*convs)
        flat = channels[-1] * (h >> len(channels)) * (w >> len(channels))
        widths = [flat, *hidden]
        fcs: list[nn.Module] = []
        for w_in, w_out in itertools.pairwise(widths):
            fcs += [nn.Linear(w_in, w_out), nn.ReLU()]
        fcs.append(nn.Linear(widths[-1], num_outputs))
        self.classifier = nn.Sequential(*fcs)
        self._conv_names = [f"features.{i}" for i, m in enumerate(self.features) if isinstance(m, nn.Conv2d)]
        self._fc_names = [f"classifier.{i}" for i, m in enumerate(self.classifier) if isinstance(m, nn.Linear)]

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], *self.input_shape)
        return self._finish(self.classifier(self.features(x).flatten(1)))

    def functional_forward(self, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """``forward`` as a pure function of ``params``: the same operations as the modules
        (skips functional_call's per-call overhead, ~5% of a small CNN's local step)."""
        h = x.reshape(x.shape[0], *self.input_shape)
        for name in self._conv_names:
            h = F.conv2d(h, params[f"{name}.weight"], params[f"{name}.bias"], padding=1)
            h = F.max_pool2d(torch.relu(h), 2)
        h = h.flatten(1)
        last = len(self._fc_names) - 1
        for i, name in enumerate(self._fc_names):
            h = F.linear(h, params[f"{name}.weight"], params[f"{name}.bias"])
            if i < last:
                h = torch.relu(h)
        return self._finish(h)


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


class _PadShortcut(nn.Module):
    """He et al.'s parameter-free "option A" shortcut: subsample, zero-pad the channels."""

    def __init__(self, extra_channels: int) -> None:
        super().__init__()
        self.extra = extra_channels

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, :, ::2, ::2]
        return F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


def _norm(norm: str, groups: int, channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if norm == "batch" else nn.GroupNorm(groups, channels)


class BasicBlock(nn.Module):
    """Two 3x3 conv + GroupNorm (or BatchNorm) layers with a residual connection."""

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int, shortcut: str, norm: str = "group") -> None:
        super().__init__()
        self.conv1 = _conv3x3(c_in, c_out, stride)
        self.norm1 = _norm(norm, groups, c_out)
        self.conv2 = _conv3x3(c_out, c_out)
        self.norm2 = _norm(norm, groups, c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            if shortcut == "pad":
                self.shortcut = _PadShortcut(c_out - c_in)
            else:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                    _norm(norm, groups, c_out),
                )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(_ZooModel):
    """CIFAR ResNet-20 (He et al. 2016) with GroupNorm (default) or the paper's BatchNorm
    (``norm="batch"``).

    A 3x3 conv stem (16 channels), three stages of three :class:`BasicBlock` with 16 / 32 /
    64 channels (stride 2 at the start of stages 2 and 3), global average pooling and a
    linear head.  ``shortcut="pad"`` is the paper's parameter-free option A (269,722
    parameters with 10 outputs); ``"conv"`` uses 1x1 conv + GroupNorm projections (option B).
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_outputs: int,
        num_groups: int = 2,
        shortcut: str = "pad",
        output_activation: str | None = None,
        norm: str = "group",
    ) -> None:
        super().__init__(input_shape, output_activation)
        self.stem = nn.Sequential(_conv3x3(input_shape[0], 16), _norm(norm, num_groups, 16), nn.ReLU())
        blocks: list[nn.Module] = []
        c_in = 16
        for stage, c_out in enumerate((16, 32, 64)):
            for i in range(3):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(c_in, c_out, stride, num_groups, shortcut, norm))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(64, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], *self.input_shape)
        x = self.blocks(self.stem(x))
        return self._finish(self.head(x.mean(dim=(2, 3))))


# --------------------------------------------------------------------------------------------
# factories
# --------------------------------------------------------------------------------------------


def _check_outputs(num_outputs: int, model: str) -> int:
    check_range(f"model {model!r}: num_outputs", num_outputs, 1)
    return int(num_outputs)


@MODELS.register("logreg", "linear layer on the flattened input (logistic regression)")
def logreg(
    input_shape: Sequence[int], num_outputs: int, *, output_activation: str | None = None, bias: bool = True
) -> nn.Module:
    """Build :class:`LogReg` (``bias=False``: no intercept).

    Example:
        >>> logreg((1, 28, 28), 10).linear.weight.shape, logreg((3,), 2, bias=False).linear.bias
        (torch.Size([10, 784]), None)
    """
    shape = _shape(input_shape, "logreg")
    return LogReg(shape, _check_outputs(num_outputs, "logreg"), output_activation, bias=bias)


@MODELS.register("mlp", "ReLU multilayer perceptron on the flattened input (option: hidden)")
def mlp(
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    hidden: Sequence[int] = (128,),
    output_activation: str | None = None,
) -> nn.Module:
    """Build :class:`MLP` with hidden widths ``hidden`` (default one layer of 128; ``[]``
    gives logistic regression).

    Example:
        >>> sum(p.numel() for p in mlp((64,), 10, hidden=[128]).parameters())
        9610
    """
    shape = _shape(input_shape, "mlp")
    hidden = _sizes(hidden, "hidden", "mlp")
    return MLP(shape, _check_outputs(num_outputs, "mlp"), hidden, output_activation)


@MODELS.register("cnn", "FESS-GDA Table 3 CNN: 3x[conv3x3+ReLU+maxpool] 16/32/64, FC 512-64")
def cnn(
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    channels: Sequence[int] = (16, 32, 64),
    hidden: Sequence[int] = (512, 64),
    output_activation: str | None = None,
) -> nn.Module:
    """Build :class:`FessCNN`; ``channels`` / ``hidden`` shrink it for small images (e.g.
    ``channels=[16, 32], hidden=[64]`` for 8x8 digits).

    Example:
        >>> sum(p.numel() for p in cnn((3, 32, 32), 10).parameters())
        581866
    """
    shape = _image_shape(input_shape, "cnn")
    channels = _sizes(channels, "channels", "cnn")
    hidden = _sizes(hidden, "hidden", "cnn")
    if not channels:
        raise FedriskError("model 'cnn': option 'channels' needs at least one conv layer")
    side = min(shape[1:])
    if side >> len(channels) < 1:
        raise FedriskError(
            f"model 'cnn': {len(channels)} conv+pool stages need images of at least "
            f"{2 ** len(channels)}x{2 ** len(channels)} pixels; got input_shape {shape}. "
            "Use fewer 'channels'"
        )
    return FessCNN(shape, _check_outputs(num_outputs, "cnn"), channels, hidden, output_activation)


@MODELS.register("resnet20", "CIFAR ResNet-20, GroupNorm or BatchNorm (options: norm, num_groups, shortcut)")
def resnet20(
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    num_groups: int = 2,
    shortcut: str = "pad",
    output_activation: str | None = None,
    norm: str = "group",
) -> nn.Module:
    """Build :class:`ResNet20`; ``num_groups`` must divide 16 (1, 2, 4, 8 or 16),
    ``shortcut`` is ``"pad"`` (option A, default) or ``"conv"`` (option B) and ``norm`` is
    ``"group"`` (default) or ``"batch"`` (the paper's BatchNorm, with running statistics).

    Example:
        >>> sum(p.numel() for p in resnet20((3, 32, 32), 10).parameters())
        269722
    """
    shape = _image_shape(input_shape, "resnet20")
    if num_groups not in (1, 2, 4, 8, 16):
        raise FedriskError(
            f"model 'resnet20': num_groups = {num_groups!r} must divide every stage width "
            "(16, 32, 64); allowed: 1, 2, 4, 8, 16"
        )
    if shortcut not in ("pad", "conv"):
        raise unknown_name("resnet20 shortcut", str(shortcut), ["pad", "conv"])
    if norm not in ("group", "batch"):
        raise unknown_name("resnet20 norm", str(norm), ["group", "batch"])
    outputs = _check_outputs(num_outputs, "resnet20")
    return ResNet20(shape, outputs, num_groups, shortcut, output_activation, norm)


def build_model(name: str, input_shape: Sequence[int], num_outputs: int, **options: Any) -> nn.Module:
    """Build the model registered as ``name``, checking ``options`` against its factory.

    Example:
        >>> type(build_model("logreg", (5,), 1, output_activation="sigmoid")).__name__
        'LogReg'
    """
    factory = MODELS.get(name)
    allowed = [
        p.name for p in inspect.signature(factory).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    for key in options:
        if key not in allowed:
            raise unknown_name(f"{name} option", key, allowed)
    return factory(tuple(input_shape), num_outputs, **options)
