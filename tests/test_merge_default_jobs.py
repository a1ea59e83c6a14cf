"""-j's default: never more merge workers than the CPUs, the input or the memory can keep."""

from __future__ import annotations

import gzip
import os

from commtag.merge.engine.budget import json_bytes
from commtag.merge.inputs.load import discover
from commtag.merge.engine.jobs import (
    MIN_JSON_PER_WORKER, available_memory, default_jobs, job_rss_estimate, jobs_for, worker_rss_estimate,
)
from commtag.testing import PUBLIC_TRACES

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"


def test_each_limit_caps_the_workers() -> None:
    big_input = 64 * MIN_JSON_PER_WORKER
    rank_json = 500 << 20
    per_worker = worker_rss_estimate(rank_json)
    assert per_worker > rank_json  # a worker holds more than the JSON of the rank it writes
    assert jobs_for(16, big_input, rank_json, None) == 16
    assert jobs_for(16, 3 * MIN_JSON_PER_WORKER, rank_json, None) == 3
    assert jobs_for(16, big_input, rank_json, 5 * per_worker + per_worker // 2) == 5
    assert jobs_for(16, big_input, rank_json, per_worker // 2) == 1  # one worker always runs: -j 1
    assert jobs_for(2, big_input, rank_json, 100 * per_worker) == 2
    # Each of N workers holds its share of the collective records (2 bytes per sidecar byte, over N):
    # a job of many sidecars fits fewer workers, but more than if each held them all.
    sidecars = 1000 << 20
    assert worker_rss_estimate(rank_json, sidecars) >= per_worker + sidecars
    assert worker_rss_estimate(rank_json, sidecars, 4) == per_worker + 2 * sidecars // 4
    memory = 5 * per_worker
    fits = jobs_for(16, big_input, rank_json, memory, sidecars)
    assert job_rss_estimate(rank_json, sidecars, fits) <= memory
    assert job_rss_estimate(rank_json, sidecars, fits + 1) > memory
    # worker 0 replays the impact over every record besides its share: memory for 4 workers' shares
    # alone holds only 3 once the lead's replay is counted
    assert jobs_for(16, big_input, rank_json, 4 * worker_rss_estimate(rank_json, sidecars, 4), sidecars) == 3
    assert fits > memory // worker_rss_estimate(rank_json, sidecars)  # more than if each held every record


def test_the_default_reads_this_machine_and_the_largest_rank(public_traces) -> None:
    ranks = discover([DLRM])
    per_rank = [sum(json_bytes(f.path) for f in r.files) for r in ranks]
    assert per_rank == [sum(len(gzip.decompress(f.path.read_bytes())) for f in r.files) for r in ranks]
    memory = available_memory()
    assert memory is not None and memory > 0  # Linux reports MemAvailable
    cpus = len(os.sched_getaffinity(0))
    sidecars = sum(f.sidecar.stat().st_size for r in ranks for f in r.files if f.sidecar is not None)
    # The input counted as the JSON it holds, not its gzip bytes on disk.
    assert default_jobs(ranks) == jobs_for(cpus, sum(per_rank), max(per_rank), memory, sidecars)
