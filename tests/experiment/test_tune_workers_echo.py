"""The parallel tune's progress: every worker's trial lines echoed exactly once, as they come."""

from __future__ import annotations

from pathlib import Path

from fedrisk.experiment.tune_workers import _echo_new


def test_interleaved_worker_lines_are_echoed_once_each(tmp_path: Path) -> None:
    echoed: list[str] = []
    seen: dict[str, int] = {}
    w0, w1 = tmp_path / "worker0.log", tmp_path / "worker1.log"
    w0.write_text("[trial 1/4] a\n")
    w1.write_text("[trial 2/4] b\nnot a trial line\n")
    _echo_new(tmp_path, seen, echoed.append)
    assert echoed == ["[trial 1/4] a", "[trial 2/4] b"]
    # worker 0 finishes a trial after worker 1 did: its line is new, worker 1's are not
    w0.write_text("[trial 1/4] a\n[trial 3/4] c\n")
    _echo_new(tmp_path, seen, echoed.append)
    w1.write_text("[trial 2/4] b\nnot a trial line\n[trial 4/4] d\n")
    _echo_new(tmp_path, seen, echoed.append)
    _echo_new(tmp_path, seen, echoed.append)
    assert echoed == ["[trial 1/4] a", "[trial 2/4] b", "[trial 3/4] c", "[trial 4/4] d"]
