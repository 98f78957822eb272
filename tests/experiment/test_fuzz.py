"""Hostile input, fuzzed with hypothesis: config files (schema-guided mutations of a valid
config: wrong types, out-of-range values, NaN / inf, 10^30, unicode, unknown keys, deep
nesting; and arbitrary bytes), ``--set`` overrides and the command line.  Every case either
validates or ends in a :class:`FedriskError` (exit status 2 and one ``error:`` line per problem
from the CLI): never another exception, never a traceback.

The default suite runs ``FEDRISK_FUZZ_EXAMPLES`` examples per test (default 60); the full run
is ``FEDRISK_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest tests/experiment/test_fuzz.py
tests/data/test_fuzz_data.py`` (see docs/reliability.md).
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any

import pytest
import tomli_w
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrisk.cli import main
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import SCHEMA, SECTIONS, resolve_config

from .conftest import TINY

EXAMPLES = int(os.environ.get("FEDRISK_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a shared CI machine: time is checked by the CLI test's own bound
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
KEYS = sorted(f"{section}.{name}" for section in SECTIONS for name in SCHEMA[section].model_fields)
ALGORITHM_KEYS = ["algorithm.lr", "algorithm.local_steps", "algorithm.batch_size", "algorithm.clients_per_round"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["auto", "none", "fedavg", "digits", "mlp", "float64", "dirichlet", "", "\x00", "ü✓"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)
key_names = st.one_of(
    st.sampled_from(KEYS + ALGORITHM_KEYS), st.from_regex(r"[a-z_]{1,8}(\.[a-z_]{1,8}){0,3}", fullmatch=True)
)


def _drop_none(value: Any) -> Any:
    """TOML has no null: drop None (it stands for "key absent")."""
    if isinstance(value, dict):
        return {str(k): _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value if v is not None]
    return value


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    raw = copy.deepcopy(TINY)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(key_names)
        if key.split(".")[0] == "imports":  # imports name modules to run: not fuzzed (see docs/reliability.md)
            continue
        parts = key.split(".")
        node = raw
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if draw(st.booleans()) and parts[-1] in node:
            del node[parts[-1]]
        else:
            node[parts[-1]] = draw(values)
    return _drop_none(raw)


def _resolve_or_user_error(raw: dict[str, Any], overrides: list[str] = ()) -> None:
    try:
        cfg = resolve_config(raw, overrides)
    except FedriskError as exc:
        message = str(exc)
        lines = message.splitlines()  # one line per problem of the config
        assert lines and all(line.strip() for line in lines) and "Traceback" not in message, message
        return
    # what validates is well-typed
    assert isinstance(cfg["run.rounds"], int) and cfg["run.rounds"] >= 1
    for key in ("algorithm.lr", "run.rounds", "data.num_clients"):
        v = cfg.values.get(key.split(".")[0], {}).get(key.split(".")[1])
        assert not (isinstance(v, float) and not math.isfinite(v)), (key, v)


@FUZZ
@given(mutated_configs())
def test_mutated_configs_validate_or_fail_cleanly(raw: dict[str, Any]) -> None:
    _resolve_or_user_error(raw)


@FUZZ
@given(st.lists(st.tuples(key_names, st.text(max_size=20)), min_size=1, max_size=3))
def test_set_overrides_validate_or_fail_cleanly(pairs: list[tuple[str, str]]) -> None:
    overrides = [f"{k}={v}" for k, v in pairs if not k.startswith("imports")]
    _resolve_or_user_error(copy.deepcopy(TINY), overrides)


@FUZZ
@given(st.text(max_size=40))
def test_malformed_set_strings_fail_cleanly(text: str) -> None:
    if text.partition("=")[0].strip().startswith("imports"):
        return
    _resolve_or_user_error(copy.deepcopy(TINY), [text])


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200).map(str.encode),
        mutated_configs().map(lambda raw: tomli_w.dumps(raw).encode()),
    )
)
def test_cli_config_files_never_traceback(tmp_path_factory: pytest.TempPathFactory, data: bytes, capsys) -> None:
    """``fedrisk run FILE`` on arbitrary bytes and mutated configs: a config that does not
    validate exits with status 2 and one message line (nothing is run)."""
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "c.toml"
    path.write_bytes(data)
    try:
        raw = tomllib.loads(data.decode())
        resolve_config(raw)  # the message names the bad name and the registered ones
        valid = True
    except (FedriskError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        valid = False
    if valid:  # runs are exercised elsewhere; a valid mutated config may be large
        return
    capsys.readouterr()
    code = main(["run", str(path), "--out", str(folder / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert not (folder / "out").exists()  # nothing written


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"data": {"dataset": "digits"}, "algorithm": {"name": "os.system"}},
            r"os\.system.*valid choices: .*centralized",
        ),
        ({"data": {"dataset": "builtins.eval"}}, r"builtins\.eval.*(?i:valid choices): .*adult"),
        (
            {"data": {"dataset": "digits"}, "model": {"name": "torch.nn.Linear"}},
            r"torch\.nn\.Linear.*(?i:valid choices): .*cnn",
        ),
        (
            {"data": {"dataset": "digits"}, "algorithm": {"name": "fedavg", "aggregator": "subprocess.Popen"}},
            r"subprocess\.Popen.*(?i:valid choices): .*mean",
        ),
    ],
)
def test_configs_name_only_registered_components(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(FedriskError, match=message):
        resolve_config(raw)  # the message names the bad name and the registered ones
