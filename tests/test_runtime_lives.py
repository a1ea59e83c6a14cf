"""destroy_process_group() and a new init inside one profile: each life of the world is its own group.

torch names the new life's groups "0", "1", ... again and their Seq starts
at 1 again. Three real gloo ranks run two lives in one profiled window; the
second life creates its groups in a different order on every rank. The
merge must pair each call with the same call of its own life on the other
members, never with a call of the other life.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from gloo_world import run_world

pytestmark = pytest.mark.slow

WORLD = 3


def _two_lives(rank: int, world_size: int, out_dir: str, per_life_dir: str, second_store: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    try:
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(per_life_dir)):
            dist.all_reduce(torch.ones(4))
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
            pair = dist.new_group([0, 1])
            for _ in range(2):
                dist.all_reduce(torch.ones(4))
                if rank in (0, 1):
                    dist.all_reduce(torch.ones(4), group=pair)
            dist.destroy_process_group()
            dist.init_process_group("gloo", init_method=f"file://{second_store}", rank=rank,
                                    world_size=world_size, timeout=timedelta(seconds=60))
            # Names start over: "1" is now [1, 2], the pair [0, 1] is "2".
            tail = dist.new_group([1, 2])
            pair = dist.new_group([0, 1])
            for _ in range(3):
                dist.all_reduce(torch.ones(4))
                if rank in (0, 1):
                    dist.all_reduce(torch.ones(4), group=pair)
                if rank in (1, 2):
                    dist.all_reduce(torch.ones(4), group=tail)
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(per_life_dir)):
            dist.all_reduce(torch.ones(4))
    finally:
        commtag.uninstall()


@pytest.fixture(scope="module")
def lives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lives")
    run_world(_two_lives, WORLD, str(out / "traces"), str(out / "per_life"), str(out / "second_store"))
    return out


def test_each_life_of_the_world_pairs_only_with_itself(lives: Path) -> None:
    from commtag.merge.engine.shards import analyze
    from merging import merge
    from commtag.sidecarfile import read_sidecar

    traces = lives / "traces"

    sides = [read_sidecar(traces / f"rank{r}.step0.commtag.json") for r in range(WORLD)]
    rows: dict[str, set] = {}
    for side in sides:
        for pg in side.process_groups:
            rows.setdefault(pg.uid, set()).add((pg.name, tuple(pg.ranks), pg.lane_id, pg.lane_name))
    # One identity per group on every member rank.
    assert all(len(v) == 1 for v in rows.values()), rows
    first = {uid for uid in rows if "~" not in uid}
    second = {uid for uid in rows if uid.endswith("~1")}
    assert first | second == set(rows)
    names = {uid: next(iter(v)) for uid, v in rows.items()}
    assert sorted((names[u][0], names[u][1]) for u in first) == [("0", (0, 1, 2)), ("1", (0, 1))]
    world = {life: next(u for u in uids if names[u][0] == "0") for life, uids in ((0, first), (1, second))}
    assert sorted((names[u][0], names[u][1]) for u in second) == [("0", (0, 1, 2)), ("1", (1, 2)), ("2", (0, 1))]
    assert all(names[u][3].endswith(" gen 1") and not names[u][3].endswith(" gen 1 gen 1") for u in second)
    assert len({row[2] for row in names.values()}) == len(names)  # a lane per group and life

    result = merge(traces)
    analysis = analyze(result.instances)
    # Nothing dropped or doubled: every instance is in one matched collective, once per member rank.
    assert sum(len(m.members) for m in analysis.collectives) == len(result.instances)
    for m in analysis.collectives:
        assert m.ranks == tuple(names[m.pg_uid][1]), (m.pg_uid, m.seq, m.ranks)
        assert not m.missing_ranks and not m.desync, m.to_dict()
    per_uid = Counter(m.pg_uid for m in analysis.collectives)
    seqs = {uid: sorted(m.seq for m in analysis.collectives if m.pg_uid == uid) for uid in per_uid}
    assert seqs == {**{u: [1, 2] for u in first}, **{u: [1, 2, 3] for u in second}, world[0]: [2, 3]}
    # Every call of the second life began after every call of the first.
    last_first = max(i.start_ns for i in result.instances if i.pg_uid in first)
    assert all(i.start_ns > last_first for i in result.instances if i.pg_uid in second)


def test_a_profile_per_life_merges_as_one_run(lives: Path) -> None:
    """A profile before the re-init and one after, into one directory: one run, each call in its own life."""
    from commtag.merge.engine.shards import analyze
    from merging import merge

    result = merge(lives / "per_life")
    assert not result.skipped and not result.notices
    matched = analyze(result.instances).collectives
    assert [(m.pg_uid.endswith("~1"), m.seq, m.ranks) for m in matched] == [(False, 1, (0, 1, 2)), (True, 4, (0, 1, 2))]


def _three_lives_installed_first(rank: int, world_size: int, store_dir: str, results: Any) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import commtag
    from commtag.runtime.describe import groups

    original = c10d._update_default_pg
    commtag.install()  # before any init_process_group
    seen = []
    for life in range(3):
        dist.init_process_group("gloo", init_method=f"file://{store_dir}/store{life}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=60))
        pair = dist.new_group([0, 1])
        dist.all_reduce(torch.ones(1), group=pair)
        seen.append((groups.state_for(None).uid, groups.state_for(pair).uid, groups.state_for(pair).lane_name))
        dist.destroy_process_group()
    commtag.uninstall()
    results.put((rank, seen, c10d._update_default_pg is original))


def test_installed_before_init_every_life_counts_and_uninstall_restores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_three_lives_installed_first, args=(r, 2, str(tmp_path), results), daemon=True)
             for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        got = dict((rank, (seen, restored)) for rank, seen, restored in (results.get(timeout=120) for _ in procs))
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert got[0] == got[1]
    seen, restored = got[0]
    assert restored
    assert [(w.partition("~")[2], p.partition("~")[2]) for w, p, _ in seen] == [("", ""), ("1", "1"), ("2", "2")]
    assert [lane.rpartition(" [0, 1]")[2] for _, _, lane in seen] == ["", " gen 1", " gen 2"]
