"""What a merge holds for every rank at once stays small (memory flat in the rank count).

A merge keeps each rank's collective records until the lanes are written; anything
else it keeps per rank or per instance multiplies by the world size. These tests pin
the two shapes that grew with the ranks: the cross-rank flow ids of every instance
(the peak of a 512-rank merge) and each rank's copy of every group's member list.
``launch/bench_ranks.py`` measures the peak RSS of 32- and 512-rank merges.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson
import pytest

from commtag.merge.engine.shards import analyze
from commtag.merge.ids import FLOW_CROSS_RANK, flow_id
from commtag.merge.pftrace.lanes import FULL_MESH_MAX
from commtag.merge.inputs.load import discover
from commtag.merge.engine.options import MergeOptions
from commtag.merge.engine.pipeline import make_plan, write_ranks
from commtag.merge.records import CollectiveInstance, Interner, match_groups
from commtag.merge.engine.exchange import from_wire, to_wire
from commtag.merge.engine.worlds import SoloWorld
from commtag.testing.bench import records_size
from merging import one_driver

WORLD = tuple(range(512))


def _instance(rank: int, uid: str, ranks: tuple[int, ...], seq: int, start_ns: int) -> CollectiveInstance:
    return CollectiveInstance(rank=rank, pg_uid=uid, is_p2p=False, seq=seq, replay=None, collective="allreduce",
                              in_nelems=1024, out_nelems=1024, dtype="Float", group_size=len(ranks), group_ranks=ranks,
                              start_ns=start_ns, end_ns=start_ns + 10_000, source="nccl-kernel", lane_name=uid)


def _job() -> list[CollectiveInstance]:
    """A 512-rank world's all-reduces (a star of flows each) and its 8-rank groups' (a full mesh)."""
    world = [_instance(r, "0", WORLD, seq, 10**12 + seq * 10**6 + (r * 7919) % 1000)
             for seq in range(64) for r in WORLD]
    tp = [_instance(r, f"tp{r // 8}", WORLD[r // 8 * 8: r // 8 * 8 + 8], seq, 2 * 10**12 + seq * 10**6 + r % 5)
          for seq in range(8) for r in WORLD]
    return world + tp


def _pairwise(instances: list[CollectiveInstance]) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """The flows by their definition: per matched collective in order, members by start then rank,
    pairs (i, j) numbered one after another (every pair up to FULL_MESH_MAX members, else 0 with each)."""
    flows: dict[int, tuple[list, list]] = {}
    counter = 0
    for members in match_groups(instances):
        members = sorted(members, key=lambda m: (m.start_ns, m.rank))
        n = len(members)
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)] if n <= FULL_MESH_MAX else [(0, j) for j in range(1, n)]
        for i, j in pairs:
            counter += 1
            flows.setdefault(id(members[i]), ([], []))[0].append(flow_id(FLOW_CROSS_RANK, 0, counter))
            flows.setdefault(id(members[j]), ([], []))[1].append(flow_id(FLOW_CROSS_RANK, 0, counter))
    return {key: (tuple(a), tuple(b)) for key, (a, b) in flows.items()}


def _as_tuples(found) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if found.__class__ is int:
        return (), (found,)
    out, into = found
    return tuple(out or ()), tuple(into or ())


def test_cross_rank_flows_of_a_512_rank_world_are_the_pairs_and_little_is_held_per_instance() -> None:
    # Rank by rank, as a merge meets them (the flows are numbered in that order).
    instances = sorted(_job(), key=lambda inst: inst.rank)
    expected = _pairwise(instances)
    tracemalloc.start()
    try:
        own = one_driver(instances).lanes  # the merge's one driver, in a world of one
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # Each rank's instances are taken in their order in ``instances``: a place is the k-th of its rank.
    by_rank = {r: [i for i in instances if i.rank == r] for r in WORLD}
    nth = {(r, k): inst for r, listed in by_rank.items() for k, inst in enumerate(listed)}
    got = {}
    for key in list(own):
        places = own.held[key][1]
        for inst, place in zip(own.pop(key, ()), places):
            found = own.flows.get(id(inst))
            if found is not None:
                got[id(nth[(key[0], place)])] = _as_tuples(found)
    assert got == expected
    # Held for every instance of the job at once until its lane is written (its packed record, and
    # what came back for it: figures, wait, flows): tuples of lists of every instance's flow ids alone
    # took 481 bytes each.
    per_instance = held / len(instances)
    assert per_instance < 200, f"{per_instance:.0f} bytes per instance"


@pytest.mark.slow  # a real 4-rank gloo run
def test_the_analysis_keeps_little_per_member_of_a_512_rank_world() -> None:
    """The analysis with its matched collectives (``commtag summary``'s) holds every member's record
    as its driver read it and, beyond those, little: per member a dict entry (~40 bytes at this
    size) and per collective its own figures. Each member's wait is made on request, not kept in
    a second dict: 59 bytes per instance beyond the records on this job, against 114 with that dict."""
    instances = _job()
    tracemalloc.start()
    try:
        result = analyze(instances)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(result.collectives) == 64 + 8 * 64
    world = result.collectives[0]
    assert world.group_size == 512 and world.last_rank is not None
    assert world.waits_ns == {r: world.last_start_ns - i.start_ns for r, i in world.members.items()}
    assert max(world.waits_ns.values()) == world.skew_ns
    beyond = held - records_size([inst for m in result.collectives for inst in m.members.values()])
    assert beyond / len(instances) < 80, f"{beyond / len(instances):.0f} bytes per instance beyond the records"


@pytest.mark.slow  # a real 4-rank gloo run (the gloo_run fixture)
def test_every_rank_shares_one_member_list_per_group(gloo_run: Path, tmp_path: Path) -> None:
    plan = make_plan([gloo_run], tmp_path / "merged.pftrace", MergeOptions(progress=False), SoloWorld())
    with plan.output:
        summaries = write_ranks(plan)
    assert [s.rank for s in summaries] == [0, 1, 2, 3]
    by_uid: dict[str, list] = {}
    for summary in summaries:
        for group in summary.groups:
            by_uid.setdefault(group.pg_uid, []).append(group.ranks)
    world = [uid for uid, lists in by_uid.items() if len(lists) == 4]
    assert world, f"no group known to all 4 ranks: {by_uid}"
    for uid, lists in by_uid.items():
        assert all(ranks == lists[0] for ranks in lists), uid
        # One object, not one per rank: a world of N ranks would hold N copies of N members.
        assert all(ranks is lists[0] for ranks in lists), f"group {uid}: each rank holds its own member list"


@pytest.mark.slow  # a real 4-rank gloo run (the gloo_run fixture)
def test_records_from_another_worker_take_no_more_memory_than_where_they_were_made(gloo_run: Path,
                                                                                tmp_path: Path) -> None:
    """A merge worker holds every other worker's records as it decoded them from the exchange:
    a decoded instance takes no more than a made one (as orjson leaves it, it would take ~85 bytes
    more: a fresh int for each size and lane id that a call site's instances share, and oversized
    dict tables), so a torchrun worker's peak grows with the ranks no faster than a single
    process's."""
    plan = make_plan([gloo_run], tmp_path / "merged.pftrace", MergeOptions(progress=False), SoloWorld())
    with plan.output:
        summaries = write_ranks(plan)
    made = [i for s in summaries for i in s.instances]
    assert len(made) > 20
    decoded = [i for s in from_wire(orjson.loads(orjson.dumps(to_wire(summaries))), Interner()) for i in s.instances]
    assert decoded == made
    assert records_size(decoded) <= records_size(made), (records_size(decoded), records_size(made))


def test_discovery_keeps_what_it_read_of_each_trace_not_its_first_bytes(tmp_path: Path) -> None:
    # Traces whose first 64 KB (what discovery reads) hold their rank and base time, then events.
    filler = [{"ph": "X", "name": "aten::add", "pid": 1, "tid": 1, "ts": i, "dur": 1, "args": {"x": "y" * 200}}
              for i in range(400)]
    for rank in range(64):
        trace = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 64},
                 "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": filler}
        (tmp_path / f"rank{rank}.pt.trace.json").write_bytes(orjson.dumps(trace))
    tracemalloc.start()
    try:
        ranks = discover([tmp_path])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r.rank for r in ranks] == list(range(64))
    assert {r.files[0].base_ns for r in ranks} == {1_700_000_000_000_000_000}
    # Holding every trace's 64 KB head until the ranks were known took 64 x 64 KB.
    assert peak < 1_500_000, f"{peak / 1e6:.1f} MB traced while discovering 64 traces"
