"""The merge's analysis hook: figures on every instance's args, counters and markers for the trace."""

from __future__ import annotations

from typing import Optional

from commtag.merge.analysis.align import alignment_marker
from commtag.merge.analysis.analyze import DEFAULT_STRAGGLER_MIN_SKEW_US, analyze
from commtag.merge.analysis.impact import impact_counters
from commtag.merge.analysis.results import Analysis, MatchedCollective, to_us
from commtag.merge.records import (
    ALL_TIME,
    WINDOW_MARKER,
    WORLD_MARKER,
    CollectiveInstance,
    CounterSeries,
    Coverage,
    Marker,
    TraceAnnotations,
)
from commtag.merge.steps import encode, in_window
from commtag.vocab import (
    ANN_ALGBW, ANN_BUSBW, ANN_BUSBW_IMPLAUSIBLE, ANN_BYTES, ANN_CAUSE, ANN_NODES, MAX_PLAUSIBLE_BUSBW_GBPS, ANN_DESYNC, ANN_LAST_RANK, ANN_MARKER,
    ANN_MEMBERS_NOT_FOUND, ANN_MISSING_RANKS, ANN_RANKS_MATCHED, ANN_SKEW_US, ANN_STRAGGLER,
    ANN_WAIT_US, ANN_WINDOW_NS, ANN_WINDOW_RANK, ANN_WINDOW_SELECTION, ANN_WINDOW_STEPS, ANN_WORLD_SIZE,
)


def trace_annotations(analysis: Analysis, lane_names: Optional[dict[str, str]] = None) -> TraceAnnotations:
    """Counters and markers for the Perfetto writer.

    One busbw counter per process group, under the lowest member rank's lanes
    (one track per group, not one copy per member). Each rank's profiled
    windows become instants too, with their ProfilerSteps, so that the merged file alone can be analyzed.
    """
    owner: dict[str, int] = {}
    names: dict[str, str] = dict(lane_names or {})
    for m in analysis.collectives:
        owner[m.pg_uid] = min(owner.get(m.pg_uid, m.first_rank), *m.members)
        names.setdefault(m.pg_uid, m.lane_name or m.pg_uid)
    counters = [busbw_counter(owner[pg], names[pg], points) for pg, points in sorted(analysis.busbw.items())]
    counters.extend(impact_counters(analysis.impact))
    return TraceAnnotations(counters=counters, markers=[*analysis.markers, *window_markers(analysis.coverage)])


def busbw_counter(rank: int, name: str, points: list[tuple[int, float]]) -> CounterSeries:
    """A group's busbw counter track, on ``rank`` (its lowest member), named after its lane ``name``."""
    return CounterSeries(rank, f"busbw {name} (GB/s)", points, unit="GB/s", lane=name)


def window_markers(coverage: Coverage) -> list[Marker]:
    out = []
    for rank, windows in sorted(coverage.windows.items()):
        for k, (first, last) in enumerate(w for w in windows if w != ALL_TIME):
            args: dict[str, object] = {ANN_MARKER: WINDOW_MARKER, ANN_WINDOW_RANK: rank, ANN_WINDOW_NS: last - first}
            if coverage.world_size:
                args[ANN_WORLD_SIZE] = coverage.world_size
            steps = in_window(coverage.steps.get(rank, ()), first, last)
            if steps:
                args[ANN_WINDOW_STEPS] = encode(steps, first)
            if coverage.selection:
                args[ANN_WINDOW_SELECTION] = coverage.selection
            out.append(Marker(rank, first, f"profiled window {k + 1} of {len(windows)} ({(last - first) / 1e6:.1f} ms)",
                              args))
    if coverage.world_size and not out and coverage.firsts:  # no window says it (no rank showed a collective)
        rank = min(coverage.firsts)
        out.append(Marker(rank, coverage.firsts[rank], f"world size {coverage.world_size} (no profiled window: "
                          "no collective recorded)", {ANN_MARKER: WORLD_MARKER, ANN_WORLD_SIZE: coverage.world_size}))
    return out + alignment_marker(coverage)


def annotate(analysis: Analysis) -> None:
    """Write the figures into each member's annotations (its lane slice's): the collective's
    into one common dict its members share, each rank's wait into that rank's own args."""
    for m in analysis.collectives:
        figures = collective_figures(m)
        joined: dict[int, dict] = {}
        waits = m.waits_ns
        for rank, inst in m.members.items():
            base = inst.common_args
            both = joined.get(id(base))
            if both is None:
                both = joined[id(base)] = {**base, **figures}
            inst.common_args = both
            if rank in waits:
                inst.args[ANN_WAIT_US] = to_us(waits[rank])
            if m.straggler and rank == m.last_rank:
                inst.args[ANN_STRAGGLER] = True


def collective_figures(m: MatchedCollective) -> dict[str, object]:
    """What the analysis says of one matched collective, on each member's lane slice."""
    figures: dict[str, object] = {ANN_RANKS_MATCHED: f"[{', '.join(map(str, m.ranks))}]"}
    if m.complete and m.skew_ns is not None:
        figures[ANN_SKEW_US] = to_us(m.skew_ns)
        figures[ANN_LAST_RANK] = m.last_rank
    else:
        figures[ANN_MISSING_RANKS] = f"[{', '.join(map(str, m.missing_ranks))}]"
        if m.unnamed_missing:
            figures[ANN_MEMBERS_NOT_FOUND] = m.unnamed_missing
    if m.bytes is not None:
        figures[ANN_BYTES] = m.bytes
    if m.algbw_gbps is not None:
        figures[ANN_ALGBW] = round(m.algbw_gbps, 6)
    if m.busbw_gbps is not None:
        figures[ANN_BUSBW] = round(m.busbw_gbps, 6)
    if m.busbw_implausible:
        figures[ANN_BUSBW_IMPLAUSIBLE] = f"above {MAX_PLAUSIBLE_BUSBW_GBPS:,.0f} GB/s, more than any link carries: left out"
    if m.nodes is not None:
        figures[ANN_NODES] = m.nodes
    if m.cause is not None:
        figures[ANN_CAUSE] = m.cause
    if m.findings:
        figures[ANN_DESYNC] = "\n".join(f.message for f in m.findings)
    return figures


class MergeAnalysis:
    """The merge's analysis hook (``pipeline.merge(analysis=...)``).

    Puts the figures on every instance's args before the lanes are written,
    returns the busbw counters and the markers, and keeps the result so that
    ``merge --strict`` can fail on its desyncs.
    """

    def __init__(self, straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US) -> None:
        self.straggler_min_skew_us = straggler_min_skew_us
        self.result: Optional[Analysis] = None

    def __call__(self, instances: list[CollectiveInstance], coverage: Optional[Coverage] = None) -> TraceAnnotations:
        self.result = analyze(instances, coverage=coverage, straggler_min_skew_us=self.straggler_min_skew_us)
        annotate(self.result)
        return trace_annotations(self.result)
