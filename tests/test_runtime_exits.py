"""A job with commtag installed exits as it would without it, every time.

Each run is a real 2-rank gloo job (tests/exit_job.py), each rank its own
process that installs commtag, profiles collectives, p2p and async work with
commtag's trace handler and returns without ``destroy_process_group``, rank 0
with an async all_reduce still running. commtag's completion callback on that
work runs on gloo's worker thread; run while the interpreter shuts down, it
aborted the process (SIGABRT, "terminate called without an active
exception"). The abort depends on timing, so many jobs are run, and every
rank of every one must exit 0, say nothing of a termination, and leave its
trace and sidecar.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("exit_job.py")
RUNS = 10
WORLD = 2


def _job(mode: str, where: Path) -> list[tuple[int, str]]:
    """Run one job; each rank's exit code and stderr."""
    out = where / "out"
    out.mkdir(parents=True)
    env = {**os.environ, "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, str(JOB), mode, str(out), str(where / "store")],
                              env={**env, "RANK": str(rank)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for rank in range(WORLD)]
    ended = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        ended.append((proc.returncode, err))
    return ended


@pytest.mark.slow
def test_every_rank_of_every_job_exits_cleanly_with_its_files(tmp_path):
    for run in range(RUNS):
        where = tmp_path / f"run{run}"
        ended = _job("commtag", where)
        for rank, (code, err) in enumerate(ended):
            assert code == 0 and "terminate called" not in err, f"run {run} rank {rank} exited {code}:\n{err[-3000:]}"
        names = sorted(p.name.split(".", 1)[0] + p.suffix for p in (where / "out").iterdir())
        assert names == ["rank0.gz", "rank0.json", "rank1.gz", "rank1.json"], (run, names)
