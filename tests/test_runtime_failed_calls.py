"""A collective that fails is recorded with what failed, whether it raised or its work did.

Real gloo ranks: on a group with a 1 s timeout, rank 0 calls all_reduce while
rank 1 never does, once synchronously (the call raises) and once with
``async_op=True`` (``wait()`` raises), then twice more fused in a coalescing
block (its end raises). All three must reach rank 0's sidecar with a
``commtag error`` key naming the timeout, pass the sidecar's validation, and come out of the merge on the group's lane with that key,
while the caller still gets torch's exception unchanged.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from merging import merge
from commtag.sidecarfile import read_sidecar
from gloo_world import run_world
from pftrace_reader import read

pytestmark = pytest.mark.slow


def _timeouts(rank: int, world_size: int, out_dir: str) -> list[tuple[str, str]]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    raised = []
    try:
        short = dist.new_group([0, 1], timeout=timedelta(seconds=1))
        dist.all_reduce(torch.ones(1), group=short)  # the group works: the failures below are the timeouts
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
            dist.all_reduce(torch.ones(2))
            if rank == 0:
                for async_op in (False, True):
                    try:
                        work = dist.all_reduce(torch.ones(3), group=short, async_op=async_op)
                        if async_op:
                            work.wait()
                    except RuntimeError as exc:
                        raised.append((str(async_op), type(exc).__name__))
                try:  # two all_reduces fused into one allreduce_coalesced, which fails at the block's end
                    with dist.distributed_c10d._coalescing_manager(group=short):
                        dist.all_reduce(torch.ones(4), group=short)
                        dist.all_reduce(torch.ones(5), group=short)
                except RuntimeError as exc:
                    raised.append(("coalesced", type(exc).__name__))
            dist.barrier()
    finally:
        commtag.uninstall()
    return raised


def test_failed_calls_are_recorded_with_what_failed(tmp_path: Path):
    traces = tmp_path / "traces"
    raised = run_world(_timeouts, 2, str(traces), timeout=120)
    assert raised == [[("False", "RuntimeError"), ("True", "RuntimeError"), ("coalesced", "RuntimeError")], []]

    sidecar = read_sidecar(traces / "rank0.step0.commtag.json")
    failed = [c.annotation for c in sidecar.collectives if c.annotation.error is not None]
    assert [(a.collective_name, a.in_msg_nelems, a.async_op) for a in failed] == [
        ("allreduce", 3, False), ("allreduce", 3, True), ("allreduce_coalesced", 9, False)]
    assert all(a.error.startswith("RuntimeError: ") and "timeout" in a.error.lower().replace("timed out", "timeout")
               for a in failed), failed
    assert all(a.group_size == 2 and a.pg_name != "0" for a in failed)
    # The calls that worked say nothing about errors.
    worked = [c.annotation for c in sidecar.collectives if c.annotation.error is None]
    assert {a.collective_name for a in worked} == {"allreduce", "barrier"}
    rank1 = read_sidecar(traces / "rank1.step0.commtag.json")
    assert all(c.annotation.error is None for c in rank1.collectives)

    result = merge(traces, tmp_path / "merged.pftrace")
    lane = [s for s in read(result.output).slices if "commtag source" in s.args and "commtag error" in s.args]
    assert sorted((s.args["commtag rank"], s.args["In msg nelems"], s.args["commtag async"]) for s in lane) == [
        (0, 3, False), (0, 3, True), (0, 9, False)]
    assert sorted(s.args["commtag error"] for s in lane) == sorted(a.error for a in failed)
