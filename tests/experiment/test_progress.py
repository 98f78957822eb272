"""The progress display: the bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import io

from fedrisk.api import ProgressBar
from fedrisk.experiment.progress import Progress, format_duration


def test_bar_is_the_tqdm_bar_with_rounds_loss_and_latest_metrics():
    """The bar is fedrisk.api.ProgressBar (tqdm), the one run_federation shows (issue 30)."""
    out = io.StringIO()
    p = Progress(total_rounds=10, mode="bar", stream=out, label="fedavg", elapsed_before=30.0)
    p.start(round=2)  # resumed after round 2
    assert isinstance(p._bar, ProgressBar) and p._bar.bar.n == 2
    p.round_end(4, {"loss": 0.51234})
    p.evaluation(
        {"round": 4, "test_accuracy": 0.8, "bytes_down": 1, "bytes_up": 1, "wall_time": 38.0, "train_loss": 0.5}
    )
    line = out.getvalue().split("\r")[-1]
    assert line.startswith("fedavg:  40%|") and "4/10 [" in line
    assert line.rstrip().endswith("loss=0.5123, test_accuracy=0.8]")  # train_* and byte counts left off
    p.close()
    assert out.getvalue().endswith("\n") and p._bar is None


def test_plain_mode_prints_one_line_per_evaluation():
    out = io.StringIO()  # not a terminal: "auto" picks plain
    p = Progress(total_rounds=4, mode="auto", stream=out)
    assert p.mode == "plain"
    p.start(round=0)
    p.round_end(1, {"loss": 1.0})
    assert out.getvalue() == ""
    p.evaluation(
        {"round": 4, "test_accuracy": 0.5, "test_log_loss": 1.25, "bytes_down": 0, "bytes_up": 0, "wall_time": 61.0}
    )
    assert out.getvalue() == "round 4/4 | elapsed 01:01 | test_accuracy=0.5000 test_log_loss=1.2500\n"


def test_none_mode_is_silent_and_durations_format():
    out = io.StringIO()
    p = Progress(total_rounds=2, mode="none", stream=out)
    p.start(0)
    p.evaluation({"round": 1, "test_accuracy": 0.5})
    p.close()
    assert out.getvalue() == ""
    assert [format_duration(s) for s in (0, 59.6, 3599, 3600, None)] == ["00:00", "01:00", "59:59", "1:00:00", "--:--"]
