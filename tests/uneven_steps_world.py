"""A real 3-rank gloo job under a profiler schedule in which one rank calls ``prof.step()`` once
more than the others, so that its ``ProfilerStep#N`` numbers run one ahead of theirs.

The profiler waits one step, warms up one, then records ``ACTIVE`` steps in one window. Each
iteration, every rank runs ``CALLS_PER_STEP`` world all_reduces; in iteration ``DELAYED_STEP`` (the
others' step number) the culprit, which is also the rank that stepped early, sleeps ``delay_s``
before the iteration's second call, so that its lateness lies inside its own step whatever its
peers do first. The job returns, per rank, the iterations it profiled (the step number the rank's
profiler gave each) and how long the sleep really was.
"""

from __future__ import annotations

import time
from pathlib import Path

from gloo_world import run_world

WORLD = 3
WAIT, WARMUP, ACTIVE = 1, 1, 4
#: The rank that steps once more than the others, and is late in :data:`DELAYED_STEP`.
CULPRIT = 1
#: The iteration the culprit is late in, numbered as the ranks that did not step early number it.
DELAYED_STEP = 3
CALLS_PER_STEP = 2
NUMEL = 2048


def _body(rank: int, world_size: int, out_dir: str, delay_s: float) -> dict[str, object]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    commtag.install()
    t = torch.ones(NUMEL)
    dist.all_reduce(t)  # gloo connects before the profiler starts
    slept_ns = 0
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir),
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)) as prof:
        if rank == CULPRIT:
            prof.step()  # one step() more than the others: its step numbers run one ahead
        for iteration in range(WAIT + WARMUP + ACTIVE):
            for call in range(CALLS_PER_STEP):
                if rank == CULPRIT and iteration == DELAYED_STEP and call == 1:
                    before = time.perf_counter_ns()
                    time.sleep(delay_s)
                    slept_ns = time.perf_counter_ns() - before
                dist.all_reduce(t)
            prof.step()
    return {"slept_ns": slept_ns}


def run_uneven_steps_world(out: Path, delay_s: float) -> list[dict[str, object]]:
    """Run the job into ``out``; each rank's record of what it did, in rank order."""
    return run_world(_body, WORLD, str(out), delay_s)
