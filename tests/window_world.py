"""One real 4-rank gloo run profiled with a repeating schedule, shared by the analysis tests.

``schedule(wait=1, warmup=1, active=2, repeat=2)`` over 8 steps: each rank
writes two trace files (steps 2-3 and 6-7), so every group's Seq numbers jump
between the two profiled windows, as in any scheduled job. Each step runs
all_reduce on the default group and on the rank's pair group, one message
each way between the pair's two ranks, and an uneven all_to_all_single on
the default group (rank r sends r + 1 elements to each rank). The run happens
once per test process; its directory is read-only for the tests (a test that
changes files copies them first).

:func:`idle_rank_world` is a 2-rank run in which rank 1 is profiled but makes
no collective call.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from gloo_world import run_world

WORLD = 4
STEPS = 8
#: Steps the schedule profiles, two windows of two.
PROFILED_STEPS = 4
WINDOWS = 2
NUMEL = 1024


def _body(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    commtag.install()
    pairs = [dist.new_group([0, 1], group_desc="pair01"), dist.new_group([2, 3], group_desc="pair23")]
    mine = pairs[rank // 2]
    peer = rank ^ 1
    t = torch.ones(NUMEL)
    sends, receives = [rank + 1] * world_size, [peer_rank + 1 for peer_rank in range(world_size)]
    spread, gathered = torch.ones(sum(sends)), torch.empty(sum(receives))

    def step() -> None:
        dist.all_reduce(t)
        dist.all_reduce(t, group=mine)
        if rank % 2 == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
        dist.all_to_all_single(gathered, spread, receives, sends)

    step()  # connect gloo before profiling
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=WINDOWS),
                 on_trace_ready=commtag.trace_handler(out_dir)) as prof:
        for _ in range(STEPS):
            step()
            prof.step()


@lru_cache(maxsize=1)
def window_world() -> Path:
    """The run's directory (two trace files + sidecars per rank), made on first use."""
    root = Path(tempfile.mkdtemp(prefix="commtag_window_world_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    out = root / "traces"
    run_world(_body, WORLD, str(out))
    return out


def _idle_body(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    alone = dist.new_group([0])
    t = torch.ones(NUMEL)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        if rank == 0:
            dist.all_reduce(t, group=alone)
        else:
            torch.mm(torch.ones(64, 64), torch.ones(64, 64))


@lru_cache(maxsize=1)
def idle_rank_world() -> Path:
    """A 2-rank run's directory: rank 0 runs one all_reduce, rank 1 none."""
    root = Path(tempfile.mkdtemp(prefix="commtag_idle_world_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    out = root / "traces"
    run_world(_idle_body, 2, str(out))
    return out
