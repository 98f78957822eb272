"""Start-up: ``fedrisk --help``, ``fedrisk list`` and config errors answer without importing
torch (which takes 1-2 s), and the source-read catalog behind ``fedrisk list`` equals the
imported registries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedrisk import catalog as catalog_module
from fedrisk.catalog import catalog
from fedrisk.cli_list import _entries

KINDS = ("algorithms", "datasets", "partitioners", "models", "aggregators", "objectives", "executors", "metrics")


@pytest.mark.parametrize("kind", [*KINDS, "attacks"])
def test_catalog_equals_the_imported_registries(kind: str) -> None:
    found = catalog()
    assert found is not None, "a registration could not be read from the source (see fedrisk.catalog)"
    assert _entries(kind, found) == _entries(kind)


def test_catalog_gives_up_on_a_registration_it_cannot_read(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "objectives").mkdir()
    supervised = Path(catalog_module.__file__).parent / "objectives" / "supervised.py"
    (tmp_path / "objectives" / "supervised.py").write_text(supervised.read_text())
    (tmp_path / "mine.py").write_text('ALGORITHMS.add("mine", Mine, "my algorithm")\n')
    monkeypatch.setattr(catalog_module, "_PACKAGE", tmp_path)
    assert catalog()["algorithms"] == [("mine", "my algorithm")]  # type: ignore[index]
    (tmp_path / "mine.py").write_text('ALGORITHMS.add("mine", Mine, DESCRIPTION)\n')
    assert catalog() is None
    (tmp_path / "mine.py").write_text('ALGORITHMS.add("mine", Mine, "a")\n\n@ALGORITHMS.register("mine", "b")\n')
    assert catalog() is None  # registered twice


def modules_after(argv: list[str], tmp_path: Path) -> tuple[int, str]:
    """Run the CLI in a fresh interpreter; its exit code and whether torch got imported."""
    code = (
        "import sys\nfrom fedrisk.cli import main\n"
        f"rc = main({argv!r})\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    last = out.stdout.strip().splitlines()[-1]
    flag, rc = last.split()
    return int(rc), flag


def test_help_list_and_config_errors_do_not_import_torch(tmp_path: Path) -> None:
    assert modules_after(["--help"], tmp_path) == (0, "NO-TORCH")
    assert modules_after(["list"], tmp_path) == (0, "NO-TORCH")
    assert modules_after(["list", "algorithms"], tmp_path) == (0, "NO-TORCH")
    (tmp_path / "broken.toml").write_text("[data\n")
    (tmp_path / "unknown.toml").write_text('[dataa]\ndataset = "digits"\n')
    assert modules_after(["run", "broken.toml"], tmp_path) == (2, "NO-TORCH")
    assert modules_after(["run", "unknown.toml"], tmp_path) == (2, "NO-TORCH")
    assert modules_after(["run", "missing.toml"], tmp_path) == (2, "NO-TORCH")
    assert modules_after(["sweep", "broken.toml"], tmp_path) == (2, "NO-TORCH")
    # details of one component need its class: torch is imported, the answer is the same
    assert modules_after(["list", "algorithms", "fedavg"], tmp_path) == (0, "TORCH")
