"""fedrisk on Flower's deployment engine (the optional ``flower`` extra: ``pip install 'fedrisk[flower]'``).

The simulators stay the default; this subpackage carries the same algorithm objects over
Flower's messages.  What exists so far:

* :mod:`fedrisk.deploy.records`: payloads / replies (pytrees of tensors and Python scalars) <->
  Flower ``RecordDict`` contents (tensors in an ``ArrayRecord``, the tree structure, the scalars and
  round / client id / seed / round kind in ``ConfigRecord`` s), bit-exact, with a clear error for a
  dtype the records cannot carry (bfloat16, float8, ...).
* :mod:`fedrisk.deploy.handshake`: the ``query.fedrisk_handshake`` exchange that maps Flower's
  random node ids to fedrisk client ids (the partition each SuperNode was started with) and
  checks that server and nodes run the same config.
* :mod:`fedrisk.deploy.client`: the ClientApp's round (decode, ``draw``, ``client_update``,
  encode), bit-identical to the sequential executor on loopback.
* :mod:`fedrisk.deploy.server`: the server side of a round as an executor (one message per
  selected client, replies checked with the failure policy); :class:`~fedrisk.deploy.server.LoopbackExecutor`
  runs it in-process over the serialised bytes.
* :mod:`fedrisk.deploy.state`: the node-local store that keeps each client's state across
  SuperNode restarts (keyed by experiment fingerprint and client id).
* :mod:`fedrisk.deploy.node`: the node side of a ``train`` message, with the client's setup
  (partition, ``FedInfo``, initial state, model spec) cached in the node's store.

* :mod:`fedrisk.deploy.apps`: the Flower ServerApp (handshake, then
  :func:`~fedrisk.experiment.runner.run_experiment` with a Grid executor) and ClientApp (``draw`` +
  ``client_update`` with the node-local state store).
* :mod:`fedrisk.deploy.commands` / :mod:`fedrisk.deploy.cli`: ``fedrisk deploy`` (certificates,
  node keys, SuperLink / SuperNode command lines, ``run`` with a non-zero exit when the ServerApp
  fails) and :class:`~fedrisk.deploy.commands.LocalFederation` (a SuperLink and SuperNodes on
  127.0.0.1 for tests and benchmarks).

Nothing here but :mod:`fedrisk.deploy.apps` (the Flower app itself) imports ``flwr`` at import
time; a function that needs it and does not find it raises a
:class:`~fedrisk.errors.FedriskError` naming the extra.
"""

from __future__ import annotations

from typing import Any

from fedrisk.errors import FedriskError

EXTRA = "flower"
FLWR_TESTED = "1.41"
"""The flwr minor release this subpackage is tested with (``flwr>=1.41,<1.42`` in the extra)."""


def require_flwr() -> Any:
    """The ``flwr`` module, or a clear error naming the extra to install."""
    try:
        import flwr
    except ImportError as exc:
        raise FedriskError(
            f"fedrisk.deploy needs Flower ({exc}); install the extra: pip install 'fedrisk[{EXTRA}]'"
        ) from None
    return flwr
