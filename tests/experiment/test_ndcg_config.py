"""Federated NDCG from the command line: the shipped config end to end with NDCG@k on test and on a
validation split of whole queries, selection on validation, and bad ranking splits named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedrisk.cli import main
from fedrisk.data.build import build_federation
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.metrics.ranking import ndcg_at_k
from fedrisk.runtime.evaluation import check_client_splits

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "fedxl" / "ranking_ndcg.toml"
SMALL = [
    *("--set", "data.dataset_options.queries_per_client=3", "--set", "data.dataset_options.test_queries_per_client=2"),
    *("--set", "data.dataset_options.items_per_query=8", "--set", "algorithm.num_queries=12"),
    *("--set", "output.plots=false"),
]


@pytest.mark.parametrize("variant", ["fedxl2_ndcg", "local_ndcg"])
def test_shipped_ndcg_config_runs_and_selects_on_validation_ndcg(capsys, tmp_path, variant) -> None:
    out_dir = tmp_path / variant
    argv = ["run", str(CONFIG), "--variant", variant, "--out", str(out_dir), "--plain", "--set", "run.rounds=4",
            "--set", "run.eval_every=2", "--set", "data.validation_fraction=0.25", *SMALL]  # fmt: skip
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "| test_ndcg@5 |" in out and "| validation_ndcg@10 |" in out
    assert "by validation_ndcg@5 = " in out
    summary = json.loads((out_dir / "summary.json").read_text())
    assert 0.0 <= summary["final"]["test_ndcg@5"] <= 1.0


def test_validation_split_holds_whole_queries() -> None:
    options = {"queries_per_client": 5, "items_per_query": 6, "test_queries_per_client": 1, "dim": 3, "split": "items"}
    fed = build_federation("synthetic_ranking", "by_attribute", 3, seed=4, dataset_options=options,
                           validation_fraction=0.2)  # fmt: skip
    val_q = fed.validation.attrs["query"]
    train_q = torch.cat([c.attrs["query"] for c in fed.clients])
    assert len(set(val_q.tolist())) == 3  # ceil(0.2 · 15) whole queries
    assert not set(val_q.tolist()) & set(train_q.tolist())
    assert all(int((val_q == q).sum()) == 6 for q in val_q.unique())  # every item of a held-out query
    # NDCG on the validation split is the mean over its 3 queries of a direct computation
    s = torch.arange(len(val_q), dtype=torch.float64)
    per_query = [ndcg_at_k(s[val_q == q], fed.validation.y[val_q == q], [0] * 6, k=5) for q in val_q.unique()]
    assert ndcg_at_k(s, fed.validation.y, val_q, k=5) == pytest.approx(sum(per_query) / 3)


def test_a_split_query_without_a_relevant_item_is_named() -> None:
    x = torch.zeros(4, 2)
    good = Samples(x, torch.tensor([1, 0, 2, 0]), {"query": torch.tensor([0, 0, 1, 1])})
    bad = Samples(x, torch.tensor([1, 0, 0, 0]), {"query": torch.tensor([0, 0, 1, 1])})
    check_client_splits(Federation("r", [good], 4, test=good), ["ndcg@5"], ["test"])
    check_client_splits(Federation("r", [good], 4, test=bad), ["auroc"], ["test"])  # no NDCG: no query check
    with pytest.raises(FedriskError, match="the test set: query 1 has no relevant item"):
        check_client_splits(Federation("r", [good], 4, test=bad), ["ndcg@5"], ["test"])
    with pytest.raises(FedriskError, match="client 1's test split: query 1 has no relevant item"):
        check_client_splits(Federation("r", [good, good], 4, client_tests=[good, bad]), ["ndcg"], ["test"])
