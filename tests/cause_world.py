"""A real 4-rank gloo job for the causes: a large all_reduce after a barrier, several times,
with or without one rank arriving late to one of them.

Each all_reduce moves 16 MB, so on any machine its transfer is many times the spread of the
ranks leaving the barrier before it; where ``late`` is set, rank LATE sleeps SLEEP_S before call
LATE_CALL, so that call's time is its late arrival.
"""

from __future__ import annotations

import time
from pathlib import Path

from gloo_world import run_world

WORLD = 4
LATE = 1
LATE_CALL = 2
SLEEP_S = 0.5
CALLS = 4
NUMEL = 4 * 1024 * 1024


def _body(rank: int, world_size: int, out_dir: str, late: bool) -> None:
    import torch
    import torch.distributed as dist

    import commtag

    commtag.install()
    t = torch.ones(NUMEL)
    dist.all_reduce(t)  # connect before profiling
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                on_trace_ready=commtag.trace_handler(out_dir)):
        for i in range(CALLS):
            dist.barrier()
            if late and rank == LATE and i == LATE_CALL:
                time.sleep(SLEEP_S)
            dist.all_reduce(t)


def run_cause_world(out: Path, late: bool) -> Path:
    """Run the job, writing its rank traces and sidecars into ``out``."""
    run_world(_body, WORLD, str(out), late)
    return out
