"""The per-group summary table of an analysis: what ``commtag summary`` and the report print."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from commtag.merge.analysis.explain import INTER_NODE, INTRA_NODE, node_scope, time_by_cause
from commtag.merge.analysis.results import Analysis, MatchedCollective



def percentile(values: list[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (q in 0..100) of values; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


@dataclass(slots=True)
class GroupSummary:
    """One row of the summary table: one op in one process group."""

    pg_uid: str
    lane_name: str
    collective: str
    count: int
    #: Sum of the instances' bytes (nccl-tests' S); None when some instance's size is unknown.
    bytes: Optional[int]
    #: Sum over instances of the mean per-rank duration: the time a rank spends in the op, waits included.
    total_time_us: float
    skew_p50_us: Optional[float]
    skew_max_us: Optional[float]
    busbw_p50_gbps: Optional[float]
    busbw_p95_gbps: Optional[float]
    #: Global rank -> how many straggler instances it was the late rank of.
    stragglers: dict[int, int]
    desyncs: int
    #: Instances some member rank did not record (left out of skew and busbw).
    incomplete: int = 0
    #: "intra-node" (every instance on one host), "inter-node" (every one across hosts), else None.
    nodes: Optional[str] = None
    #: Per scope (intra-node, inter-node) of the instances whose hosts are known: count, time, busbw.
    by_nodes: dict[str, dict[str, object]] = field(default_factory=dict)
    #: Each cause's share of the instances' summed span (commtag.merge.analysis.explain).
    time_by_cause: dict[str, float] = field(default_factory=dict)
    #: Instances whose busbw came out above what any link carries (left out of the busbw figures).
    busbw_implausible: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "pg": self.pg_uid,
            "lane": self.lane_name,
            "collective": self.collective,
            "count": self.count,
            "bytes": self.bytes,
            "total_time_us": self.total_time_us,
            "skew_p50_us": self.skew_p50_us,
            "skew_max_us": self.skew_max_us,
            "busbw_p50_gbps": self.busbw_p50_gbps,
            "busbw_p95_gbps": self.busbw_p95_gbps,
            "stragglers": {str(r): n for r, n in sorted(self.stragglers.items())},
            "desyncs": self.desyncs,
            "incomplete": self.incomplete,
            "nodes": self.nodes,
            "by_nodes": self.by_nodes,
            "time_by_cause": self.time_by_cause,
            "busbw_implausible": self.busbw_implausible,
        }


def summarize(analysis: Analysis) -> list[GroupSummary]:
    """The per process group and op table, ordered by group, then total time (largest first)."""
    rows: dict[tuple[str, str], list[MatchedCollective]] = defaultdict(list)
    for m in analysis.collectives:
        rows[(m.pg_uid, m.collective)].append(m)
    out = []
    for (pg, op), ms in rows.items():
        skews = [m.skew_ns / 1000.0 for m in ms if m.skew_ns is not None]
        bws = [m.busbw_gbps for m in ms if m.busbw_gbps is not None]
        sizes = [m.bytes for m in ms if m.bytes is not None]
        stragglers: dict[int, int] = defaultdict(int)
        for m in ms:
            if m.straggler and m.last_rank is not None:  # a straggler is complete: its last rank is known
                stragglers[m.last_rank] += 1
        total = sum(statistics.fmean(i.duration_ns for i in m.members.values()) for m in ms) / 1000.0
        out.append(GroupSummary(
            pg_uid=pg,
            lane_name=ms[0].lane_name,
            collective=op,
            count=len(ms),
            bytes=None if len(sizes) < len(ms) else sum(sizes),
            total_time_us=round(total, 3),
            skew_p50_us=_round(median(skews)),
            skew_max_us=_round(max(skews, default=None)),
            busbw_p50_gbps=_significant(percentile(bws, 50)),
            busbw_p95_gbps=_significant(percentile(bws, 95)),
            stragglers=dict(stragglers),
            desyncs=sum(1 for m in ms if m.desync),
            incomplete=sum(1 for m in ms if not m.complete),
            nodes=node_scope(ms),
            by_nodes=_by_nodes(ms),
            time_by_cause=time_by_cause(ms),
            busbw_implausible=sum(1 for m in ms if m.busbw_implausible),
        ))
    out.sort(key=lambda g: (g.lane_name or g.pg_uid, -g.total_time_us, g.collective))
    return out


def _by_nodes(ms: list[MatchedCollective]) -> dict[str, dict[str, object]]:
    """The instances split by scope: on one host, across hosts (unknown hosts in neither)."""
    out: dict[str, dict[str, object]] = {}
    for scope in (INTRA_NODE, INTER_NODE):
        part = [m for m in ms if m.nodes is not None and (m.nodes == 1) == (scope == INTRA_NODE)]
        if part:
            bws = [m.busbw_gbps for m in part if m.busbw_gbps is not None]
            time = sum(statistics.fmean(i.duration_ns for i in m.members.values()) for m in part) / 1000.0
            out[scope] = {"count": len(part), "total_time_us": round(time, 3),
                          "busbw_p50_gbps": _significant(percentile(bws, 50))}
    return out


def _round(value: Optional[float]) -> Optional[float]:
    return round(value, 3) if value is not None else None


def _significant(value: Optional[float]) -> Optional[float]:
    """Four significant digits: gloo's MB/s and NVLink's hundreds of GB/s both stay readable."""
    return float(f"{value:.4g}") if value is not None else None
