"""install()/uninstall() from many threads at once leave one consistent state.

Every object commtag patches (the collectives in both torch.distributed
modules and CUDAGraph's capture hooks) must be the original after the last
call was an uninstall and commtag's wrapper after an install, and the hooks it
registers with torch.cuda.graphs (2.14+) present exactly while installed, with
is_installed() agreeing, however the calls interleaved. CUDAGraph exists on the
CPU build of torch, so the capture hooks are checked here too.
"""

from __future__ import annotations

import sys
import threading

import torch.distributed as dist
from torch.cuda import graphs
from torch.cuda.graphs import CUDAGraph
from torch.distributed import distributed_c10d as c10d

import commtag
from commtag.runtime.describe.metadata import OPS

#: The CUDAGraph methods commtag wraps: only capture_end where torch has graph lifecycle hooks
#: (2.14+), whose registries are checked instead (see commtag.runtime.install.hooks).
TORCH_HOOKS = hasattr(graphs, "register_graph_capture_start_hook")
HOOKS = ("capture_end",) if TORCH_HOOKS else ("capture_begin", "capture_end", "replay")
REGISTRIES = ("_global_capture_start_hooks", "_global_replay_start_hooks", "_global_replay_end_hooks") \
    if TORCH_HOOKS else ()
#: What install() may replace (the delegating ops it leaves alone stay originals either way).
NAMES = [*OPS, "batch_isend_irecv", "_coalescing_manager"]
ROUNDS, THREADS, CALLS = 40, 6, 20


def _snapshot() -> dict[str, object]:
    """Every object install() could replace, by where it lives."""
    objects: dict[str, object] = {f"c10d.{n}": c10d.__dict__.get(n) for n in NAMES}
    objects.update({f"dist.{n}": dist.__dict__.get(n) for n in NAMES})
    objects.update({f"CUDAGraph.{n}": CUDAGraph.__dict__.get(n) for n in HOOKS})
    objects.update({f"graphs.{n}": tuple(getattr(graphs, n).values()) for n in REGISTRIES})
    return objects


def _check(originals: dict[str, object], replaced: set[str], installed: bool) -> list[str]:
    """What is wrong with the current state, given whether commtag should be installed."""
    problems = []
    if commtag.is_installed() != installed:
        problems.append(f"is_installed() is {commtag.is_installed()}, expected {installed}")
    for where, now in _snapshot().items():
        original = originals[where]
        if where.startswith("graphs."):
            if (now != original) != installed:
                problems.append(f"{where} holds commtag's hook: {now != original}, installed: {installed}")
            continue
        if not installed:
            if now is not original:
                problems.append(f"{where} is not the original after uninstall")
            continue
        if now is original:
            if where.startswith("CUDAGraph.") or where.split(".", 1)[1] in replaced:
                problems.append(f"{where} is still the original after install")
        elif getattr(now, "__wrapped__", None) is not original:
            problems.append(f"{where} is neither the original nor commtag's wrapper of it")
    return problems


def _replaced() -> set[str]:
    """The collectives a single-threaded install() replaces (the others it leaves in place)."""
    originals = {n: c10d.__dict__.get(n) for n in NAMES}
    commtag.install()
    try:
        return {n for n in NAMES if c10d.__dict__.get(n) is not None and
                c10d.__dict__[n] is not originals[n]}
    finally:
        commtag.uninstall()


def test_install_and_uninstall_from_many_threads_stay_consistent():
    commtag.uninstall()
    originals = _snapshot()
    replaced = _replaced()
    assert {"all_reduce", "barrier", "batch_isend_irecv"} <= replaced
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: every interleaving counts
    try:
        for round_ in range(ROUNDS):
            errors = _hammer(THREADS, CALLS)
            assert errors == [], f"round {round_}: {errors!r}"
            # Whatever order the last calls ran in, the state is one of the two.
            assert _check(originals, replaced, commtag.is_installed()) == [], f"round {round_}"
        commtag.install()
        assert _check(originals, replaced, True) == []
        commtag.uninstall()
        assert _check(originals, replaced, False) == []
    finally:
        sys.setswitchinterval(interval)
        commtag.uninstall()


def _hammer(threads: int, calls: int) -> list[BaseException]:
    """``threads`` threads, each alternating install() and uninstall() ``calls`` times, all at once."""
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(index: int) -> None:
        try:
            start.wait()
            for i in range(calls):
                if (i + index) % 2:
                    commtag.install()
                else:
                    commtag.uninstall()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not any(worker.is_alive() for worker in workers)
    return errors
