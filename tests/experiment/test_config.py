"""Config validation: defaults, overrides, round trips and the messages of bad input."""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import annotated_types as at
import pytest
import tomllib

from fedrisk.algorithms import ALGORITHMS, FedAvg
from fedrisk.cli import main
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import (
    algorithm_fields,
    apply_overrides,
    assignments,
    diff_configs,
    load_config,
    overlapping_keys,
    parse_assignment,
    parse_literal,
    resolve_config,
    resolve_seeds,
)
from fedrisk.experiment.schema import REQUIRED, Section, derived_section, toml_type, validate

from .conftest import write_config


@dataclasses.dataclass(frozen=True)
class ClippedAvg(FedAvg):
    """FedAvg with ranges and choices declared in its own annotations."""

    name: ClassVar[str] = "clipped_avg_test"
    clip: Annotated[float, at.Gt(0)] = 1.0
    mode: Literal["norm", "value"] = "norm"
    window: tuple[int, int] = (2, 3)
    decay: float | None = None


def test_defaults_are_filled_from_schema_algorithm_and_model(tiny):
    cfg = resolve_config(tiny)
    assert cfg["data.partition"] == "dirichlet"
    assert cfg["data.seed"] == "run"
    assert cfg["data.partition_options"] == {"alpha": 0.5}
    assert cfg["model.num_outputs"] == "auto"
    assert cfg["model.output_activation"] is None  # the logreg factory's default
    assert cfg["algorithm.weighting"] == "samples"  # FedAvg's dataclass default
    assert cfg["algorithm.clients_per_round"] is None
    assert cfg["algorithm.aggregator"] == "weighted_mean"
    assert cfg["algorithm.server_lr"] == 1.0
    assert cfg["run.eval_every"] == 1 and cfg["run.splits"] == ["test"]
    assert "sweep" not in cfg.run_values()


def test_resolved_toml_round_trips(tiny, tmp_path):
    tiny["algorithm"]["clients_per_round"] = 2
    tiny["data"]["binarize"] = {"positive_classes": [1, 3], "imratio": 0.2}
    cfg = resolve_config(tiny)
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.to_toml())
    again = load_config(path)
    assert again.semantic() == cfg.semantic()
    assert again.run_values() == cfg.run_values()
    text = tomllib.loads(path.read_text())
    assert text["algorithm"]["clients_per_round"] == 2
    assert text["model"]["output_activation"] == "none"  # TOML has no null
    assert "feature_noise" not in text["data"]  # absent optional tables stay absent


def test_set_overrides_parse_toml_literals_and_create_tables(tiny):
    cfg = resolve_config(
        tiny,
        [
            "algorithm.lr=0.05",
            "algorithm.name=fedprox",
            "algorithm.mu=1e-3",
            "model.name=mlp",
            "model.hidden=[8, 4]",
            "data.partition_options.min_size=5",
            'run.metrics=["accuracy", "worst_class_accuracy"]',
            "algorithm.clients_per_round=none",
        ],
    )
    assert cfg["algorithm.lr"] == 0.05 and cfg["algorithm.mu"] == 0.001
    assert cfg["model.hidden"] == [8, 4]
    assert cfg["data.partition_options"] == {"alpha": 0.5, "min_size": 5}
    assert cfg["run.metrics"] == ["accuracy", "worst_class_accuracy"]
    assert cfg["algorithm.clients_per_round"] is None


def test_parse_literal_and_assignment():
    assert parse_literal("3") == 3 and parse_literal("3.0") == 3.0 and parse_literal("true") is True
    assert parse_literal("fedavg") == "fedavg" and parse_literal('"a b"') == "a b"
    assert parse_literal("{name = 'median'}") == {"name": "median"}
    assert parse_assignment("run.rounds = 7") == ("run.rounds", 7)
    with pytest.raises(FedriskError, match=r"--set expects key=value with a dotted key .*got 'rounds'"):
        parse_assignment("rounds")
    with pytest.raises(FedriskError, match=r"got 'a..b=1'"):
        parse_assignment("a..b=1")


def test_set_into_a_value_is_refused():
    with pytest.raises(FedriskError, match=r"cannot set 'run.rounds.x': 'run.rounds' is a value \(5\), not a table"):
        apply_overrides({"run": {"rounds": 5}}, ["run.rounds.x=1"])


def test_overlapping_keys_are_the_same_key_a_table_it_replaces_and_a_value_around_it():
    given = assignments(["run.rounds=8", "data.binarize={imratio = 0.2}", "algorithm.aggregator.beta=0.1"])
    assert given == {"run.rounds": 8, "data.binarize": {"imratio": 0.2}, "algorithm.aggregator.beta": 0.1}
    variant = {
        "run.rounds": 64,  # the same key
        "run.rounds_per_stage": 4,  # a longer name, not inside run.rounds: kept
        "data.binarize.positive_classes": [1],  # inside a table --set replaces
        "algorithm.aggregator": "median",  # a value that --set sets a key inside
        "algorithm.lr": 0.1,
    }
    assert overlapping_keys(variant, given) == ["run.rounds", "data.binarize.positive_classes", "algorithm.aggregator"]
    assert overlapping_keys(variant, []) == []


def test_resolve_seeds():
    assert resolve_seeds(3, 10) == [10, 11, 12]
    assert resolve_seeds([4, 2]) == [4, 2]


def test_algorithm_fields_classify_the_dataclass():
    from fedrisk.algorithms import ALGORITHMS

    f = algorithm_fields(ALGORITHMS.get("fedavg"))
    assert (f.loss, f.aggregator, f.server_opt) == ("loss", "aggregator", "server_opt")
    assert set(f.hyper) == {"lr", "local_steps", "batch_size", "weighting", "clients_per_round", "sampling"}
    codasca = algorithm_fields(ALGORITHMS.get("codasca"))
    assert codasca.loss is None and "auc_loss" in codasca.hyper and "margin" in codasca.hyper


def coerce(key, value, annotation):
    """One value checked against an annotation, the way an algorithm's hyper-parameter is."""
    model = derived_section("T", Section, {key: (toml_type(annotation), REQUIRED)})
    obj, problems = validate(model, {key: value}, "")
    if problems:
        raise FedriskError("\n".join(problems))
    return getattr(obj, key)


def test_type_language():
    from typing import Literal, Optional

    from fedrisk.aggregators import Aggregator

    assert coerce("k", [1, 2], tuple[float, ...]) == (1.0, 2.0)
    assert coerce("k", "none", Optional[int]) is None  # noqa: UP045
    assert coerce("k", 3, int | str) == 3
    assert coerce("k", "a", Literal["a", "b"]) == "a"
    assert toml_type(Aggregator) is None
    with pytest.raises(FedriskError, match=r"^k = true has the wrong type; allowed: an integer$"):
        coerce("k", True, int)
    with pytest.raises(FedriskError, match=r"^k = \[1, \"x\"\] has the wrong type; allowed: a list of numbers$"):
        coerce("k", [1, "x"], list[float])


def test_diff_configs_names_keys():
    assert diff_configs({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4})[0] == ("b", 2, 3)
    assert [k for k, _, _ in diff_configs({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4})] == ["b", "c"]


# ----------------------------------------------------------------------------- bad input


def err(raw, overrides=()):
    with pytest.raises(FedriskError) as info:
        resolve_config(raw, overrides)
    return str(info.value)


def test_unknown_section_suggests_and_lists(tiny):
    tiny["algoritm"] = {"lr": 0.1}
    msg = err(tiny)
    assert msg.startswith("unknown key 'algoritm' (did you mean 'algorithm'?); valid keys in the top level: ")
    assert "data, dual_model, imports, model" in msg


def test_unknown_algorithm_key_suggests_and_lists(tiny):
    msg = err(tiny, ["algorithm.lrr=0.1"])
    assert msg == (
        "unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?); valid keys in [algorithm]: aggregator, "
        "batch_size, clients_per_round, local_steps, lr, name, sampling, server_lr, server_momentum, "
        "server_nesterov, server_optimizer, weighting"
    )


def test_unknown_names_suggest_and_list(tiny):
    msg = err(tiny, ["algorithm.name=scafold"])
    assert msg.startswith(
        "algorithm.name = \"scafold\" is not a known name (did you mean 'scaffold'?); valid choices: "
    )
    assert "fedavg" in msg
    msg = err(tiny, ["data.dataset=fashion-mnist"])
    assert "(did you mean 'fashion_mnist'?)" in msg
    msg = err(tiny, ["data.partition=dirichlett"])
    assert "(did you mean 'dirichlet'?)" in msg and "k_classes" in msg
    msg = err(tiny, ["run.executor=vectorised"])
    assert "(did you mean 'vectorized'?)" in msg
    msg = err(tiny, ["objective.name=cross_entropi"])
    assert "(did you mean 'cross_entropy'?)" in msg
    msg = err(tiny, ["algorithm.aggregator=weighted"])
    assert msg.startswith("algorithm.aggregator = \"weighted\" is not a known name (did you mean 'weighted_mean'?)")


def test_robust_aggregator_tables_take_nonfinite_pre_and_bucket_size(tiny):
    """Every robust aggregator's table takes the shared keys (its rule's options come from its
    signature, which hides them behind **kw); at their defaults they stay out of the resolved table."""
    from fedrisk.experiment.runner import build_aggregator

    tiny["algorithm"] = {"name": "robust_sgd"}
    cfg = resolve_config(tiny, ['algorithm.aggregator={name = "krum", f = 1, nonfinite = "exclude", pre = "nnm"}'])
    assert cfg["algorithm.aggregator"] == {"name": "krum", "f": 1, "nonfinite": "exclude", "pre": "nnm"}
    agg = build_aggregator(cfg["algorithm.aggregator"])
    assert (agg.f, agg.nonfinite, agg.pre, agg.bucket_size) == (1, "exclude", "nnm", 2)
    cfg = resolve_config(tiny, ['algorithm.aggregator={name = "krum", nonfinite = "raise", bucket_size = 2}'])
    assert cfg["algorithm.aggregator"] == {"name": "krum", "f": 1}  # as before these keys existed
    cfg = resolve_config(tiny, ['algorithm.aggregator={name = "median", nonfinite = "exclude"}'])
    assert cfg["algorithm.aggregator"]["nonfinite"] == "exclude"  # median's own signature has it
    assert err(tiny, ['algorithm.aggregator={name = "mean", nonfinite = "exclude"}']).startswith(
        "unknown key 'algorithm.aggregator.nonfinite'"
    )
    assert "nonfinite" in err(tiny, ['algorithm.aggregator={name = "median", nonfinite = 3}'])


def test_an_aggregator_name_that_is_not_a_string(tiny):  # (it raised a TypeError before the pydantic schema)
    assert err(tiny, ["algorithm.aggregator={name = 3}"]) == (
        "algorithm.aggregator.name = 3 has the wrong type; allowed: a string"
    )


def test_unknown_option_keys_of_named_components(tiny):
    assert err(tiny, ["data.partition_options.alfa=0.1"]) == (
        "unknown key 'data.partition_options.alfa' (did you mean 'data.partition_options.alpha'?); valid options of "
        "partitioner 'dirichlet': alpha, balance, max_tries, min_size, on"
    )
    assert "valid options of dataset 'digits'" in err(tiny, ["data.dataset_options.flaten=true"])
    assert (
        err(tiny, ["model.hiden=[4]"])
        == "unknown key 'model.hiden'; valid options of model 'logreg': bias, output_activation"
    )
    msg = err(tiny, ["model.name=mlp", "model.hiden=[4]"])
    assert msg.startswith("unknown key 'model.hiden' (did you mean 'model.hidden'?); valid options of model 'mlp'")


def test_wrong_types_name_key_value_and_allowed(tiny):
    assert err(tiny, ['run.rounds="ten"']) == 'run.rounds = "ten" has the wrong type; allowed: an integer'
    assert err(tiny, ["algorithm.lr=fast"]) == 'algorithm.lr = "fast" has the wrong type; allowed: a number'
    assert err(tiny, ["run.eval_at_start=1"]) == "run.eval_at_start = 1 has the wrong type; allowed: true or false"
    assert err(tiny, ["algorithm.clients_per_round=2.5"]) == (
        'algorithm.clients_per_round = 2.5 has the wrong type; allowed: an integer or "none"'
    )
    assert err(tiny, ["model.name=mlp", "model.hidden=64"]) == (
        "model.hidden = 64 has the wrong type; allowed: a list of integers"
    )
    assert err(tiny, ["data.binarize=3"]) == "data.binarize = 3 has the wrong type; allowed: a table"


def test_ranges_name_key_value_and_allowed(tiny):
    assert err(tiny, ["run.rounds=0"]) == "run.rounds = 0 is out of range; allowed: [1, inf)"
    assert err(tiny, ["data.client_test_fraction=1.5"]) == (
        "data.client_test_fraction = 1.5 is out of range; allowed: [0.0, 1.0)"
    )
    # the algorithm's own checks run up front, before any data is loaded
    assert err(tiny, ["algorithm.lr=-0.1"]) == "[algorithm] fedavg: lr = -0.1 is not allowed; it must be a number > 0"
    assert err(tiny, ["algorithm.weighting=size"]).startswith("[algorithm] fedavg: unknown weighting 'size'.")
    assert err(tiny, ["algorithm.server_momentum=1.0"]) == (
        "algorithm.server_momentum = 1.0 is out of range; allowed: [0.0, 1.0)"
    )


def test_cross_key_checks(tiny):
    assert err(tiny, ['run.splits=["validation"]']).startswith(
        'run.splits includes "validation" but data.validation_fraction = 0.0'
    )
    msg = err(tiny, ["algorithm.name=scaffold", "algorithm.server_lr=2.0"])
    assert msg.startswith("algorithm.server_lr is not allowed for algorithm 'scaffold' (it has no server optimiser)")
    del tiny["algorithm"]["local_steps"]
    msg = err(tiny, ["algorithm.name=codasca", "objective.name=cross_entropy"])
    assert msg.startswith(
        "objective.name = \"cross_entropy\" is not allowed: algorithm 'codasca' defines its own objective"
    )
    assert err(tiny, ['run.metrics=["acuracy"]']).startswith("run.metrics: unknown metric 'acuracy'. Did you mean")
    assert err(tiny, ["data.seed=later"]) == 'data.seed = "later" is not allowed; allowed: "run" or an integer >= 0'
    assert err(tiny, ["model.num_outputs=many"]) == (
        'model.num_outputs = "many" is not allowed; allowed: "auto" or an integer >= 1'
    )


def test_missing_required_and_missing_data():
    assert err({"run": {"rounds": 2}}).startswith("the config needs a [data] table")
    assert err({"data": {"num_clients": 2}}).startswith("missing required key 'data.dataset'; valid choices: ")


def test_sweep_table_validation(tiny):
    assert err(tiny, ["sweep.grid.algorithm.lr=0.1"]) == (
        "sweep.grid.algorithm.lr = 0.1 has the wrong type; allowed: a non-empty list of values"
    )
    assert err(tiny, ["sweep.seeds=0"]) == "sweep.seeds = 0 is out of range; allowed: [1, inf)"
    cfg = resolve_config(
        tiny, ["sweep.grid.algorithm.lr=[0.1, 0.2]", 'sweep.variants.a={"algorithm.name" = "fedprox"}']
    )
    assert cfg["sweep.grid"] == {"algorithm.lr": [0.1, 0.2]}
    assert cfg["sweep.variants"] == {"a": {"algorithm.name": "fedprox"}}


def test_file_errors(tmp_path):
    with pytest.raises(FedriskError, match=r"config file '.*nope.toml' does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[data\ndataset = 1\n")
    with pytest.raises(FedriskError, match=r"bad.toml: invalid TOML: "):
        load_config(bad)
    path = write_config(tmp_path / "imp.toml", {"imports": ["no_such_module_xyz"], "data": {"dataset": "digits"}})
    with pytest.raises(FedriskError, match=r"imports: cannot import module 'no_such_module_xyz'"):
        load_config(path)


def test_every_problem_of_a_config_is_reported_one_line_each(tiny, tmp_path, capsys):
    overrides = [
        "run.rounds=0",
        "algorithm.lrr=0.1",
        "data.binarize.imratio=2",
        "model.hiden=[4]",
        "data.partition_options.alfa=1",
        "data.num_clients=1.5",
    ]
    assert err(tiny, overrides).splitlines() == [
        "data.num_clients = 1.5 has the wrong type; allowed: an integer",
        "data.binarize.imratio = 2.0 is out of range; allowed: (0.0, 1.0)",
        "unknown key 'data.partition_options.alfa' (did you mean 'data.partition_options.alpha'?); valid options "
        "of partitioner 'dirichlet': alpha, balance, max_tries, min_size, on",
        "unknown key 'model.hiden'; valid options of model 'logreg': bias, output_activation",
        "unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?); valid keys in [algorithm]: aggregator, "
        "batch_size, clients_per_round, local_steps, lr, name, sampling, server_lr, server_momentum, "
        "server_nesterov, server_optimizer, weighting",
        "run.rounds = 0 is out of range; allowed: [1, inf)",
    ]
    path = write_config(tmp_path / "c.toml", tiny)
    assert main(["run", str(path), "--set", "run.rounds=0", "--set", "model.hiden=[4]", "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unknown key 'model.hiden'; valid options of model 'logreg': bias, output_activation",
        "error: run.rounds = 0 is out of range; allowed: [1, inf)",
    ]


def test_algorithm_table_is_derived_from_the_dataclass(tiny):
    ALGORITHMS.add(ClippedAvg.name, ClippedAvg, "test only")
    try:
        cfg = resolve_config(tiny, ["algorithm.name=clipped_avg_test", "algorithm.clip=2", "algorithm.window=[1, 4]"])
        assert cfg["algorithm.clip"] == 2.0 and isinstance(cfg["algorithm.clip"], float)
        assert cfg["algorithm.window"] == (1, 4) and cfg["algorithm.decay"] is None and cfg["algorithm.mode"] == "norm"
        assert cfg["algorithm.lr"] == 0.1  # FedAvg's fields come with it
        msg = err(
            tiny,
            [
                "algorithm.name=clipped_avg_test",
                "algorithm.clip=0",
                "algorithm.mode=both",
                "algorithm.window=[1]",
                "algorithm.decay=none",
            ],
        )
        assert msg.splitlines() == [
            "algorithm.clip = 0.0 is out of range; allowed: (0, inf)",
            "algorithm.mode = \"both\" has the wrong type; allowed: one of 'norm', 'value'",
            "algorithm.window = [1] has the wrong type; allowed: a list of 2 (an integer, an integer)",
        ]
    finally:
        ALGORITHMS._entries.pop(ClippedAvg.name, None)


def test_none_is_null_where_a_fixed_key_allows_it(tiny):
    cfg = resolve_config(
        tiny, ["data.binarize.imratio=none", "data.binarize.positive_classes=none", "data.label_noise=none"]
    )
    assert cfg["data.binarize.imratio"] is None and cfg["data.binarize.positive_classes"] is None
    assert cfg["data.label_noise"] is None and "label_noise" not in cfg.run_values()["data"]
    assert err(tiny, ["data.num_clients=none"]) == 'data.num_clients = "none" has the wrong type; allowed: an integer'
    assert resolve_config(tiny, ["run.init_from=none"])["run.init_from"] == "none"  # a string key keeps the text
