"""A call still running when its profiler window ends is written in that window, as unfinished.

Two real gloo ranks profile two windows (a schedule of one active step,
twice). Rank 1 joins three calls only after rank 0 has handed over a window,
which they both learn through the store, so on rank 0 these calls are
running when its window ends:

- an async all_reduce issued before ``prof.step()`` and waited after it;
- an async all_reduce still pending when the profile ends;
- a side thread's blocking all_reduce at that moment.

Each must be in rank 0's sidecar of the window it started in, marked
unfinished, and in no other; the merge must find every call on both ranks
(nothing missing, no desync).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gloo_world import run_world

pytestmark = pytest.mark.slow

WORLD = 2


def _issued(group: object) -> int:
    """How many calls gloo has been handed on ``group`` on this rank (torch's own count)."""
    import torch

    return group._get_backend(torch.device("cpu"))._get_sequence_number_for_group()


def _straddling(rank: int, world_size: int, out_dir: str) -> None:
    import threading
    import time

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    store = dist.distributed_c10d._get_default_store()
    across, beside = dist.new_group([0, 1]), dist.new_group([0, 1])
    side_done: list[object] = []

    def side_call() -> None:
        if rank == 1:
            store.wait(["rank0 ended"])
        dist.all_reduce(torch.ones(5), group=beside)
        side_done.append(True)

    commtag.install()
    try:
        sched = schedule(wait=0, warmup=0, active=1, repeat=2)
        with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                     on_trace_ready=commtag.trace_handler(out_dir)) as prof:
            dist.all_reduce(torch.ones(2))
            if rank == 1:
                store.wait(["rank0 stepped"])
            crossing = dist.all_reduce(torch.ones(3), group=across, async_op=True)
            prof.step()  # rank 0: the window ends while that call waits for rank 1
            if rank == 0:
                store.set("rank0 stepped", "1")
            crossing.wait()
            dist.all_reduce(torch.ones(2))
            if rank == 1:
                store.wait(["rank0 ended"])
            side = threading.Thread(target=side_call)
            side.start()
            pending = dist.all_reduce(torch.ones(4), group=across, async_op=True)
            while rank == 0 and (_issued(across) < 2 or _issued(beside) < 1):  # both calls started on rank 0
                time.sleep(0.001)
            if rank == 1:
                pending.wait()
                side.join(60)
        if rank == 0:
            store.set("rank0 ended", "1")
        pending.wait()
        side.join(60)
        assert side_done
    finally:
        commtag.uninstall()


def test_calls_running_at_a_windows_end_are_written_there_unfinished(tmp_path: Path) -> None:
    from commtag.merge.engine.shards import analyze
    from merging import merge
    from commtag.sidecarfile import read_sidecar

    run_world(_straddling, WORLD, str(tmp_path))
    windows = sorted(tmp_path.glob("rank0.step*.commtag.json"))
    assert len(windows) == 2, windows
    first, second = (read_sidecar(path).collectives for path in windows)
    sizes = [[(rec.annotation.in_msg_nelems, bool(rec.unfinished)) for rec in sorted(recs, key=lambda r: r.start_ns)]
             for recs in (first, second)]
    assert sizes[0] == [(2, False), (3, True)]
    assert sorted(sizes[1]) == [(2, False), (4, True), (5, True)]
    for recs in (first, second):
        for rec in recs:
            assert rec.end_ns >= rec.start_ns

    result = merge(tmp_path)
    analysis = analyze(result.instances)
    assert len(analysis.collectives) == 5
    for matched in analysis.collectives:
        assert matched.complete and not matched.findings, matched.to_dict()
    assert not analysis.findings
