"""Parallel trials of ``fedrisk tune --jobs J``: J worker processes
(``python -m fedrisk.experiment.tune_workers OUT``) share the study in ``OUT`` through its SQLite
storage; proposals are serialised by a file lock, each worker runs its trials in-process, and
every worker holds a shared lock on ``OUT/.workers.lock`` for its life (see
:mod:`fedrisk.experiment.tune`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import RunInterrupted
from fedrisk.experiment.tune import WORKERS_LOCK, TuneSpec, _flock, _read_spec_file, open_study, run_trial
from fedrisk.experiment.tune_space import parse_dimension


def run_workers(out: Path, spec: TuneSpec, echo: Callable[[str], None]) -> None:
    """``spec.jobs`` worker processes (``python -m fedrisk.experiment.tune OUT``) share the study."""
    threads = max(1, (os.cpu_count() or 1) // spec.jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    procs = []
    for i in range(spec.jobs):
        log = open(out / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
        cmd = [sys.executable, "-m", "fedrisk.experiment.tune_workers", str(out), "--trials", str(spec.trials)]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    stop: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        stop.append(signum)
        for p, _ in procs:
            p.send_signal(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    seen = 0
    try:
        while any(p.poll() is None for p, _ in procs):
            time.sleep(0.5)
            seen = _echo_new(out, seen, echo)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for _, log in procs:
            log.close()
    _echo_new(out, seen, echo)
    if stop:
        raise FedriskError(f"tune stopped by a signal; continue with --resume ({out})")
    bad = [(i, p.returncode) for i, (p, _) in enumerate(procs) if p.returncode != 0]
    if bad:
        i, code = bad[0]
        tail = (out / f"worker{i}.log").read_text().strip().splitlines()[-1:]
        raise FedriskError(f"tune worker {i} exited with status {code}: {' '.join(tail)} (log: {out}/worker{i}.log)")


def _echo_new(out: Path, seen: int, echo: Callable[[str], None]) -> int:
    lines = []
    for log in sorted(out.glob("worker*.log")):
        lines += [ln for ln in log.read_text().splitlines() if ln.startswith("[trial ")]
    for line in lines[seen:]:
        echo(line)
    return max(seen, len(lines))


def worker_main(argv: Sequence[str] | None = None) -> int:
    """A worker of a parallel tune: runs trials of the study in ``OUT`` until the budget is spent."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fedrisk.experiment.tune")
    p.add_argument("out")
    p.add_argument("--trials", type=int, required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    saved = _read_spec_file(out)
    source = Path(saved["source"]) if saved["source"] else None
    base = resolve_config(saved["config"], source=source)
    st = saved["study"]
    spec = TuneSpec(
        space={k: parse_dimension(k, v) for k, v in st["space"].items()},
        trials=args.trials,
        metric=st["metric"],
        pruner=st["pruner"],
        sampler=st["sampler"],
        seed=st["seed"],
        warmup=st["warmup"],
    )
    with _flock(out / WORKERS_LOCK, shared=True):
        study, sampler = open_study(out, spec)
        try:
            while run_trial(study, sampler, base, spec, out, lambda line: print(line, flush=True), out / ".ask.lock"):
                pass
        except RunInterrupted as exc:
            print(str(exc), flush=True)
            return exc.exit_code
        except FedriskError as exc:
            print(f"error: {exc}", flush=True)
            return 2
    return 0


if __name__ == "__main__":  # a worker of a parallel tune (see run_workers)
    sys.exit(worker_main())
