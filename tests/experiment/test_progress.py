"""The progress display: the bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import io

from fedrisk.experiment import progress as progress_module
from fedrisk.experiment.progress import Progress, format_duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bar_shows_rounds_times_loss_and_latest_metrics(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    out = io.StringIO()
    p = Progress(total_rounds=10, mode="bar", stream=out, label="fedavg", elapsed_before=30.0)
    p.start(round=2)  # resumed after round 2
    clock.now += 8.0
    p.round_end(4, {"loss": 0.51234})
    p.evaluation(
        {"round": 4, "test_accuracy": 0.8, "bytes_down": 1, "bytes_up": 1, "wall_time": 38.0, "train_loss": 0.5}
    )
    # 2 rounds in 8 s -> 6 rounds left take 24 s; elapsed counts the 30 s before the resume
    assert p.render(200) == "[fedavg] ########------------ 4/10 00:38<00:24  loss 0.5123  test_accuracy 0.8000"
    assert out.getvalue().startswith("\r[fedavg] ")  # redrawn in place
    p.close()
    assert out.getvalue().endswith("\n")
    assert len(p.render(30)) == 30


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
