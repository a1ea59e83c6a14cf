"""A real gloo job profiled for some steps, dumped while a call is in flight, and then hung: the input
of the tests that draw Flight Recorder dumps on the merged trace of a profile.

``run_profiled_then_hung(out)`` writes ``out/trace`` (each rank's trace and sidecar) and three sets of
dumps, each ``<prefix><rank>`` as torch and commtag name them:

- ``out/midway``: commtag's ring dumped by every rank inside the profile, right after ranks 0 and 1
  issued an async all_reduce of the world that rank 2 enters only later: theirs is in flight there.
- ``out/torch`` and ``out/commtag``: torch's and commtag's dumps at the end. After the profile every
  rank all_reduces on a group with a gloo timeout of a few seconds, but rank 2 never enters the
  group's 4th: ranks 0 and 1 time out in it.

``run_never_entered(out)`` writes torch's JSON dumps of a job whose rank 2 makes no call at all (its
ring is empty) while ranks 0 and 1 time out in an all_reduce of the world.
"""

from __future__ import annotations

import shutil
import time
from datetime import timedelta
from pathlib import Path

#: The job's ranks, torch's ring size in it, and the hung group's gloo timeout.
WORLD = 3
FR_ENTRIES = 64
GROUP_TIMEOUT_S = 3
#: The group's calls inside the profile, and the one rank 2 never enters (its Seq).
PROFILED_GROUP_CALLS = 3
HUNG_SEQ = 4
#: How long rank 2 keeps ranks 0 and 1 waiting in the profiled world all_reduce.
LATE_S = 1.0


def _body(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace
    from torch.profiler import ProfilerActivity, profile

    import commtag

    out = Path(out_dir)
    store = dist.distributed_c10d._get_default_store()
    commtag.install(dump_dir=str(out / "commtag"))
    try:
        group = dist.new_group(timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        t = torch.ones(16)
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(str(out / "trace"))):
            for _ in range(PROFILED_GROUP_CALLS):
                dist.all_reduce(t, group=group)
            if rank == world_size - 1:
                store.wait([f"midway{r}" for r in range(world_size - 1)])
                _keep_midway(commtag.dump(), out, rank)
                time.sleep(LATE_S)
                dist.all_reduce(t)
            else:
                work = dist.all_reduce(t, async_op=True)
                _keep_midway(commtag.dump(), out, rank)
                store.set(f"midway{rank}", "1")
                work.wait()
        for _ in range(HUNG_SEQ - PROFILED_GROUP_CALLS):
            if rank == world_size - 1:  # never enters the group's 4th: waits until the others gave up
                store.wait([f"failed{r}" for r in range(world_size - 1)])
                break
            try:
                dist.all_reduce(t, group=group)
            except RuntimeError:  # gloo's timeout: rank 2 never came
                store.set(f"failed{rank}", "1")
        commtag.dump()
        (out / "torch").mkdir(exist_ok=True)
        (out / "torch" / f"fr_{rank}").write_bytes(_dump_fr_trace(True, True, False))
    finally:
        commtag.uninstall()


def _keep_midway(path, out: Path, rank: int) -> None:
    (out / "midway").mkdir(exist_ok=True)
    shutil.copy(path, out / "midway" / f"commtag_fr_{rank}")


def run_profiled_then_hung(out: Path) -> None:
    from gloo_world import run_world

    run_world(_body, WORLD, str(out), env={"TORCH_FR_BUFFER_SIZE": str(FR_ENTRIES)})  # set before each group starts


def _never_entered(rank: int, world_size: int, out_dir: str) -> None:
    """Ranks 0 and 1 all_reduce on the world, its gloo timeout made short; rank 2 never makes a call at
    all. Every rank then writes torch's JSON dump (rank 2's ring is empty)."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_json

    store = dist.distributed_c10d._get_default_store()
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=GROUP_TIMEOUT_S))
    if rank == world_size - 1:
        store.wait([f"failed{r}" for r in range(world_size - 1)])
    else:
        try:
            dist.all_reduce(torch.ones(4))
        except RuntimeError:  # gloo's timeout: rank 2 never came
            store.set(f"failed{rank}", "1")
    (Path(out_dir) / f"fr_{rank}").write_bytes(_dump_fr_trace_json(True, True))


def run_never_entered(out: Path) -> None:
    """``out/fr_<rank>``: torch's JSON dumps of a job whose rank 2 never entered any call."""
    from gloo_world import run_world

    run_world(_never_entered, WORLD, str(out), env={"TORCH_FR_BUFFER_SIZE": str(FR_ENTRIES)})
