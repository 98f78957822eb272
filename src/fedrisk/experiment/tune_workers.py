"""Parallel trials of ``fedrisk tune --jobs J``: J worker processes share the study in ``OUT``
through its journal file; proposals are serialised by a file lock, each worker runs its
trials in-process, and every worker holds a shared lock on ``OUT/.workers.lock`` for its life
(see :mod:`fedrisk.experiment.tune`).

How the workers start.  When each trial runs on one thread (``run.threads = 1``, or the
default with no more cores than jobs) the workers are **forked** from the tuner after it has
imported torch and fedrisk and built the study's data once: a worker starts in milliseconds
and shares the data (copy-on-write) instead of importing for seconds and loading the data
again.  Otherwise (several threads per trial) they are fresh interpreters
(``python -m fedrisk.experiment.tune_workers OUT``): the OpenMP runtime that torch uses is
not fork-safe once the parent has run multi-threaded work and the child runs some too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedrisk.data.build import reuse_federations
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import ExperimentConfig, resolve_config
from fedrisk.experiment.runner import RunInterrupted
from fedrisk.experiment.tune import (
    WORKERS_LOCK,
    TuneSpec,
    _read_spec_file,
    open_study,
    run_trial,
)
from fedrisk.experiment.tune_space import parse_dimension
from fedrisk.experiment.tune_storage import flock


def worker_threads(base: ExperimentConfig | None, jobs: int) -> int:
    """The torch threads of each trial of a ``jobs``-worker tune: ``run.threads``, else the
    cores shared out among the workers."""
    threads = base["run.threads"] if base is not None else 0
    return threads or max(1, (os.cpu_count() or 1) // jobs)


def forks(base: ExperimentConfig | None, spec: TuneSpec) -> bool:
    """Whether the workers are forked (see the module doc): one thread per trial, a platform
    with ``fork``, and no tuned ``run.threads``."""
    return (
        base is not None
        and hasattr(os, "fork")
        and "run.threads" not in spec.space
        and worker_threads(base, spec.jobs) == 1
    )


class _Forked:
    """A worker forked from this process; ``target()`` is its exit status, its output goes to
    ``log``.  The same interface as :class:`subprocess.Popen` for :func:`run_workers`."""

    def __init__(self, target: Callable[[], int], log: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed stream holds nothing to write twice
                stream.flush()  # nothing buffered is written twice
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid:
            return
        code = 1  # the child: never returns into the parent's stack
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has them
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            sys.stdout = sys.stderr = os.fdopen(os.dup(log.fileno()), "w", buffering=1)
            import torch

            torch.set_num_threads(1)
            code = target()
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


def _prefetch(base: ExperimentConfig, spec: TuneSpec) -> None:
    """Build the trials' simulation once in the tuner (inside :func:`reuse_federations`): the
    forked workers inherit the data and every module a trial imports.  Skipped when the search
    space changes the data; a config error is left to the trials to report."""
    if any(k.startswith("data.") or k.startswith("run.seed") for k in spec.space):
        return
    from fedrisk.experiment.assemble import build_simulation

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build_simulation(base.with_overrides({"run.seeds": []}))
    except FedriskError:
        pass


def run_workers(out: Path, spec: TuneSpec, echo: Callable[[str], None], base: ExperimentConfig | None = None) -> None:
    """``spec.jobs`` worker processes share the study (forked from this one when :func:`forks`)."""
    procs: list[tuple[Any, Any]] = []
    if forks(base, spec):
        assert base is not None
        _prefetch(base, spec)
        for i in range(spec.jobs):
            log = open(out / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
            procs.append((_Forked(lambda: work(out, base, spec), log), log))
    else:
        threads = worker_threads(base, spec.jobs)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
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
    seen: dict[str, int] = {}
    shown = time.perf_counter()
    try:
        while any(p.poll() is None for p, _ in procs):
            time.sleep(0.02)  # notice the last worker's end at once; echo its lines twice a second
            if time.perf_counter() - shown > 0.5:
                _echo_new(out, seen, echo)
                shown = time.perf_counter()
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


def _echo_new(out: Path, seen: dict[str, int], echo: Callable[[str], None]) -> None:
    """Echo each worker log's trial lines not echoed yet; ``seen`` counts them per log (a count
    over all logs together would repeat one worker's lines and skip another's as they interleave)."""
    for log in sorted(out.glob("worker*.log")):
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("[trial ")]
        for line in lines[seen.get(log.name, 0) :]:
            echo(line)
        seen[log.name] = max(seen.get(log.name, 0), len(lines))


def work(out: Path, base: ExperimentConfig, spec: TuneSpec) -> int:
    """One worker's loop: run trials of the study in ``out`` until the budget is spent; its exit status."""
    with flock(out / WORKERS_LOCK, shared=True), reuse_federations():
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


def worker_main(argv: Sequence[str] | None = None) -> int:
    """A worker of a parallel tune started as a fresh interpreter: reads the study's settings
    from ``OUT/tune.toml`` and runs :func:`work`."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fedrisk.experiment.tune_workers")
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
    return work(out, base, spec)


if __name__ == "__main__":  # a worker of a parallel tune (see run_workers)
    sys.exit(worker_main())
