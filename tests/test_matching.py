"""The merged trace's cross-rank flows link exactly what the analysis calls one collective.

A user reads a flow between two slices as "these are the same collective"
and the summary's figures as measured over those same slices, so the two must
not disagree, including for sends/receives without a recorded pair seq (eager
NCCL kernels: matched by message order) and instances the attacher marked not
cross-rank.
"""

from __future__ import annotations

import io
from itertools import combinations
from pathlib import Path

from commtag.merge.pftrace import writer
from commtag.merge.pftrace.lanes import LanesWriter
from commtag.merge.engine.shards import analyze
from commtag.merge.records import CollectiveInstance
from commtag.merge.timeline import RankTimeline
from merging import one_driver
from pftrace_reader import read

T0 = 1_700_000_000_000_000_000
RANKS = (0, 1, 2, 3)


def _inst(rank: int, seq: int, op: str, start_us: int, args: dict, *, p2p: bool = False,
          pg: str = "0:abc") -> CollectiveInstance:
    start = T0 + start_us * 1000
    return CollectiveInstance(
        rank=rank, pg_uid=pg, is_p2p=p2p, seq=seq, replay=None, collective=op, in_nelems=64, out_nelems=64,
        dtype="Float", group_size=len(RANKS), group_ranks=RANKS, start_ns=start, end_ns=start + 50_000,
        source="nccl-kernel", lane_name=f"lane {pg}", args=dict(args),
    )


def _job() -> list[CollectiveInstance]:
    out = [_inst(r, 1, "allreduce", 10 * r, {}) for r in RANKS]
    # A pipeline 0 -> 1 -> 2 with NCCL's p2p Seq (every peer counted together) and no pair seq:
    # rank 1 numbers its recv from 0 and its send to 2 with one counter, so Seq cannot pair them.
    for k in range(2):
        t = 1000 + 200 * k
        out.append(_inst(0, k + 1, "send", t, {"Dst Rank": 1}, p2p=True))
        out.append(_inst(1, 2 * k + 1, "recv", t + 5, {"Src Rank": 0}, p2p=True))
        out.append(_inst(1, 2 * k + 2, "send", t + 60, {"Dst Rank": 2}, p2p=True))
        out.append(_inst(2, k + 1, "recv", t + 65, {"Src Rank": 1}, p2p=True))
    # Recorded pair seqs win over order: rank 3's first receive fell before the window.
    out.append(_inst(0, 3, "send", 2000, {"Dst Rank": 3, "commtag p2p pair seq": 2}, p2p=True))
    out.append(_inst(3, 1, "recv", 2010, {"Src Rank": 0, "commtag p2p pair seq": 2}, p2p=True))
    # Metadata-less kernels the attacher could not vouch for: alone, whatever their key.
    for r in (0, 1):
        out.append(_inst(r, 1, "sendrecv", 3000, {"commtag cross-rank": False}, p2p=True, pg="unattributed:sendrecv"))
    for i, inst in enumerate(out):
        inst.args["i"] = i
    return out


def _linked_pairs(instances: list[CollectiveInstance], tmp_path: Path) -> set[frozenset[int]]:
    """Pairs of instance indices that the written trace links with a cross-rank flow."""
    lanes = {r: [(name, n) for n, name in enumerate(sorted({i.lane_name for i in instances}))] for r in RANKS}
    buf = io.BytesIO()
    buf.write(writer.header(T0))
    for r in RANKS:
        writer.write_rank(buf, RankTimeline(rank=r, process_name=f"rank {r}", tracks=[]))
    own = one_driver(instances).lanes
    LanesWriter().write(buf, lanes, own, own.flows, {})
    path = tmp_path / "lanes.pftrace"
    path.write_bytes(buf.getvalue())
    slices = [s for s in read(path).slices if "i" in s.args]
    assert len(slices) == len(instances)
    starts = {f: s.args["i"] for s in slices for f in s.flows_out}
    return {frozenset((starts[f], s.args["i"])) for s in slices for f in s.flows_in if f in starts}


def test_flows_link_exactly_the_analysis_matches(tmp_path: Path) -> None:
    instances = _job()
    linked = _linked_pairs(instances, tmp_path)
    matched = {
        frozenset(i.args["i"] for i in m.members.values())
        for m in analyze(instances).collectives
    }
    same = {frozenset(p) for members in matched for p in combinations(sorted(members), 2)}
    assert linked == same
    # What a user expects to see matched: the all-reduce on all four ranks, each send with its receive
    # by order (0->1 first with first, 1->2 likewise), the pair-seq message, and nothing else.
    by_index = {i.args["i"]: i for i in instances}
    described = sorted(
        tuple(sorted((by_index[i].rank, by_index[i].collective, by_index[i].start_ns - T0) for i in members))
        for members in matched if len(members) > 1
    )
    us = 1000
    assert described == sorted([
        tuple((r, "allreduce", 10 * r * us) for r in RANKS),
        ((0, "send", 1000 * us), (1, "recv", 1005 * us)),
        ((0, "send", 1200 * us), (1, "recv", 1205 * us)),
        ((1, "send", 1060 * us), (2, "recv", 1065 * us)),
        ((1, "send", 1260 * us), (2, "recv", 1265 * us)),
        ((0, "send", 2000 * us), (3, "recv", 2010 * us)),
    ])
