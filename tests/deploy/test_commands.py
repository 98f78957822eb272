"""``fedrisk deploy``: the SuperLink / SuperNode command lines for a config (insecure, TLS, node
authentication, runtime dependency installation off), certificates and node keys, bad input, and
a start-up without torch or flwr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedrisk.cli import main, outputs_line
from fedrisk.deploy.commands import make_certificates, make_node_key, superlink_command, supernode_command
from fedrisk.errors import FedriskError

CONFIG = '[data]\ndataset = "digits"\nnum_clients = 3\n\n[algorithm]\nname = "fedavg"\n'


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(CONFIG)
    return path


def printed(argv: list[str], capsys) -> tuple[int, list[str], str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out.split(), err


def test_superlink_command_insecure_tls_and_node_auth(tmp_path: Path, capsys) -> None:
    rc, cmd, _ = printed(["deploy", "superlink", "--address", "0.0.0.0:9191", "--print"], capsys)
    assert rc == 0 and cmd[0].endswith("flower-superlink")
    assert cmd[1:] == ["--host", "0.0.0.0", "--port", "9191", "--insecure", "--disable-runtime-dependency-installation"]
    certs = make_certificates(tmp_path / "certs")
    rc, cmd, _ = printed(["deploy", "superlink", "--tls", str(certs), "--node-auth", "--print"], capsys)
    assert "--insecure" not in cmd and "--enable-supernode-auth" in cmd
    assert cmd[cmd.index("--ssl-ca-certfile") + 1] == str(certs / "ca.crt")
    assert cmd[cmd.index("--ssl-certfile") + 1] == str(certs / "server.pem")
    assert cmd[cmd.index("--ssl-keyfile") + 1] == str(certs / "server.key")
    assert cmd[-1] == "--disable-runtime-dependency-installation"


def test_supernode_command_takes_its_partition_count_from_the_config(config: Path, tmp_path: Path, capsys) -> None:
    rc, cmd, _ = printed(["deploy", "supernode", str(config), "--partition", "2", "--print"], capsys)
    assert rc == 0 and cmd[0].endswith("flower-supernode")
    assert "--insecure" in cmd and "'partition-id=2" in cmd and "num-partitions=3'" in cmd
    assert "--allow-runtime-dependency-installation" not in cmd  # a SuperNode installs nothing by default
    certs = make_certificates(tmp_path / "certs")
    private, _ = make_node_key(tmp_path / "keys", "node-2")
    full = supernode_command("10.0.0.1:9091", partition=2, num_partitions=3, tls=certs, auth_key=private)
    assert full[full.index("--root-certificates") + 1] == str(certs / "ca.crt") and "--insecure" not in full
    assert full[full.index("--auth-supernode-private-key") + 1] == str(private)


def test_certificates_and_node_keys_are_what_flower_reads(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

    certs = make_certificates(tmp_path / "certs", hosts=("127.0.0.1", "link.example.org"))
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    assert server.issuer == ca.subject
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["link.example.org"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    private, public = make_node_key(tmp_path / "keys", "n0")
    assert isinstance(load_ssh_private_key(private.read_bytes(), None), ec.EllipticCurvePrivateKey)
    assert isinstance(load_ssh_public_key(public.read_bytes()), ec.EllipticCurvePublicKey)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["deploy", "run", "{config}", "--superlink", "127.0.0.1:1"], "cannot reach the SuperLink at 127.0.0.1:1"),
        (["deploy", "run", "{config}", "--superlink", "nohost"], "address 'nohost' is not allowed; allowed: HOST:PORT"),
        (["deploy", "supernode", "{config}", "--partition", "3", "--print"], "partition 3 is out of range"),
        (["deploy", "superlink", "--tls", "{tmp}/none", "--print"], "ca.crt"),
        (["deploy", "superlink", "--node-auth", "--print"], "node authentication needs TLS"),
        (["deploy", "supernode", "{config}", "--partition", "0", "--auth-key", "{tmp}/k", "--print"], "node key"),
        (["deploy", "run", "{config}", "--resume", "--overwrite"], "--overwrite: not allowed with argument --resume"),
    ],
    ids=["unreachable", "address", "partition", "tls-files", "node-auth-without-tls", "node-key", "resume-overwrite"],
)
def test_bad_input_is_a_clear_error(argv, message, config: Path, tmp_path: Path, capsys) -> None:
    argv = [a.format(config=config, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_supernode_partition_range_in_the_library() -> None:
    with pytest.raises(FedriskError, match="partition -1 is out of range"):
        supernode_command(partition=-1, num_partitions=2)
    assert superlink_command()[-1] == "--disable-runtime-dependency-installation"


def test_outputs_line_lists_the_tracking_directories(tmp_path: Path) -> None:
    assert "tensorboard/" not in outputs_line(tmp_path) and "mlruns/" not in outputs_line(tmp_path)
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "mlruns").mkdir()
    assert outputs_line(tmp_path).endswith("plots/ tensorboard/ mlruns/")


def test_deploy_help_imports_neither_torch_nor_flwr(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom fedrisk.cli import main\n"
        "main(['deploy', '--help']); main(['deploy', 'run', '--help']); main(['deploy', 'superlink', '--print'])\n"
        "print('LOADED', 'torch' in sys.modules, 'flwr' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert out.stdout.strip().splitlines()[-1] == "LOADED False False", out.stderr
