"""A real 4-rank gloo job with a known culprit (or none) and MoE-style uneven all-to-alls.

Each profiled step: the culprit rank (if any) sleeps before the world
all_reduce, then every rank all_reduces with its pair group, sends each
peer ``j`` an uneven share of a 2-D tensor (``(r+1)(j+1)`` rows of
``HIDDEN`` columns) with one all_to_all_single, and ``LIST_NUMEL`` elements
with one all_to_all of tensor lists (gloo's takes equal tensors only). The job returns what it did,
as its own clock and tensors say: how long the culprit really slept, when
each rank arrived at each collective (``time.time_ns``, one host clock for
all ranks; the barrier that opens the window, then four calls a step; and
when its profiler had started) and how many elements it sent each peer. The tests compare
commtag's figures with these.
"""

from __future__ import annotations

import time
from pathlib import Path

from gloo_world import run_world

WORLD = 4
STEPS = 6
HIDDEN = 4
#: Rows the job's rank r sends rank j: (r + 1)(j + 1) x ROW_UNIT.
ROW_UNIT = 2
#: Elements every rank sends every rank with all_to_all.
LIST_NUMEL = 24
NUMEL = 2048


def _body(rank: int, world_size: int, out_dir: str, culprit: int, delay_s: float) -> dict[str, object]:
    import torch
    import torch.distributed as dist

    import commtag

    commtag.install()
    pairs = [dist.new_group([0, 1], group_desc="pair01"), dist.new_group([2, 3], group_desc="pair23")]
    mine = pairs[rank // 2]
    t = torch.ones(NUMEL)
    in_rows = [(rank + 1) * (j + 1) * ROW_UNIT for j in range(world_size)]
    out_rows = [(i + 1) * (rank + 1) * ROW_UNIT for i in range(world_size)]
    send = torch.arange(sum(in_rows) * HIDDEN, dtype=torch.float32).reshape(-1, HIDDEN)
    receive = torch.empty(sum(out_rows), HIDDEN)
    sent = [part.numel() for part in send.split(in_rows)]
    send_list = [torch.ones(LIST_NUMEL) for _ in range(world_size)]
    receive_list = [torch.empty(LIST_NUMEL) for _ in range(world_size)]
    # Connect gloo before profiling, so no profiled call is a connection setup.
    dist.all_reduce(t)
    dist.all_reduce(t, group=mine)
    dist.all_to_all_single(receive, send, out_rows, in_rows)
    dist.all_to_all(receive_list, send_list)
    slept_ns = 0
    arrivals: list[int] = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                on_trace_ready=commtag.trace_handler(out_dir)):
        # The ranks enter the profiler at different times: the barrier takes that skew, not the first step.
        profiling_ns = time.time_ns()
        arrivals.append(time.time_ns())
        dist.barrier()
        for _ in range(STEPS):
            if rank == culprit:
                before = time.perf_counter_ns()
                time.sleep(delay_s)
                slept_ns += time.perf_counter_ns() - before
            arrivals.append(time.time_ns())
            dist.all_reduce(t)
            arrivals.append(time.time_ns())
            dist.all_reduce(t, group=mine)
            arrivals.append(time.time_ns())
            dist.all_to_all_single(receive, send, out_rows, in_rows)
            arrivals.append(time.time_ns())
            dist.all_to_all(receive_list, send_list)
    return {"slept_ns": slept_ns, "profiling_ns": profiling_ns, "arrivals": arrivals, "sent": sent, "sent_list": [t.numel() for t in send_list]}


def run_straggler_world(out: Path, culprit: int = -1, delay_s: float = 0.0) -> list[dict[str, object]]:
    """Run the job into ``out``; each rank's record of what it did, in rank order."""
    return run_world(_body, WORLD, str(out), culprit, delay_s)
