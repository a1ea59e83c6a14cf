"""A blocking call's gloo work is told from another group's work that runs inside it by the shapes.

Rank 0 queues three async reduce_scatter_tensor calls on group A (gloo's
reduce_scatter works have no completion future: their works are never
placed by time) and then makes a blocking all_reduce on group B, or a
blocking list reduce_scatter there (two all_reduce works, one per member). Through the
store, rank 1 joins A's calls only once rank 0 is inside B's call, and rank 2
joins B only after that, so on rank 0 the third reduce_scatter's work starts
and ends inside the all_reduce, on a worker of A that the trace names for no
group. Both works are of the all_reduce family; the all_reduce's own work
shows its own input in "Input Dims" and the other does not, so the
all_reduce's work is identified. The list reduce_scatter's works each show
one member's chunk, its output's count, and are identified by it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gloo_world import run_world
from pftrace_reader import read

pytestmark = pytest.mark.slow

WORLD = 3
#: all_reduce on B: an element count no reduce_scatter input has.
REDUCED = 50
SCATTERED = (24, 36, 48)
#: The list reduce_scatter on B: each member's chunk, a count no reduce_scatter_tensor input has.
CHUNK = 50


def _blocking_call(op: str, group: object) -> None:
    import torch
    import torch.distributed as dist

    if op == "allreduce":
        dist.all_reduce(torch.ones(REDUCED), group=group)
    else:
        dist.reduce_scatter(torch.zeros(CHUNK), [torch.ones(CHUNK), torch.ones(CHUNK)], group=group)


def _overlapping(rank: int, world_size: int, out_dir: str, op: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    store = dist.distributed_c10d._get_default_store()
    group_a, group_b = dist.new_group([0, 1]), dist.new_group([0, 2])
    commtag.install()
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     on_trace_ready=commtag.trace_handler(out_dir)):
            if rank == 0:
                works = [dist.reduce_scatter_tensor(torch.zeros(n // 2), torch.ones(n), group=group_a, async_op=True)
                         for n in SCATTERED]
                store.set("rank0 in B", "1")
                _blocking_call(op, group_b)
                for work in works:
                    work.wait()
            elif rank == 1:
                store.wait(["rank0 in B"])
                for n in SCATTERED:
                    dist.reduce_scatter_tensor(torch.zeros(n // 2), torch.ones(n), group=group_a)
                store.set("rank1 done", "1")
            else:
                store.wait(["rank1 done"])
                _blocking_call(op, group_b)
    finally:
        commtag.uninstall()


@pytest.mark.parametrize("op", ["allreduce", "reduce_scatter"])
def test_a_blocking_calls_work_is_told_from_another_groups_by_its_shapes(tmp_path: Path, op: str) -> None:
    from merging import merge

    run_world(_overlapping, WORLD, str(tmp_path / "traces"), op)
    result = merge(tmp_path / "traces", tmp_path / "merged.pftrace", json_dir=tmp_path / "json", progress=False)
    lane = [s for s in read(result.output).slices
            if "commtag source" in s.args and s.args.get("commtag rank") == 0]
    blocking = [s for s in lane if s.args.get("Collective name") == op]
    assert len(blocking) == 1
    assert "commtag gloo work" not in blocking[0].args, blocking[0].args
    scattered = [s for s in lane if s.args.get("Collective name") == "_reduce_scatter_base"]
    assert len(scattered) == len(SCATTERED)
