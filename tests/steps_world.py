"""A real 4-rank gloo job under a profiler schedule whose culprit is late in some steps only.

The profiler waits one step, warms up one, then records ``len(RECORDED)`` steps in one window
(``ProfilerStep#2`` to ``#7``). In each recorded step every rank runs two world all_reduces; in the
steps of ``delayed`` the culprit first sleeps ``delay_s``. The job returns what it did, as its own
clock says: which step each sleep fell in and how long it really was, and when each rank arrived
at each collective of each step (``time.time_ns``, one host clock for all ranks). The tests
compare commtag's per-step figures with these.
"""

from __future__ import annotations

import time
from pathlib import Path

from gloo_world import run_world

WORLD = 4
#: Steps before recording: one skipped (wait), one warm-up.
WAIT, WARMUP = 1, 1
#: The ProfilerStep numbers the one window records.
RECORDED = tuple(range(WAIT + WARMUP, WAIT + WARMUP + 6))
#: World collectives each step issues.
CALLS_PER_STEP = 2
NUMEL = 2048


def _body(rank: int, world_size: int, out_dir: str, culprit: int, delay_s: float,
          delayed: tuple[int, ...]) -> dict[str, object]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    commtag.install()
    t = torch.ones(NUMEL)
    dist.all_reduce(t)  # gloo connects before the profiler starts: no profiled call is a setup
    slept: dict[int, int] = {}
    arrivals: dict[int, list[int]] = {}
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir),
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=len(RECORDED), repeat=1)) as prof:
        for step in range(RECORDED[-1] + 1):
            if rank == culprit and step in delayed:
                before = time.perf_counter_ns()
                time.sleep(delay_s)
                slept[step] = time.perf_counter_ns() - before
            arrivals[step] = []
            for _ in range(CALLS_PER_STEP):
                arrivals[step].append(time.time_ns())
                dist.all_reduce(t)
            prof.step()
    return {"slept_ns": slept, "arrivals": arrivals}


def run_steps_world(out: Path, culprit: int, delay_s: float, delayed: tuple[int, ...]) -> list[dict[str, object]]:
    """Run the job into ``out``; each rank's record of what it did, in rank order."""
    return run_world(_body, WORLD, str(out), culprit, delay_s, delayed)
