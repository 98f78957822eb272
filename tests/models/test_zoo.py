"""Tests for fedrisk.models: zoo shapes and sizes, functional use, vmap, init determinism."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from fedrisk.errors import FedriskError
from fedrisk.models import (
    MODELS,
    FunctionalModel,
    build_model,
    flatten,
    stack_params,
    unflatten,
)

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
FLAT = (20,)
ALL_MODELS = ["cnn", "logreg", "mlp", "resnet20"]
IMAGE_MODELS = ["cnn", "resnet20"]
BATCHNORM_MODELS = ["densenet121", "resnet18"]  # tests/models/test_papers_nets.py, test_norm_stats.py
GAME_MODELS = ["affine_generator", "vector"]  # fedrisk.models.games: parameter containers of synthetic games


def conv_params(c_in: int, c_out: int, k: int = 3) -> int:
    return c_in * c_out * k * k + c_out


def fc_params(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def test_registry_names_and_descriptions() -> None:
    assert MODELS.names() == sorted(ALL_MODELS + BATCHNORM_MODELS + GAME_MODELS)
    assert all(entry.description for entry in MODELS.entries())


@pytest.mark.parametrize(
    ("name", "shape"),
    # image models need (C, H, W): flat input is tested below (test_image_models_reject_flat_input_shape)
    [(n, s) for n in ALL_MODELS for s in (MNIST, CIFAR, FLAT) if not (n in IMAGE_MODELS and s == FLAT)],
)
@pytest.mark.parametrize("outputs", [1, 10])
def test_output_shapes(name: str, shape: tuple[int, ...], outputs: int) -> None:
    model = build_model(name, shape, outputs)
    assert model(torch.randn(2, *shape)).shape == (2, outputs)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_models_reject_flat_input_shape(name: str) -> None:
    with pytest.raises(FedriskError, match=r"needs an image input_shape \(channels, height"):
        build_model(name, FLAT, 10)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_models_accept_flattened_batches(name: str) -> None:
    model = build_model(name, MNIST, 10)
    x = torch.randn(3, *MNIST)
    torch.testing.assert_close(model(x.flatten(1)), model(x))


@pytest.mark.parametrize("name", ALL_MODELS)
def test_sigmoid_scorer_head(name: str) -> None:
    model = build_model(name, (1, 8, 8), 1, output_activation="sigmoid")
    scores = model(torch.randn(6, 1, 8, 8) * 10)
    assert scores.shape == (6, 1)
    assert bool(((scores >= 0) & (scores <= 1)).all())
    plain = build_model(name, (1, 8, 8), 1, output_activation="none")
    plain.load_state_dict(model.state_dict())
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(model(x), torch.sigmoid(plain(x)))


def test_fessgda_cnn_matches_table3() -> None:
    model = build_model("cnn", CIFAR, 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (3, 16, (3, 3), (1, 1)),
        (16, 32, (3, 3), (1, 1)),
        (32, 64, (3, 3), (1, 1)),
    ]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 3
    fcs = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    assert fcs == [(1024, 512), (512, 64), (64, 10)]
    expected = (
        conv_params(3, 16) + conv_params(16, 32) + conv_params(32, 64)
        + fc_params(1024, 512) + fc_params(512, 64) + fc_params(64, 10)
    )  # fmt: skip
    assert expected == 581_866
    assert FunctionalModel(model).num_params() == expected


def test_cnn_sizes_for_mnist_and_small_digits() -> None:
    mnist = FunctionalModel(build_model("cnn", MNIST, 10))
    expected = (
        conv_params(1, 16) + conv_params(16, 32) + conv_params(32, 64)
        + fc_params(3 * 3 * 64, 512) + fc_params(512, 64) + fc_params(64, 10)
    )  # fmt: skip
    assert mnist.num_params() == expected
    digits = build_model("cnn", (1, 8, 8), 10, channels=[16, 32], hidden=[64])
    assert digits(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert FunctionalModel(digits).num_params() == (
        conv_params(1, 16) + conv_params(16, 32) + fc_params(2 * 2 * 32, 64) + fc_params(64, 10)
    )


def test_resnet20_structure_and_size() -> None:
    model = build_model("resnet20", CIFAR, 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 19  # stem + 9 blocks x 2; + the head = 20 weighted layers
    assert {m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)} == {2}
    assert FunctionalModel(model).num_params() == 269_722  # He et al.'s 0.27M (option A)
    option_b = build_model("resnet20", CIFAR, 10, shortcut="conv", num_groups=4)
    projections = 16 * 32 + 2 * 32 + 32 * 64 + 2 * 64
    assert FunctionalModel(option_b).num_params() == 269_722 + projections
    assert option_b(torch.randn(2, *CIFAR)).shape == (2, 10)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_no_batchnorm_anywhere(name: str) -> None:
    for options in ({}, {"shortcut": "conv"} if name == "resnet20" else {}):
        model = build_model(name, CIFAR, 10, **options)
        assert not any(isinstance(m, nn.modules.batchnorm._NormBase) for m in model.modules())
        assert list(model.buffers()) == []


def test_functional_model_carries_batchnorm_statistics_and_rejects_tracked_instancenorm() -> None:
    fm = FunctionalModel(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)))
    assert fm.stat_names == ["1.running_mean", "1.running_var"] and fm.norm_stats == "averaged"
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.InstanceNorm2d(4, track_running_stats=True))
    with pytest.raises(FedriskError, match=r"layer '1' \(InstanceNorm2d\) keeps running statistics.*GroupNorm"):
        FunctionalModel(net)


# ------------------------------------------------------------------------------ init


@pytest.mark.parametrize("name", ALL_MODELS)
def test_init_is_deterministic_per_seed(name: str) -> None:
    fm = FunctionalModel(build_model(name, (3, 16, 16), 10))
    before = torch.random.get_rng_state()
    a, b, c = fm.init_params(3), fm.init_params(3), fm.init_params(4)
    assert torch.equal(torch.random.get_rng_state(), before)  # global RNG untouched
    assert list(a) == [n for n, _ in fm.module.named_parameters()]
    assert all(torch.equal(a[k], b[k]) for k in a)
    weights = [k for k in a if k.endswith("weight") and a[k].dim() > 1]
    assert all(not torch.equal(a[k], c[k]) for k in weights)
    gen = torch.Generator().manual_seed(3)
    from_gen = fm.init_params(gen)
    assert all(torch.equal(a[k], from_gen[k]) for k in a)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_init_equals_pytorch_default_construction(name: str) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        model = build_model(name, (3, 16, 16), 5)
    ours = FunctionalModel(model).init_params(11)
    for key, value in model.named_parameters():
        assert torch.equal(ours[key], value.detach()), key


def test_init_float64_is_widened_float32() -> None:
    fm = FunctionalModel(build_model("mlp", FLAT, 3, hidden=[8]))
    p32, p64 = fm.init_params(0), fm.init_params(0, dtype=torch.float64)
    assert all(p64[k].dtype == torch.float64 and torch.equal(p64[k], p32[k].double()) for k in p32)


def test_init_fallback_for_other_layers_is_deterministic() -> None:
    fm = FunctionalModel(nn.Sequential(nn.Embedding(5, 3), nn.Flatten(), nn.Linear(6, 2)))
    a, b = fm.init_params(1), fm.init_params(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert fm.apply(a, torch.tensor([[0, 4]])).shape == (1, 2)


# ------------------------------------------------------------------------------ functional use


@pytest.mark.parametrize("name", ALL_MODELS)
def test_float64_forward(name: str) -> None:
    fm = FunctionalModel(build_model(name, MNIST, 10))
    params = fm.init_params(0, dtype=torch.float64)
    out = fm.apply(params, torch.randn(2, *MNIST, dtype=torch.float64))
    assert out.dtype == torch.float64 and out.shape == (2, 10)


def stacked_setup(
    name: str, dtype: torch.dtype = torch.float32, **options: Any
) -> tuple[FunctionalModel, list[dict], dict]:
    fm = FunctionalModel(build_model(name, (3, 16, 16), 4, **options))
    sets = [fm.init_params(seed, dtype=dtype) for seed in range(3)]
    return fm, sets, stack_params(sets)


@pytest.mark.parametrize("name", ALL_MODELS)
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-6), (torch.float32, 1e-5)])
def test_vmap_over_stacked_params_matches_loop(name: str, dtype: torch.dtype, tol: float) -> None:
    fm, sets, stacked = stacked_setup(name, dtype)
    x = torch.randn(5, 3, 16, 16, dtype=dtype)
    shared = fm.apply_stacked(stacked, x, shared_input=True)
    per_client_x = torch.randn(3, 5, 3, 16, 16, dtype=dtype)
    per_client = vmap(fm.apply)(stacked, per_client_x)
    assert torch.equal(per_client, fm.apply_stacked(stacked, per_client_x))
    for i, params in enumerate(sets):
        torch.testing.assert_close(shared[i], fm.apply(params, x), atol=tol, rtol=tol)
        ref = fm.apply(params, per_client_x[i])
        torch.testing.assert_close(per_client[i], ref, atol=tol, rtol=tol)


def test_vmap_over_leading_client_dimension_with_shared_params() -> None:
    fm = FunctionalModel(build_model("resnet20", (3, 16, 16), 2, num_groups=4))
    params = fm.init_params(0, dtype=torch.float64)
    x = torch.randn(3, 4, 3, 16, 16, dtype=torch.float64)
    out = vmap(fm.apply, in_dims=(None, 0))(params, x)
    loop = torch.stack([fm.apply(params, xi) for xi in x])
    torch.testing.assert_close(out, loop, atol=1e-6, rtol=1e-6)


def test_vmapped_per_client_gradients() -> None:
    fm, sets, stacked = stacked_setup("cnn", torch.float64, channels=[4, 8], hidden=[16])
    x, y = torch.randn(3, 6, 3, 16, 16, dtype=torch.float64), torch.randint(0, 4, (3, 6))

    def loss(params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(fm.apply(params, xb), yb)

    grads = vmap(grad(loss))(stacked, x, y)
    for i, params in enumerate(sets):
        ref = grad(loss)(params, x[i], y[i])
        for key in ref:
            torch.testing.assert_close(grads[key][i], ref[key], atol=1e-6, rtol=1e-5)


def test_apply_requires_every_parameter() -> None:
    fm = FunctionalModel(build_model("logreg", FLAT, 2))
    params = fm.init_params(0)
    del params["linear.bias"]
    with pytest.raises(RuntimeError, match=r"linear\.bias"):
        fm.apply(params, torch.zeros(1, *FLAT))


def test_flatten_unflatten_roundtrip() -> None:
    fm = FunctionalModel(build_model("mlp", FLAT, 3, hidden=[8, 4]))
    params = fm.init_params(0, dtype=torch.float64)
    vec = flatten(params)
    assert vec.shape == (fm.num_params(params),) and vec.dtype == torch.float64
    back = unflatten(vec, params)
    assert list(back) == list(params) and all(torch.equal(back[k], params[k]) for k in params)
    stacked = stack_params([params, fm.init_params(1, dtype=torch.float64)])
    vecs = vmap(flatten)(stacked)
    assert vecs.shape == (2, vec.shape[0]) and torch.equal(vecs[0], vec)
    assert torch.equal(vmap(unflatten, in_dims=(0, None))(vecs, params)["layers.0.weight"],
                       stacked["layers.0.weight"])  # fmt: skip
    with pytest.raises(ValueError, match=f"1-D tensor of {vec.shape[0]} values"):
        unflatten(vec[:-1], params)


# ------------------------------------------------------------------------------ config errors


@pytest.mark.parametrize(
    ("args", "options", "fragments"),
    [
        (("resnet", CIFAR, 10), {}, ["unknown model 'resnet'", "resnet20"]),
        (("mlp", FLAT, 10), {"hiden": [3]}, ["unknown mlp option 'hiden'", "'hidden'"]),
        (("mlp", FLAT, 1), {"output_activation": "relu"}, ["output_activation 'relu'", "sigmoid"]),
        (("mlp", FLAT, 0), {}, ["num_outputs = 0 is out of range"]),
        (("mlp", FLAT, 2), {"hidden": 64}, ["'hidden' must be a list of positive integers"]),
        (("mlp", FLAT, 2), {"hidden": [0]}, ["each entry of 'hidden' = 0"]),
        (("logreg", (0, 3), 2), {}, ["positive sizes"]),
        (("cnn", (1, 4, 4), 2), {}, ["at least 8x8 pixels", "fewer 'channels'"]),
        (("resnet20", CIFAR, 2), {"num_groups": 3}, ["num_groups = 3", "1, 2, 4, 8, 16"]),
        (("resnet20", CIFAR, 2), {"shortcut": "proj"}, ["shortcut 'proj'", "conv, pad"]),
    ],
)
def test_build_model_errors(args: tuple, options: dict, fragments: list[str]) -> None:
    with pytest.raises(FedriskError) as info:
        build_model(*args, **options)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "name, shape, options",
    [
        ("logreg", FLAT, {}),
        ("mlp", FLAT, {"hidden": [8, 4]}),
        ("mlp", FLAT, {"output_activation": "sigmoid"}),
        ("cnn", (1, 8, 8), {"channels": [4, 6], "hidden": [5]}),
        ("cnn", (3, 8, 6), {"channels": [4], "hidden": [], "output_activation": "sigmoid"}),
    ],
)
def test_functional_fast_path_equals_module_forward(name: str, shape: tuple, options: dict) -> None:
    module = build_model(name, shape, 3, **options).double()
    fm = FunctionalModel(module)
    assert fm._functional_forward is not None
    params = fm.init_params(1, dtype=torch.float64)
    x = torch.randn(5, *shape, dtype=torch.float64)
    expected = torch.func.functional_call(module, params, (x,))
    assert torch.equal(fm.apply(params, x), expected)
    # and its gradients, also under vmap (the vectorised executor)
    grad = torch.func.grad(lambda p, xb: fm.apply(p, xb).sum())
    reference = torch.func.grad(lambda p, xb: torch.func.functional_call(module, p, (xb,)).sum())
    for k, g in grad(params, x).items():
        assert torch.equal(g, reference(params, x)[k]), k
    stacked = {k: torch.stack([v, 2 * v]) for k, v in params.items()}
    batched = torch.func.vmap(fm.apply)(stacked, torch.stack([x, x]))
    assert torch.allclose(batched[1], torch.func.functional_call(module, {k: 2 * v for k, v in params.items()}, (x,)))
