"""The shared multi-rank helper itself: results, errors and hangs reach the test."""

import pytest
import torch
import torch.distributed as dist

from gloo_world import WorkerError, WorkerTimeout, run_world

pytestmark = pytest.mark.slow


def _sum(rank: int, world_size: int, scale: int) -> float:
    t = torch.ones(1) * (rank + 1) * scale
    dist.all_reduce(t)
    return t.item()


def _fail_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()


def _hang_on_rank_0(rank: int, world_size: int) -> None:
    if rank != 0:
        dist.barrier()
    else:
        import time

        time.sleep(600)


def test_results_come_back_in_rank_order():
    assert run_world(_sum, 3, 2) == [12.0, 12.0, 12.0]


def test_worker_exception_reaches_the_test_with_its_traceback():
    with pytest.raises(WorkerError, match=r"(?s)rank 1 raised.*ValueError: boom from rank 1"):
        run_world(_fail_on_rank_1, 2)


def test_hang_times_out():
    with pytest.raises(WorkerTimeout):
        run_world(_hang_on_rank_0, 2, timeout=6)
