"""``fedrisk deploy``: a config on Flower's deployment engine (SuperLink, SuperNodes, ``flwr run``).

::

    fedrisk deploy certs DIR [--host H ...]                     CA + SuperLink certificate (TLS)
    fedrisk deploy node-key DIR NAME                            a SuperNode's key pair (node auth)
    fedrisk deploy register KEY.pub [--superlink A] [--tls DIR] register a node's public key
    fedrisk deploy superlink [--address A] [--tls DIR] [--node-auth] [--database F] [--print]
    fedrisk deploy supernode CONFIG --partition I [--superlink A] [--port P] [--tls DIR]
                             [--auth-key KEY] [--state-dir DIR] [--print]
    fedrisk deploy run CONFIG [--set k=v ...] [--superlink A] [--tls DIR] [--out DIR] [--overwrite | --resume]
                       [--round-timeout S] [--connect-timeout S]

``superlink`` / ``supernode`` start the process (replacing ``fedrisk``) or, with ``--print``,
print its command line; without ``--tls`` they are insecure (for loopback tests only).  ``run``
exits with 0 only when the Flower run finished as completed (``flwr run`` itself returns 0 when
the ServerApp fails), 1 when it failed, 2 on bad input (e.g. an unreachable SuperLink).

Nothing here imports torch or flwr: ``fedrisk deploy --help`` answers at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from fedrisk.deploy import commands as c


def _exec(cmd: list[str], printed: bool) -> int:
    if printed:
        print(c.show(cmd))
        return 0
    print(f"starting: {c.show(cmd)}", file=sys.stderr, flush=True)
    os.execve(cmd[0], cmd, c.environment())
    return 0  # pragma: no cover


def cmd_certs(args: argparse.Namespace) -> int:
    out = c.make_certificates(args.dir, hosts=args.host or ("127.0.0.1", "localhost"))
    print(f"wrote {out / c.CA_CERT} (give it to every SuperNode), {out / c.SERVER_CERT} and {out / c.SERVER_KEY}")
    return 0


def cmd_node_key(args: argparse.Namespace) -> int:
    private, public = c.make_node_key(args.dir, args.name)
    print(f"wrote {private} (the SuperNode's --auth-key) and {public} (fedrisk deploy register {public})")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    node = c.register_node(args.public_key, args.superlink, args.tls)
    print(f"registered node {node}")
    return 0


def cmd_superlink(args: argparse.Namespace) -> int:
    cmd = c.superlink_command(args.address, tls=args.tls, node_auth=args.node_auth, database=args.database)
    return _exec(cmd, args.print)


def cmd_supernode(args: argparse.Namespace) -> int:
    from fedrisk.experiment.config import load_config

    cfg = load_config(args.config, args.set)
    cmd = c.supernode_command(
        args.superlink, partition=args.partition, num_partitions=cfg["data.num_clients"], port=args.port,
        tls=args.tls, auth_key=args.auth_key, state_dir=args.state_dir,
    )  # fmt: skip
    return _exec(cmd, args.print)


def cmd_run(args: argparse.Namespace) -> int:
    from fedrisk.experiment.config import load_config

    cfg = load_config(args.config, args.set)
    out = Path(args.out) if args.out else Path(cfg["output.dir"] or f"runs/{cfg.name}")
    try:
        run = c.run_deployed(
            cfg, args.superlink, out, tls=args.tls, overwrite=args.overwrite, resume=args.resume,
            round_timeout=args.round_timeout,
            connect_timeout=args.connect_timeout, stream=sys.stderr,
        )  # fmt: skip
    except c.DeployFailed as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    from fedrisk.experiment.outputs import outputs_line

    print(f"Flower run {run.run_id} finished in {run.seconds:.1f} s; {outputs_line(run.out)}")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``fedrisk deploy`` and its subcommands on the CLI's subparsers."""
    p = sub.add_parser(
        "deploy",
        help="run a config on Flower's deployment engine (SuperLink, SuperNodes)",
        description="Certificates, node keys, SuperLink / SuperNode commands, and running a config on a SuperLink.",
    )
    dsub = p.add_subparsers(dest="deploy_command", metavar="DEPLOY_COMMAND")
    dsub.required = True
    link_help = f"the SuperLink's HOST:PORT (default {c.DEFAULT_SUPERLINK})"
    tls_help = "a directory from `fedrisk deploy certs` (default: insecure, for loopback tests only)"

    q = dsub.add_parser("certs", help="a CA and a SuperLink TLS certificate", description=cmd_certs.__doc__)
    q.add_argument("dir", metavar="DIR")
    q.add_argument("--host", action="append", metavar="H", help="an IP or DNS name of the SuperLink; repeatable")
    q.set_defaults(func=cmd_certs)

    q = dsub.add_parser("node-key", help="a SuperNode's authentication key pair")
    q.add_argument("dir", metavar="DIR")
    q.add_argument("name", metavar="NAME")
    q.set_defaults(func=cmd_node_key)

    q = dsub.add_parser("register", help="register a SuperNode's public key on the SuperLink")
    q.add_argument("public_key", metavar="KEY.pub")
    q.add_argument("--superlink", default=c.DEFAULT_SUPERLINK, metavar="HOST:PORT", help=link_help)
    q.add_argument("--tls", metavar="DIR", help=tls_help)
    q.set_defaults(func=cmd_register)

    q = dsub.add_parser("superlink", help="start (or --print) the SuperLink")
    q.add_argument("--address", default=c.DEFAULT_SUPERLINK, metavar="HOST:PORT", help="where it listens")
    q.add_argument("--tls", metavar="DIR", help=tls_help)
    q.add_argument("--node-auth", action="store_true", help="accept registered SuperNodes only")
    q.add_argument("--database", metavar="FILE", help="keep the SuperLink's state in this SQLite file")
    q.add_argument("--print", action="store_true", help="print the command instead of running it")
    q.set_defaults(func=cmd_superlink)

    q = dsub.add_parser("supernode", help="start (or --print) the SuperNode of one partition")
    q.add_argument("config", metavar="CONFIG", help="the experiment's TOML config (for its number of clients)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    q.add_argument("--partition", type=int, required=True, metavar="I", help="the client this node serves")
    q.add_argument("--superlink", default=c.DEFAULT_SUPERLINK, metavar="HOST:PORT", help=link_help)
    q.add_argument("--port", type=int, default=9094, metavar="P", help="the node's local ClientApp API port")
    q.add_argument("--tls", metavar="DIR", help="a directory holding the federation's ca.crt")
    q.add_argument("--auth-key", metavar="KEY", help="the node's private key (fedrisk deploy node-key)")
    q.add_argument(
        "--state-dir", metavar="DIR", help="where the node keeps client states (default: ~/.fedrisk/node-state)"
    )
    q.add_argument("--print", action="store_true", help="print the command instead of running it")
    q.set_defaults(func=cmd_supernode)

    q = dsub.add_parser("run", help="run a config on a SuperLink and wait for it")
    q.add_argument("config", metavar="CONFIG", help="a TOML config file")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    q.add_argument("--superlink", default=c.DEFAULT_SUPERLINK, metavar="HOST:PORT", help=link_help)
    q.add_argument("--tls", metavar="DIR", help="a directory holding the federation's ca.crt")
    q.add_argument("--out", metavar="DIR", help="the run directory on the SuperLink's machine")
    again = q.add_mutually_exclusive_group()
    again.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    again.add_argument("--resume", action="store_true", help="continue the deployed run in --out from its checkpoint")
    q.add_argument("--round-timeout", type=float, default=600.0, metavar="S", help="seconds to wait for replies")
    q.add_argument("--connect-timeout", type=float, default=120.0, metavar="S", help="seconds to wait for nodes")
    q.set_defaults(func=cmd_run)
