"""A real 3-rank gloo job shaped like a pipeline, profiled with commtag.

Stage 0 feeds stage 1, stage 1 feeds stage 2, and gradients flow back, so the
stages issue different numbers of point-to-point ops on the same groups, every
way torch offers: direct ``dist.isend``/``dist.irecv`` (which commtag cannot
replace), ``batch_isend_irecv``, and blocking ``send``/``recv``, on the world
and on two-rank subgroups. World and subgroup collectives run between them, and
one rank sleeps before one world all_reduce. Per step, on the world group:
rank 0 issues 3 p2p ops, rank 1 issues 4, rank 2 issues 1.
"""

from __future__ import annotations

import time
from pathlib import Path

from gloo_world import run_world

WORLD = 3
STEPS = 4
#: The rank that sleeps, and the step whose world all_reduce it is late to.
SLEEPER = 2
SLEEP_STEP = 2
SLEEP_S = 0.5
NUMEL = 256
#: Collectives each rank runs on the world group per step: the all_reduce and the barrier.
WORLD_COLLECTIVES_PER_STEP = 2


def _step(rank: int, step: int, front, back) -> None:
    """One pipeline step: forward p2p, world all_reduce, backward batch, subgroup calls, hand-off."""
    import torch
    import torch.distributed as dist

    act = torch.full((NUMEL,), float(step))
    buf = torch.empty(NUMEL)
    # Forward: two microbatches 0 -> 1 on the world (direct isend/irecv), one 1 -> 2 on `back`.
    works = []
    if rank == 0:
        works = [dist.isend(act, 1), dist.isend(act, 1)]
    elif rank == 1:
        works = [dist.irecv(buf, 0), dist.irecv(torch.empty(NUMEL), 0), dist.isend(act, 2, group=back)]
    else:
        works = [dist.irecv(buf, 1, group=back)]
    for work in works:
        work.wait()
    if rank == SLEEPER and step == SLEEP_STEP:
        time.sleep(SLEEP_S)
    dist.all_reduce(act)
    # Backward: gradients 2 -> 1 -> 0 in one batch per rank, on the world.
    grad = torch.ones(NUMEL)
    ops = {
        0: [dist.P2POp(dist.irecv, torch.empty(NUMEL), 1)],
        1: [dist.P2POp(dist.irecv, torch.empty(NUMEL), 2), dist.P2POp(dist.isend, grad, 0)],
        2: [dist.P2POp(dist.isend, grad, 1)],
    }[rank]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if rank in (1, 2):
        dist.all_reduce(grad, group=back)
    # Hand-off 0 -> 1 on `front`, blocking.
    if rank == 0:
        dist.send(act, 1, group=front)
    elif rank == 1:
        dist.recv(buf, 0, group=front)
    dist.barrier()
    if rank in (0, 1):
        dist.all_reduce(grad, group=front)


def _body(rank: int, world_size: int, out_dir: str) -> int:
    """Run the pipeline under the profiler; return the Seq commtag would give the world's next collective."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag
    from commtag.runtime.describe.groups import state_for

    commtag.install()
    front = dist.new_group([0, 1], group_desc="front")
    back = dist.new_group([1, 2], group_desc="back")
    # Connect every group before profiling, so no profiled call is a connection setup.
    warm = torch.ones(NUMEL)
    dist.all_reduce(warm)
    if rank in (0, 1):
        dist.all_reduce(warm, group=front)
    if rank in (1, 2):
        dist.all_reduce(warm, group=back)
    # One warm-up step first: the profiler's own start-up, slow on a loaded machine, is not traced.
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=STEPS, repeat=1),
                 on_trace_ready=commtag.trace_handler(out_dir)) as prof:
        for step in range(-1, STEPS):
            _step(rank, step, front, back)
            prof.step()
    return state_for(None).next_collective_seq()  # read after the warm-up and profiled steps


def run_pipeline_world(out: Path) -> list[int]:
    """Run the job, writing its traces and sidecars into ``out``; each rank's next world Seq."""
    return run_world(_body, WORLD, str(out))
