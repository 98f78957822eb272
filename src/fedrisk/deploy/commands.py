"""The commands behind ``fedrisk deploy``: the SuperLink and SuperNode command lines for a config,
certificates and node keys, and running a config on a SuperLink.

This module imports neither torch nor flwr (``fedrisk deploy --help`` stays fast); the Flower
executables are taken from the Python environment that runs fedrisk.

* :func:`superlink_command` / :func:`supernode_command`: ``flower-superlink`` and
  ``flower-supernode`` command lines: ``--insecure`` without certificates (loopback tests), TLS with
  the files of :func:`make_certificates` (``ca.crt``, ``server.pem``, ``server.key``), node
  authentication with ``--enable-supernode-auth`` on the SuperLink and each SuperNode's private key
  (:func:`make_node_key`; its public key registered with :func:`register_node`).  Flower's runtime
  dependency installation (``uv sync`` of the app's dependencies, which would replace the CPU
  PyTorch build) is disabled: ``--disable-runtime-dependency-installation`` on the SuperLink; a
  SuperNode installs nothing unless given ``--allow-runtime-dependency-installation``, which
  these commands never pass.
* :func:`run_deployed`: writes the experiment's Flower app (:func:`write_app`), submits it with
  ``flwr run`` and waits for the run's final status.  ``flwr run`` returns 0 even when the
  ServerApp fails, so the status is read with ``flwr ls --run-id`` and a failed run raises
  :class:`DeployFailed`.

Example:
    >>> cmd = supernode_command("127.0.0.1:9091", partition=1, num_partitions=2, port=9095, state_dir="/srv/s")
    >>> cmd[1:-1]
    ['--superlink', '127.0.0.1:9091', '--host', '127.0.0.1', '--port', '9095', '--insecure', '--node-config']
    >>> cmd[-1]
    'partition-id=1 num-partitions=2 state-dir="/srv/s"'
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fedrisk.errors import FedriskError

CONNECTION = "fedrisk"
"""The SuperLink connection name fedrisk writes into its private ``FLWR_HOME/config.toml``."""
CA_CERT, SERVER_CERT, SERVER_KEY = "ca.crt", "server.pem", "server.key"
DEFAULT_SUPERLINK = "127.0.0.1:9091"
APP_MODULE = "fedrisk_app"
CONFIG_FILE = "experiment.toml"
SUPEREXEC_POLL = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
"""Flower 1.41's environment variable for the SuperExec's task polling interval (seconds)."""


class DeployFailed(FedriskError):
    """A run on the SuperLink that did not finish as completed (``flwr ls`` status and details)."""


def executable(name: str) -> str:
    """The Flower executable ``name`` of this Python environment (else ``name`` on the PATH)."""
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else name


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with this environment's ``bin`` first on the PATH: the
    SuperLink and SuperNodes start ``flower-superexec``, ``flwr-serverapp`` and ``flwr-clientapp``
    by name, and these must be the ones next to fedrisk.  The SuperExec (which starts a ServerApp or
    ClientApp process per task) looks for new tasks every :data:`SUPEREXEC_POLL` seconds: 0.2
    unless set (Flower's default: 1 s).

    Example:
        >>> environment({"PATH": "/bin"})[SUPEREXEC_POLL], environment({SUPEREXEC_POLL: "2"})[SUPEREXEC_POLL]
        ('0.2', '2')
    """
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault(SUPEREXEC_POLL, "0.2")
    return env


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``, with a clear error.

    Example:
        >>> split_address("127.0.0.1:9091")
        ('127.0.0.1', 9091)
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FedriskError(f"address {address!r} is not allowed; allowed: HOST:PORT, e.g. {DEFAULT_SUPERLINK}")
    return host.strip("[]"), int(port)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_reachable(address: str, timeout: float = 3.0, wait: float = 0.0) -> None:
    """Raise a :class:`FedriskError` when nothing accepts connections at ``address`` (trying
    again for ``wait`` seconds, e.g. while a SuperLink starts)."""
    host, port = split_address(address)
    end = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return
        except OSError as exc:
            if time.monotonic() < end:
                time.sleep(0.2)
                continue
            error = exc
        raise FedriskError(
            f"cannot reach the SuperLink at {address} ({error.strerror or error}); start it first "
            "(fedrisk deploy superlink) or give its address with --superlink HOST:PORT"
        ) from None


def _tls_files(tls: str | Path | None, *names: str) -> list[Path]:
    if tls is None:
        return []
    paths = [Path(tls) / n for n in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FedriskError(f"TLS file(s) {', '.join(missing)} not found; make them with `fedrisk deploy certs {tls}`")
    return paths


def superlink_command(
    address: str = DEFAULT_SUPERLINK, *, tls: str | Path | None = None, node_auth: bool = False,
    database: str | None = None,
) -> list[str]:  # fmt: skip
    """The ``flower-superlink`` command line (one HTTP port for the Fleet, Control and ServerApp APIs)."""
    host, port = split_address(address)
    if node_auth and tls is None:
        raise FedriskError(
            "node authentication needs TLS (flower-superlink 1.41 refuses --enable-supernode-auth without "
            "certificates): give --tls DIR from `fedrisk deploy certs DIR`"
        )
    cmd = [executable("flower-superlink"), "--host", host, "--port", str(port)]
    files = _tls_files(tls, CA_CERT, SERVER_CERT, SERVER_KEY)
    if files:
        cmd += ["--ssl-ca-certfile", str(files[0]), "--ssl-certfile", str(files[1]), "--ssl-keyfile", str(files[2])]
    else:
        cmd.append("--insecure")
    if node_auth:
        cmd.append("--enable-supernode-auth")
    if database:
        cmd += ["--database", database]
    return [*cmd, "--disable-runtime-dependency-installation"]


def supernode_command(
    superlink: str = DEFAULT_SUPERLINK, *, partition: int, num_partitions: int, port: int = 9094,
    tls: str | Path | None = None, auth_key: str | Path | None = None, state_dir: str | Path | None = None,
) -> list[str]:  # fmt: skip
    """The ``flower-supernode`` command line of the node that serves client ``partition``
    (``port``: the node's own ClientApp API on 127.0.0.1, one per node on a machine)."""
    split_address(superlink)
    if not 0 <= partition < num_partitions:
        raise FedriskError(f"partition {partition} is out of range; allowed: 0 .. {num_partitions - 1}")
    cmd = [executable("flower-supernode"), "--superlink", superlink, "--host", "127.0.0.1", "--port", str(port)]
    files = _tls_files(tls, CA_CERT)
    cmd += ["--root-certificates", str(files[0])] if files else ["--insecure"]
    if auth_key is not None:
        if not Path(auth_key).is_file():
            raise FedriskError(f"node key {auth_key} not found; make one with `fedrisk deploy node-key`")
        cmd += ["--auth-supernode-private-key", str(auth_key)]
    node_config = f"partition-id={partition} num-partitions={num_partitions}"
    if state_dir is not None:
        node_config += f' state-dir="{state_dir}"'
    return [*cmd, "--node-config", node_config]


def show(cmd: Sequence[str]) -> str:
    """A command line as one shell line."""
    return " ".join(shlex.quote(c) for c in cmd)


# ----------------------------------------------------------------------------- certificates, node keys


def make_certificates(
    directory: str | Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = 365
) -> Path:
    """A self-signed CA (``ca.crt``) and a SuperLink certificate it signs (``server.pem``,
    ``server.key``) valid for ``hosts`` (IP addresses or DNS names): enough for a test
    federation; a real one uses its organisation's CA."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def build(subject: str, issuer: Any, key: Any, signer: Any, ca: bool) -> Any:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            names: list[Any] = []
            for h in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    names.append(x509.DNSName(h))
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedrisk federation CA")])
    ca_cert = build("fedrisk federation CA", ca_name, ca_key, ca_key, True)
    key = ec.generate_private_key(ec.SECP384R1())
    cert = build(hosts[0], ca_name, key, ca_key, False)
    pem = serialization.Encoding.PEM
    (out / CA_CERT).write_bytes(ca_cert.public_bytes(pem))
    (out / SERVER_CERT).write_bytes(cert.public_bytes(pem))
    private = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (out / SERVER_KEY).write_bytes(private)
    os.chmod(out / SERVER_KEY, 0o600)
    return out


def make_node_key(directory: str | Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair (EC P-384, OpenSSH format, as Flower reads it):
    ``NAME`` (private, for ``flower-supernode``) and ``NAME.pub`` (to register on the SuperLink)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (out / name).write_bytes(private)
    os.chmod(out / name, 0o600)
    (out / f"{name}.pub").write_bytes(public + b"\n")
    return out / name, out / f"{name}.pub"


# ----------------------------------------------------------------------------- flwr CLI


def flwr_home(directory: str | Path, superlink: str, tls: str | Path | None = None) -> dict[str, str]:
    """Write a Flower CLI config naming the SuperLink as connection :data:`CONNECTION` into
    ``directory``; returns the environment that makes ``flwr`` read it."""
    split_address(superlink)
    home = Path(directory)
    home.mkdir(parents=True, exist_ok=True)
    files = _tls_files(tls, CA_CERT)
    security = f'root-certificates = "{files[0].resolve()}"' if files else "insecure = true"
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{superlink}"\n{security}\n'
    )
    return {**environment(), "FLWR_HOME": str(home)}


def _flwr(args: Sequence[str], env: dict[str, str], timeout: float = 120.0) -> dict[str, Any]:
    """Run ``flwr ARGS --format json``; its JSON answer or a :class:`FedriskError`."""
    cmd = [executable("flwr"), *args, "--format", "json"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise FedriskError(f"`{show(cmd)}` did not answer within {timeout:g} s") from None
    text = done.stdout.strip()
    start = text.find("{")
    try:
        answer = json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        answer = {}
    if done.returncode != 0 or not answer.get("success", False):
        reason = answer.get("error-message") or (done.stderr or text).strip()[-800:]
        raise FedriskError(f"`flwr {' '.join(args[:1])}` failed: {reason}")
    return answer


def register_node(public_key: str | Path, superlink: str, tls: str | Path | None = None) -> int:
    """Register a SuperNode's public key on a SuperLink started with node authentication;
    returns the node id."""
    check_reachable(superlink)
    with tempfile.TemporaryDirectory() as home:
        answer = _flwr(["supernode", "register", str(public_key), CONNECTION], flwr_home(home, superlink, tls))
    return int(answer["node-id"])


PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "fedrisk experiment {name} on Flower"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fedrisk"

[tool.flwr.app.components]
serverapp = "{module}:server_app"
clientapp = "{module}:client_app"

[tool.flwr.app.config]
out = ""
overwrite = false
resume = false
round-timeout = 600.0
connect-timeout = 120.0
"""

MODULE = '''\
"""A fedrisk experiment on Flower (written by `fedrisk deploy run`)."""

from pathlib import Path

from fedrisk.deploy.apps import FedriskClientApp, server_app_for

CONFIG = Path(__file__).with_name("{config}")
server_app = server_app_for(CONFIG)
client_app = FedriskClientApp(CONFIG)
'''


def write_app(directory: str | Path, config_toml: str, name: str) -> Path:
    """Write the Flower app of an experiment (its resolved config text) into ``directory``:
    ``pyproject.toml``, ``fedrisk_app.py`` and ``experiment.toml`` (see :mod:`fedrisk.deploy.apps`)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "experiment"
    (path / "pyproject.toml").write_text(PYPROJECT.format(name=f"fedrisk-{slug}", module=APP_MODULE))
    (path / f"{APP_MODULE}.py").write_text(MODULE.format(config=CONFIG_FILE))
    (path / CONFIG_FILE).write_text(config_toml)
    return path


@dataclass
class DeployedRun:
    """A run on a SuperLink: its Flower run id, final status (``finished:completed`` when it
    worked), Flower's status details and the run directory on the SuperLink's machine."""

    run_id: int
    status: str
    details: str
    out: Path
    seconds: float


def run_deployed(
    cfg: Any, superlink: str, out: str | Path, *, tls: str | Path | None = None, overwrite: bool = False,
    resume: bool = False, round_timeout: float = 600.0, connect_timeout: float = 120.0, wait: float | None = None,
    poll: float = 0.5, stream: TextIO | None = None,
) -> DeployedRun:  # fmt: skip
    """Run the experiment ``cfg`` (an ``ExperimentConfig``) on the SuperLink at ``superlink``;
    the ServerApp writes its run directory ``out`` (resolved here: a path on the SuperLink's machine);
    ``resume`` continues the deployed run in ``out`` from its checkpoint (the nodes continue from
    the client states they kept).

    Raises:
        FedriskError: the SuperLink cannot be reached, or ``flwr run`` refused the app.
        DeployFailed: the run did not finish as ``completed`` (e.g. the ServerApp raised), or did not
            finish within ``wait`` seconds.
    """
    check_reachable(superlink)
    out = Path(out).resolve()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedrisk-deploy-") as tmp:
        app = write_app(Path(tmp) / "app", cfg.to_toml(), cfg.name)
        env = flwr_home(Path(tmp) / "flwr", superlink, tls)
        overrides = (
            f'out="{out}" overwrite={str(overwrite).lower()} resume={str(resume).lower()} '
            f"round-timeout={float(round_timeout)} connect-timeout={float(connect_timeout)}"
        )
        answer = _flwr(["run", str(app), CONNECTION, "--run-config", overrides], env)
        run_id = int(answer["run-id"])
        if stream is not None:
            print(f"started Flower run {run_id} on {superlink}; outputs in {out}", file=stream, flush=True)
        status, details = "", ""
        while True:
            runs = _flwr(["ls", CONNECTION, "--run-id", str(run_id)], env).get("runs", [])
            if runs:
                status, details = str(runs[0].get("status", "")), str(runs[0].get("status-details", ""))
            if status.startswith("finished"):
                break
            if wait is not None and time.monotonic() - start > wait:
                raise DeployFailed(f"Flower run {run_id} did not finish within {wait:g} s (status {status!r})")
            time.sleep(poll)
    run = DeployedRun(run_id, status, details, out, time.monotonic() - start)
    if status != "finished:completed":
        raise DeployFailed(
            f"Flower run {run_id} ended as {status}: {details or 'no details'} "
            f"(the ServerApp's log: flwr log {run_id} with the SuperLink connection)"
        )
    return run


class LocalFederation:
    """A SuperLink and one SuperNode per partition on 127.0.0.1 (free ports picked now), for tests,
    benchmarks and trying a config: ``with LocalFederation(2, root) as fed: run_deployed(cfg, fed.superlink, ...)``.

    Every process runs in its own session and is stopped with its children (the SuperExec and
    ClientApp processes Flower starts) when the block ends; logs go to ``root/logs``, the nodes'
    client states to ``root/node-<i>``.
    """

    def __init__(
        self, num_nodes: int, root: str | Path, *, tls: str | Path | None = None, node_auth: bool = False,
        start_timeout: float = 120.0,
    ) -> None:  # fmt: skip
        self.num_nodes, self.root, self.tls, self.node_auth = num_nodes, Path(root), tls, node_auth
        self.superlink = f"127.0.0.1:{free_port()}"
        self.start_timeout = start_timeout
        self.link: subprocess.Popen[bytes] | None = None
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}
        self.keys: dict[int, Path] = {}

    def _spawn(self, cmd: list[str], log: str) -> subprocess.Popen[bytes]:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        with open(self.root / "logs" / log, "ab") as out:
            env = environment()
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def start_node(self, i: int) -> None:
        """Start (or restart) the SuperNode of partition ``i``."""
        key = None
        if self.node_auth:
            if i not in self.keys:
                self.keys[i], public = make_node_key(self.root / "keys", f"node-{i}")
                register_node(public, self.superlink, self.tls)
            key = self.keys[i]
        cmd = supernode_command(
            self.superlink, partition=i, num_partitions=self.num_nodes, port=free_port(), tls=self.tls,
            auth_key=key, state_dir=self.root / f"node-{i}",
        )  # fmt: skip
        self.nodes[i] = self._spawn(cmd, f"supernode-{i}.log")

    def stop_node(self, i: int) -> None:
        """Stop the SuperNode of partition ``i`` (SIGTERM to its process group)."""
        _stop(self.nodes.pop(i))

    def __enter__(self) -> LocalFederation:
        try:
            cmd = superlink_command(self.superlink, tls=self.tls, node_auth=self.node_auth)
            self.link = self._spawn(cmd, "superlink.log")
            end = time.monotonic() + self.start_timeout
            while True:
                if self.link.poll() is not None:
                    raise FedriskError(f"the SuperLink stopped at start:\n{self.log()[-1500:]}")
                try:
                    check_reachable(self.superlink)
                    break
                except FedriskError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.2)
            for i in range(self.num_nodes):
                self.start_node(i)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for i in list(self.nodes):
            self.stop_node(i)
        if self.link is not None:
            _stop(self.link)
            self.link = None

    def log(self, name: str = "superlink.log") -> str:
        """The text of one log (``superlink.log``, ``supernode-<i>.log``)."""
        path = self.root / "logs" / name
        return path.read_text(errors="replace") if path.exists() else ""


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Stop ``proc`` and the processes of its session (started by :class:`LocalFederation`)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=timeout)
            break
        except subprocess.TimeoutExpired:
            continue
