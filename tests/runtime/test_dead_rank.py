"""When a rank dies, the survivors' failed collective names it (issue 14, item 5): a
:class:`~fedrisk.runtime.distributed.RankFailure` saying which rank (and pid) died, instead of
gloo's "connection closed by peer"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedrisk.runtime.distributed import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks pids through /proc (Linux)")

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from fedrisk.runtime.distributed import DistributedExecutor, RankFailure
    ex = DistributedExecutor()
    assert ex.any_rank(False) is False  # both ranks alive: the group works
    if ex.rank == 1:
        os._exit(3)  # dies without a word, as under kill -9
    time.sleep(1.0)
    try:
        ex.any_rank(False)
    except RankFailure as exc:
        print("RankFailure:", exc, flush=True)
        sys.exit(0)
    print("no error", flush=True)
    sys.exit(1)
    """
)


def test_a_dead_rank_is_named_by_the_survivor(tmp_path: Path) -> None:
    port = str(free_port())
    base = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "FEDRISK_COLLECTIVE_TIMEOUT_S": "20"}  # fmt: skip
    pipe = subprocess.PIPE
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER], env={**base, "RANK": str(r)}, stdout=pipe, stderr=pipe)
        for r in range(2)
    ]
    try:
        out, err = (b.decode() for b in procs[0].communicate(timeout=120))
        procs[1].communicate(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[1].returncode == 3
    assert procs[0].returncode == 0, out + err[-3000:]
    assert f"rank 1 (pid {procs[1].pid}) has died" in out, out
    assert "rank 0 of 2: the agreement on a stop signal failed" in out and "--resume" in out
