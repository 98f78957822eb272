"""Payloads and replies as Flower message contents.

A fedrisk payload (``RoundPlan.broadcast`` merged with the client's ``per_client`` entry) or reply
is a pytree (nested dicts / lists / tuples) whose leaves are tensors or Python scalars.  One
Flower ``RecordDict`` carries it:

=====================  ===============  ==========================================================
key                    record           holds
=====================  ===============  ==========================================================
``fedrisk.arrays``     ``ArrayRecord``  the tensor leaves, packed: one flat array per dtype (key:
                                        the dtype name, e.g. ``"float32"``)
``fedrisk.tree``       ``ConfigRecord`` ``spec``: the tree structure (``torch.utils._pytree``
                                        JSON), ``leaves``: the non-tensor leaves as JSON (``null``
                                        where a tensor goes), ``tensors``: the tensor leaf indices,
                                        ``layout``: per tensor leaf its dtype, offset and shape
``fedrisk.meta``       ``ConfigRecord`` ``round``, ``client``, ``seed``, ``kind`` (the round kind),
                                        ``experiment`` (the config fingerprint), ``session``
                                        (the deployed run's key of the nodes' client states)
=====================  ===============  ==========================================================

Tensors travel as NumPy arrays (Flower's ``Array``), so the round trip is bit-exact for every
dtype NumPy has (:data:`CARRIED_DTYPES`); bfloat16 and the float8 types have no NumPy dtype and
are refused with a :class:`~fedrisk.errors.FedriskError` that names the leaf.  Python floats go
through JSON with ``repr`` precision (exact, NaN / inf included).

The message type of a round is ``"train"`` (``"train.<kind>"`` for a named round kind, e.g.
PERM's estimation rounds), see :func:`message_type`.

Example:
    >>> import torch
    >>> payload = {"params": {"w": torch.arange(3.0)}, "alpha": 0.5, "steps": [1, 2]}
    >>> content = encode(payload, Meta(round=3, client=1, seed=7))
    >>> sorted(content.keys())
    ['fedrisk.arrays', 'fedrisk.meta', 'fedrisk.tree']
    >>> tree, meta = decode(content)
    >>> tree["params"]["w"].tolist(), tree["alpha"], tree["steps"], meta.round, meta.client
    ([0.0, 1.0, 2.0], 0.5, [1, 2], 3, 1)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fedrisk.deploy import require_flwr
from fedrisk.errors import FedriskError

ARRAYS = "fedrisk.arrays"
TREE = "fedrisk.tree"
META = "fedrisk.meta"

CARRIED_DTYPES = (
    torch.float16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
)
"""Tensor dtypes a Flower ``ArrayRecord`` carries exactly (those with a NumPy dtype)."""

MESSAGE_KINDS = ("train", "evaluate", "query")
"""Flower's message types; fedrisk sends ``train[.<kind>]`` rounds and ``query.*`` handshakes."""


@dataclass(frozen=True)
class Meta:
    """What a message says besides its tree: the round, the fedrisk client id, the run seed,
    the round kind (``""`` = the default kind), the experiment fingerprint and the deployed run's
    session (the key of the nodes' client states; it survives a ``--resume``)."""

    round: int
    client: int
    seed: int
    kind: str = ""
    experiment: str = ""
    session: str = ""


def message_type(kind: str = "", base: str = "train") -> str:
    """Flower's message type for a round of ``kind``: ``base`` or ``base.<kind>``.

    Example:
        >>> message_type("train"), message_type("estimation"), message_type("fedrisk_handshake", "query")
        ('train', 'train.estimation', 'query.fedrisk_handshake')
    """
    if base not in MESSAGE_KINDS:
        raise FedriskError(f"message type {base!r} is not one of Flower's; allowed: {', '.join(MESSAGE_KINDS)}")
    if kind and not kind.replace("_", "").isalnum():
        raise FedriskError(f"round kind {kind!r} cannot name a Flower action; allowed: letters, digits and _")
    return f"{base}.{kind}" if kind and kind != base else base


def _leaf_path(spec: Any, index: int) -> str:
    """The key path (e.g. ``['params']['w']``) of leaf ``index`` of a tree with structure ``spec``."""
    skeleton = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    path = pytree.tree_flatten_with_path(skeleton)[0][index][0]
    return pytree.keystr(path) or "<root>"


def encode(tree: Any, meta: Meta) -> Any:
    """``tree`` and ``meta`` as a Flower ``RecordDict``.

    Raises:
        FedriskError: a tensor of a dtype the records cannot carry (see :data:`CARRIED_DTYPES`) or a
            leaf that is neither a tensor nor a JSON scalar.
    """
    require_flwr()
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    leaves, spec = pytree.tree_flatten(tree)
    groups: dict[str, list[torch.Tensor]] = {}  # dtype name -> flattened tensors, packed into one array each
    plain: list[Any] = []
    tensors: list[int] = []
    layout: list[list[Any]] = []  # per tensor leaf: [dtype name, offset, shape]
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            if leaf.dtype not in CARRIED_DTYPES:
                allowed = ", ".join(str(d).removeprefix("torch.") for d in CARRIED_DTYPES)
                raise FedriskError(
                    f"payload leaf {_leaf_path(spec, i)} has dtype {str(leaf.dtype).removeprefix('torch.')}, which "
                    f'Flower\'s ArrayRecord cannot carry; allowed: {allowed} (cast it, e.g. run.dtype = "float32")'
                )
            name = str(leaf.dtype).removeprefix("torch.")
            group = groups.setdefault(name, [])
            layout.append([name, sum(t.numel() for t in group), list(leaf.shape)])
            group.append(leaf.detach().cpu().reshape(-1))
            plain.append(None)
            tensors.append(i)
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            plain.append(leaf)
        else:
            raise FedriskError(
                f"payload leaf {_leaf_path(spec, i)} is a {type(leaf).__name__}; allowed: tensors, numbers, "
                "strings, booleans and None"
            )
    arrays = {name: Array(torch.cat(group).numpy()) for name, group in groups.items()}
    tree_record = {
        "spec": pytree.treespec_dumps(spec),
        "leaves": json.dumps(plain),
        "tensors": tensors,
        "layout": json.dumps(layout),
    }
    return RecordDict(
        {
            ARRAYS: ArrayRecord(arrays),
            TREE: ConfigRecord(tree_record),
            META: ConfigRecord(
                {
                    "round": meta.round,
                    "client": meta.client,
                    "seed": meta.seed,
                    "kind": meta.kind,
                    "experiment": meta.experiment,
                    "session": meta.session,
                }
            ),
        }
    )


def decode(content: Any) -> tuple[Any, Meta]:
    """The tree and :class:`Meta` of a ``RecordDict`` made by :func:`encode` (tensors on the CPU,
    writable copies)."""
    missing = [k for k in (ARRAYS, TREE, META) if k not in content]
    if missing:
        raise FedriskError(
            f"the message is not a fedrisk payload: it lacks {', '.join(missing)} (a node or server of "
            "another application, or another fedrisk version?)"
        )
    arrays, tree, m = content[ARRAYS], content[TREE], content[META]
    spec = pytree.treespec_loads(tree["spec"])
    leaves = json.loads(tree["leaves"])
    packed = {name: torch.from_numpy(arrays[name].numpy().copy()) for name in arrays}
    for i, (name, offset, shape) in zip(list(tree["tensors"]), json.loads(tree["layout"])):
        numel = math.prod(shape)
        leaves[i] = packed[name][offset : offset + numel].reshape(shape).clone()
    meta = Meta(
        round=int(m["round"]),
        client=int(m["client"]),
        seed=int(m["seed"]),
        kind=str(m["kind"]),
        experiment=str(m["experiment"]),
        session=str(m["session"]) if "session" in m else "",
    )
    return pytree.tree_unflatten(leaves, spec), meta
