"""A 4-rank gloo job profiled over three steps, for the merge's views (--steps, --detail, groups).

Groups: the world, tensor-parallel pairs [0, 1] and [2, 3], data-parallel
pairs [0, 2] and [1, 3]. Step N makes N world all_reduces, one tp all_reduce
and one dp broadcast, so each step has its own number of collectives and
:func:`calls_per_step` says how many each rank made in each step.
"""

from __future__ import annotations

TP = ([0, 1], [2, 3])
DP = ([0, 2], [1, 3])
#: The steps the profiler records (schedule: no wait, one warm-up step, three active).
PROFILED_STEPS = (1, 2, 3)


def calls_per_step(step: int) -> dict[str, int]:
    """Lane-name prefix -> collectives each rank makes on it in ``step``."""
    return {"PG 0 ": step, "tp": 1, "dp": 1}


def profiled_steps(rank: int, world_size: int, out_dir: str) -> None:
    import time

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    commtag.install()
    try:
        tp = [dist.new_group(ranks, group_desc="tp") for ranks in TP]
        dp = [dist.new_group(ranks, group_desc="dp") for ranks in DP]
        my_tp = tp[0] if rank in TP[0] else tp[1]
        my_dp = dp[0] if rank in DP[0] else dp[1]
        t = torch.ones(256)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                     on_trace_ready=commtag.trace_handler(out_dir)) as prof:
            for step in range(4):
                for _ in range(step):
                    dist.all_reduce(t)
                dist.all_reduce(t, group=my_tp)
                dist.broadcast(t, src=DP[0][0] if rank in DP[0] else DP[1][0], group=my_dp)
                torch.mm(torch.ones(32, 32), torch.ones(32, 32))
                time.sleep(0.01)
                prof.step()
    finally:
        commtag.uninstall()
