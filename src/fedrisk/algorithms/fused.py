"""Local SGD of a whole block of clients as one explicit stacked program (no ``vmap``).

The vectorised executor runs ``client_update`` under ``torch.func.vmap``, which works for any
algorithm but pays for its generality: batching rules, autograd's saved tensors, a gradient
tensor per weight and step.  For the commonest local update, plain SGD with cross-entropy on a
zoo MLP or logistic regression (FedAvg), :func:`fused_sgd_steps` writes the forward and
backward passes out by hand for ``C`` clients at once, with every client's weights stacked
``[C, out, in]``:

* forward, layer ``l``: ``h_l = a_{l-1} W_lᵀ + b_l`` (``baddbmm``; at local step 0 every client
  holds the broadcast model, so this is one ordinary GEMM over the block's rows), ReLU between
  layers;
* loss: ``mean_b(-log softmax(z_b)[y_b])``, its gradient ``(softmax(z) - onehot(y)) / B`` (one
  log-softmax and its backward kernel, as autograd computes them);
* backward: ``da_{l-1} = dh_l W_l`` (with the weights before the update), ReLU's backward;
* update, fused with the weight gradient: ``W_l <- W_l - lr dh_lᵀ a_{l-1}`` as one
  ``baddbmm_`` in place (a new ``[C, out, in]`` stack only at step 0), ``b_l <- b_l - lr sum_b dh_l``.

These are the operations of ``w <- w - lr * grad f_k(w; minibatch)`` (FedAvg's local loop,
:func:`fedrisk.algorithms.local.sgd_steps`; FedProx adds ``mu (w - w_r)`` to the gradient, i.e.
``w <- (1 - lr mu) w + lr mu w_r`` before the step) in another order, so the results equal the
sequential executor's to float rounding (``tests/runtime/test_fused.py``).  Anything else (other
models, losses, output activations, other gradient corrections, dtypes that differ) returns
None and the executor uses ``vmap``.  ``benchmarks/RESULTS.md`` has the speed.

Example:
    >>> import torch
    >>> from fedrisk.algorithms.base import LocalData
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> model = FunctionalModel(build_model("mlp", (3,), 2, hidden=[4]))
    >>> params = model.init_params(0, dtype=torch.float64)
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y = torch.randn(2, 5, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (2, 5), generator=g)
    >>> idx = torch.randint(0, 5, (2, 3, 4), generator=g)  # 2 clients, 3 steps of 4 rows
    >>> out, loss = fused_sgd_steps(model, cross_entropy, params, LocalData(x, y, torch.tensor([5, 5])), idx, 0.1)
    >>> from fedrisk.algorithms.local import sgd_steps, supervised_objective
    >>> objective = supervised_objective(model.apply, cross_entropy)
    >>> one, one_loss = sgd_steps(objective, params, LocalData(x[1], y[1], torch.tensor(5)), idx[1], 0.1)
    >>> all(torch.allclose(out[k][1], one[k], rtol=1e-12, atol=1e-14) for k in one)
    True
    >>> bool(torch.isclose(loss[1], one_loss))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from fedrisk.algorithms.base import LocalData
from fedrisk.models.zoo import MLP, LogReg
from fedrisk.objectives.supervised import cross_entropy

__all__ = ["fused_layers", "fused_sgd_steps"]


def fused_layers(model: object, loss: Callable[..., Tensor]) -> list[tuple[str, str | None]] | None:
    """The ``(weight, bias)`` parameter names of ``model``'s linear layers, input first, when
    :func:`fused_sgd_steps` can train it with ``loss``; None otherwise.

    Supported: a :class:`~fedrisk.models.FunctionalModel` of the zoo's ``logreg`` or ``mlp``
    without output activation, and :func:`fedrisk.objectives.supervised.cross_entropy`.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> fused_layers(FunctionalModel(build_model("mlp", (3,), 2, hidden=[4])), cross_entropy)
        [('layers.0.weight', 'layers.0.bias'), ('layers.2.weight', 'layers.2.bias')]
        >>> fused_layers(FunctionalModel(build_model("logreg", (3,), 1, output_activation="sigmoid")), cross_entropy)
    """
    module = getattr(model, "module", None)
    if loss is not cross_entropy or getattr(module, "output_activation", None) != "none":
        return None
    if type(module) is LogReg:
        bias = "linear.bias" if module.linear.bias is not None else None
        return [("linear.weight", bias)]
    if type(module) is MLP:
        return [(f"{name}.weight", f"{name}.bias") for name in module.linear_names]
    return None


def fused_sgd_steps(
    model: object,
    loss: Callable[..., Tensor],
    params: Mapping[str, Tensor],
    data: LocalData,
    idx: Tensor,
    lr: float,
    prox_mu: float = 0.0,
) -> tuple[dict[str, Tensor], Tensor] | None:
    """``E`` plain local SGD steps of ``C`` clients from the shared ``params``.

    ``prox_mu > 0`` adds FedProx's proximal gradient ``mu (w - w_r)`` (``w_r`` = ``params``):
    ``w <- (1 - lr mu) w + lr mu w_r - lr grad`` (zero at step 0, where ``w = w_r``).

    ``data``: the block's stacked data (``x [C, n, ...]``, ``y [C, n]``); ``idx [C, E, B]``
    the minibatch rows (below each client's size).  Returns every client's final parameters
    stacked ``[C, ...]`` and its mean loss over the steps ``[C]``, or None when the model, the
    loss or the dtypes are not supported (see :func:`fused_layers`).
    """
    layers = fused_layers(model, loss)
    if layers is None or any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in (lr, prox_mu)):
        return None
    weights = [params[w] for w, _ in layers]
    dtype = weights[0].dtype
    if not dtype.is_floating_point or data.x.dtype != dtype or any(p.dtype != dtype for p in params.values()):
        return None
    if idx.dim() != 3 or data.x.dim() < 2 or data.y.dim() != 2:
        return None
    c, steps, b = idx.shape
    n = data.x.shape[1]
    # every step's rows gathered once, step-major (each step's block contiguous): [E, C, B, features]
    # and labels [E, C, B]
    rows = (idx.transpose(0, 1) + torch.arange(c, device=idx.device)[:, None] * n).reshape(-1)
    xs = data.x.reshape(c * n, -1).index_select(0, rows).reshape(steps, c, b, -1)
    ys = data.y.reshape(c * n).index_select(0, rows).reshape(steps, c, b).long()
    num_out = weights[-1].shape[0]
    # d loss / d log-softmax of each step: -onehot(y) / B (the loss is the batch mean)
    grad_out = torch.zeros(steps, c, b, num_out, dtype=dtype, device=xs.device).scatter_(-1, ys[..., None], -1.0 / b)
    w: list[Tensor] = list(weights)  # [out, in] shared at step 0, then [C, out, in] of the block's own
    bias: list[Tensor | None] = [None if name is None else params[name] for _, name in layers]
    last = len(layers) - 1
    log_probs = []
    for t in range(steps):
        shared = t == 0
        acts = [xs[t]]  # a_0 = x, then the ReLU outputs
        h = acts[0]
        for i in range(len(layers)):
            if shared:
                h = torch.nn.functional.linear(h, w[i], bias[i])
            elif bias[i] is None:
                h = torch.bmm(h, w[i].mT)
            else:
                h = torch.baddbmm(bias[i][:, None, :], h, w[i].mT)  # type: ignore[index]
            if i < last:
                h = torch.relu(h)
                acts.append(h)
        ls = torch.log_softmax(h, -1)
        log_probs.append(ls)
        # d loss / d logits = (softmax(z) - onehot(y)) / B: log-softmax's backward, as autograd computes it
        dh = torch.ops.aten._log_softmax_backward_data(grad_out[t], ls, -1, dtype)
        for i in range(last, -1, -1):
            a = acts[i]
            da = None
            if i > 0:
                da = torch.matmul(dh, w[i])  # with the weights before this step's update
                da = torch.ops.aten.threshold_backward(da, a, 0)  # ReLU's backward: zero where its output is 0
            gb = dh.sum(1) if bias[i] is not None else None
            if shared:
                w[i] = torch.baddbmm(w[i].expand(c, *w[i].shape), dh.mT, a, alpha=-lr)
                if gb is not None:
                    bias[i] = torch.add(bias[i], gb, alpha=-lr)  # type: ignore[arg-type]
            else:
                if prox_mu:
                    w[i].mul_(1.0 - lr * prox_mu).add_(weights[i], alpha=lr * prox_mu)
                w[i].baddbmm_(dh.mT, a, alpha=-lr)
                if gb is not None:
                    if prox_mu:
                        bias[i].mul_(1.0 - lr * prox_mu).add_(params[layers[i][1]], alpha=lr * prox_mu)  # type: ignore[union-attr,index]
                    bias[i].add_(gb, alpha=-lr)  # type: ignore[union-attr]
            if da is not None:
                dh = da
    # every step's loss, mean_b(-log softmax(z_b)[y_b]), in one gather
    nll = -torch.stack(log_probs).gather(-1, ys[..., None])[..., 0]
    losses = nll.mean(-1)  # [E, C]
    out: dict[str, Tensor] = {}
    for (wn, bn), wi, bi in zip(layers, w, bias):
        out[wn] = wi
        if bn is not None:
            out[bn] = bi  # type: ignore[assignment]
    return {k: out[k] for k in params}, losses.mean(0)
