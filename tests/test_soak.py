"""Soak: a 4-rank gloo job issues 10,000 collectives over 3 process groups from 2 threads per rank.

First half with the profiler off: commtag must keep nothing (its recorder
buffer stays empty, the process's memory does not grow with the number of
calls). Second half under the real torch.profiler with commtag's trace
handler: every collective every rank issued has its annotation in the rank's
sidecar, numbered with the Seq the group's members agree on, and the merge
finds each one in the trace.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from gloo_world import run_world

pytestmark = pytest.mark.slow

WORLD = 4
#: Collective calls per rank: half unprofiled, half profiled.
CALLS_PER_RANK = 10_000
HALF = CALLS_PER_RANK // 2
#: Per half: thread A runs this many on the world group, thread B as many alternating pair and even/odd groups.
PER_THREAD = HALF // 2


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def _threads(world, pair, parity, rank: int) -> list[int]:
    """Run both threads' share of one half; return the tensors' final values as a check of the results."""
    import torch
    import torch.distributed as dist

    results: dict[str, float] = {}
    errors: list[BaseException] = []

    def world_thread() -> None:
        try:
            t = torch.ones(4)
            for _ in range(PER_THREAD):
                t.fill_(1.0)
                dist.all_reduce(t, group=world)
            results["world"] = t[0].item()
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            errors.append(exc)

    def sub_thread() -> None:
        try:
            a = torch.ones(2)
            b = torch.ones(3)
            for i in range(PER_THREAD):
                if i % 2:
                    b.fill_(float(rank))
                    dist.broadcast(b, src=dist.get_global_rank(parity, 0), group=parity)
                else:
                    a.fill_(1.0)
                    dist.all_reduce(a, group=pair)
            results["pair"] = a[0].item()
            results["parity"] = b[0].item()
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the main thread's assertion
            errors.append(exc)

    threads = [threading.Thread(target=world_thread), threading.Thread(target=sub_thread)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return [results["world"], results["pair"], results["parity"]]


def _soak(rank: int, world_size: int, out_dir: str) -> dict:
    import gc

    import torch.distributed as dist
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    import commtag
    from commtag.runtime.record import recorder

    commtag.install()
    world = dist.group.WORLD
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    parities = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    pair, parity = pairs[rank // 2], parities[rank % 2]

    # Warm up allocators and gloo buffers so that RSS growth measures commtag, not first use.
    _threads(world, pair, parity, rank)
    dist.barrier()
    gc.collect()
    rss_before = _rss_kib()
    off_values = _threads(world, pair, parity, rank)
    gc.collect()
    rss_after = _rss_kib()
    buffered_off = recorder.pending()

    dist.barrier()
    # profile_all_threads: without it the profiler traces only the thread that started it.
    every_thread = _ExperimentalConfig(profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir),
                 experimental_config=every_thread):
        on_values = _threads(world, pair, parity, rank)
    commtag.uninstall()
    return {
        "rss_growth_kib": rss_after - rss_before,
        "buffered_off": buffered_off,
        "buffered_after": recorder.pending(),
        "values": (off_values, on_values),
    }


def test_soak_10k_collectives_3_groups_2_threads(tmp_path: Path):
    from commtag.merge.engine.pipeline import collect
    from commtag.sidecarfile import read_sidecar

    results = run_world(_soak, WORLD, str(tmp_path), timeout=300)

    for rank, res in enumerate(results):
        # Profiler off: nothing kept per call, memory flat (loose bound: 2,500 calls of a
        # leak of even ~1 KiB each would show; allocator noise stays well below).
        assert res["buffered_off"] == 0 and res["buffered_after"] == 0, (rank, res)
        assert res["rss_growth_kib"] < 2048, (rank, res["rss_growth_kib"])
        # Results are what the collectives compute, with or without the profiler.
        parity_src = rank % 2
        for values in res["values"]:
            assert values == [float(WORLD), 2.0, float(parity_src)], (rank, values)

    # Profiler on: every call is in the sidecar, with the Seq its group agrees on.
    sides = [read_sidecar(tmp_path / f"rank{r}.step0.commtag.json") for r in range(WORLD)]
    # Seq numbers counted before the profiled half: warm-up + unprofiled half (+2 barriers on WORLD).
    before = {"world": 2 * PER_THREAD + 2, "pair": 2 * (PER_THREAD // 2), "parity": 2 * (PER_THREAD // 2)}
    per_group: dict[str, dict[int, tuple]] = defaultdict(dict)
    for rank, side in enumerate(sides):
        assert len(side.collectives) == HALF, (rank, len(side.collectives))
        by_kind: dict[str, list] = defaultdict(list)
        for rec in side.collectives:
            ann = rec.annotation
            kind = "world" if ann.group_size == WORLD else ("pair" if ann.collective_name == "allreduce" else "parity")
            by_kind[kind].append(ann)
            key = (ann.collective_name, ann.in_msg_nelems, ann.dtype, ann.pg_ranks)
            # Every member rank annotates the same (group, Seq) with the same call.
            assert per_group[ann.pg_uid].setdefault(ann.seq, key) == key, (rank, ann)
        counts = {kind: len(anns) for kind, anns in by_kind.items()}
        assert counts == {"world": PER_THREAD, "pair": PER_THREAD // 2, "parity": PER_THREAD // 2}, (rank, counts)
        for kind, anns in by_kind.items():
            # No Seq lost or repeated under two threads: exactly the next numbers of each group.
            seqs = sorted(a.seq for a in anns)
            assert seqs == list(range(before[kind] + 1, before[kind] + 1 + len(anns))), (rank, kind)
    # Each (group, Seq) was seen by all of that group's members.
    members = Counter()
    for side in sides:
        for rec in side.collectives:
            members[(rec.annotation.pg_uid, rec.annotation.seq)] += 1
    sizes = {rec.annotation.pg_uid: rec.annotation.group_size for s in sides for rec in s.collectives}
    assert all(n == sizes[uid] for (uid, _), n in members.items())

    # The merge joins every recorded call to its op in the trace.
    _, instances = collect(tmp_path)
    assert len(instances) == WORLD * HALF
    assert Counter(i.source for i in instances) == {"gloo": WORLD * HALF}
    assert all(i.start_ns <= i.end_ns for i in instances)
