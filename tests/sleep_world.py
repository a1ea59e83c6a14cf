"""One real 4-rank gloo run, profiled with commtag, shared by the analysis/summary/HTA tests.

One rank sleeps before a chosen all_reduce. The run happens once per test
session (tests/conftest.py's ``sleep_run``: it costs seconds on the 2-core CI
machines) and its directory of traces and sidecars is read-only for the tests:
a test that needs to change files copies them first.
"""

from __future__ import annotations

import time
from pathlib import Path

from gloo_world import run_world

WORLD = 4
SLEEPER = 2
#: The sleeper sleeps before its (SLEEP_BEFORE + 1)-th all_reduce on the default group.
SLEEP_BEFORE = 3
SLEEP_S = 0.4
#: all_reduce calls on the default group inside the profiled window.
DEFAULT_ALLREDUCES = 6
NUMEL = 4096


def _body(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import commtag

    commtag.install()
    # Several process groups: the default one and two pairs.
    pairs = [dist.new_group([0, 1], group_desc="pair01"), dist.new_group([2, 3], group_desc="pair23")]
    mine = pairs[rank // 2]
    t = torch.ones(NUMEL)
    gathered = torch.empty(NUMEL * world_size)
    # Connect gloo before profiling, so no profiled call is a connection setup.
    dist.all_reduce(t)
    dist.all_reduce(t, group=mine)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, on_trace_ready=commtag.trace_handler(out_dir)):
        for i in range(DEFAULT_ALLREDUCES):
            if rank == SLEEPER and i == SLEEP_BEFORE:
                time.sleep(SLEEP_S)
            dist.all_reduce(t)
        dist.all_reduce(t, group=mine)
        dist.all_gather_into_tensor(gathered, t)
        dist.broadcast(t, src=2 * (rank // 2), group=mine)


def run_sleep_world(out: Path) -> Path:
    """Run the world, writing its rank traces and sidecars into ``out``."""
    run_world(_body, WORLD, str(out))
    return out
