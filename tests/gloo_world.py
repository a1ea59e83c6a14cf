"""Run a test function on N real gloo ranks, each in its own process.

Usage::

    from gloo_world import run_world

    def _body(rank: int, world_size: int, scale: int) -> float:
        t = torch.ones(1) * scale
        dist.all_reduce(t)
        return t.item()

    def test_sum():
        assert run_world(_body, 4, 3) == [12.0] * 4

``fn`` must be a module-level function (it is pickled into spawned
processes) and runs after ``init_process_group("gloo")``. Its return value
(picklable) comes back per rank, in rank order. An exception on any rank is
re-raised in the test as :class:`WorkerError` carrying that rank's traceback;
a world that does not finish within ``timeout`` seconds of every rank having
imported torch is killed and raises :class:`WorkerTimeout`, so a hang fails the
test instead of blocking CI. Starting the ranks (spawning, importing torch: over
a minute for torch's CUDA builds on a loaded machine, as in the compat run) has
its own, wider bound, so a slow start is not taken for a hang.

Rendezvous uses a FileStore in a fresh temporary directory, so concurrent
test runs never fight over a port. Each worker runs with one intra-op thread:
the CI machines have 2 cores shared by every rank.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_mod
import shutil
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch.multiprocessing as mp

__all__ = ["run_world", "WorkerError", "WorkerTimeout", "NOISE_BOUND"]

#: A rank named a straggler beside a world's deliberate sleeper must lead by less than this share of
#: the sleep: a loaded 2-core machine can hold a rank up for tens of ms (21.9 ms seen with two CPU
#: hogs and a second test run beside the world's three ranks), never for the sleep, whose own
#: straggler must show at least 80% of it.
NOISE_BOUND = 0.1

DEFAULT_TIMEOUT_S = 120.0
#: How long the ranks may take to start (spawn, import torch) before the world counts as hung.
START_TIMEOUT_S = 900.0


class WorkerError(RuntimeError):
    """A rank raised; the message holds its traceback."""


class WorkerTimeout(TimeoutError):
    """The world did not finish in time (a hang or a deadlock)."""


def _worker(
    rank: int,
    world_size: int,
    store_file: str,
    timeout_s: float,
    env: dict[str, str],
    results: Any,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """Body of one spawned rank: init gloo, run fn, report, tear down."""
    os.environ.update(env)
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size)}
    )
    try:
        import torch
        import torch.distributed as dist

        results.put((rank, None, b""))  # started: the world's timeout counts from here
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store_file}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        try:
            value = fn(rank, world_size, *args)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        # Pickle here: a value the queue cannot pickle would otherwise vanish
        # in its feeder thread and leave the parent waiting.
        payload = pickle.dumps(value)
        results.put((rank, True, payload))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent test
        results.put((rank, False, traceback.format_exc()))


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return each rank's result.

    ``env`` adds environment variables in every worker (set before
    init_process_group). Raises WorkerError / WorkerTimeout as described in
    the module docstring.
    """
    tmp = tempfile.mkdtemp(prefix="gloo_world_")
    worker_env = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, os.path.join(tmp, "store"), timeout, worker_env, results, fn, args),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    try:
        for proc in procs:
            proc.start()
        return _collect(procs, results, world_size, timeout)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        results.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _collect(procs: list[Any], results: Any, world_size: int, timeout: float) -> list[Any]:
    """Wait for every rank's report; fail fast on the first error or dead rank. The ranks have
    START_TIMEOUT_S to start; ``timeout`` counts from the last one's start."""
    deadline = time.monotonic() + START_TIMEOUT_S
    started: set[int] = set()
    values: dict[int, Any] = {}
    while len(values) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if len(started) < world_size:
                missing = sorted(set(range(world_size)) - started)
                raise WorkerTimeout(f"ranks {missing} did not start within {START_TIMEOUT_S:.0f}s")
            missing = sorted(set(range(world_size)) - set(values))
            raise WorkerTimeout(f"ranks {missing} did not finish within {timeout:.0f}s (hang?)")
        try:
            rank, ok, value = results.get(timeout=min(remaining, 0.5))
        except queue_mod.Empty:
            dead = [r for r, p in enumerate(procs) if r not in values and p.exitcode not in (None, 0)]
            if dead:
                raise WorkerError(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode} without reporting")
            continue
        if ok is None:
            started.add(rank)
            if len(started) == world_size:
                deadline = time.monotonic() + timeout
            continue
        if not ok:
            raise WorkerError(_describe_failures([(rank, value)], results))
        values[rank] = pickle.loads(value)
    return [values[r] for r in range(world_size)]


def _describe_failures(failures: list[tuple[int, str]], results: Any) -> str:
    """One rank's error usually makes its peers fail too (connection reset):
    wait a moment for those reports so the root cause is shown, listed first."""
    grace = time.monotonic() + 2.0
    while time.monotonic() < grace:
        try:
            rank, ok, value = results.get(timeout=0.2)
        except queue_mod.Empty:
            continue
        if ok is False:  # not a start report (None) nor a result
            failures.append((rank, value))
    peer_error = ("Connection reset", "Connection closed", "Broken pipe")
    failures.sort(key=lambda f: any(marker in f[1] for marker in peer_error))
    return "\n".join(f"rank {rank} raised:\n{tb}" for rank, tb in failures)


def profiled_pair_job(rank: int, world_size: int, out_dir: str) -> None:
    """A small commtag-profiled job (the world and a group of ranks 0 and 1), one trace per rank:
    the real input the merge's discovery tests lay out and alter."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    pair = dist.new_group([0, 1])
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        t = torch.ones(16)
        for _ in range(3):
            dist.all_reduce(t)
            if rank < 2:
                dist.all_reduce(t, group=pair)
        dist.barrier()
    commtag.uninstall()


#: The world size ``profiled_groups_job`` is written for (tests/conftest.py's ``gloo_run``).
PROFILED_GROUPS_WORLD = 4


def profiled_groups_job(rank: int, world_size: int, out_dir: str) -> None:
    """A commtag-profiled job on several process groups, one trace and sidecar per rank: the world,
    even/odd pairs, the pair (0, 1); sync, async and p2p calls and a barrier. The real input the
    merge tests read and the input tests damage (conftest's shared ``gloo_run``)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    try:
        even = dist.new_group([0, 2])
        odd = dist.new_group([1, 3])
        pair = dist.new_group([0, 1])
        mine = even if rank % 2 == 0 else odd
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
            t = torch.ones(1000)
            for _ in range(2):
                dist.all_reduce(t)
                dist.all_reduce(t, group=mine)
            dist.broadcast(t, src=0)
            out = torch.empty(1000 * world_size)
            dist.all_gather_into_tensor(out, t)
            work = dist.all_reduce(t, group=mine, async_op=True)
            work.wait()
            if rank < 2:
                dist.all_reduce(t, group=pair)
            if rank == 0:
                dist.send(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
            dist.barrier()
    finally:
        commtag.uninstall()
