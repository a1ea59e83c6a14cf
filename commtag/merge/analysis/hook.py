"""The merge's own analysis: what it writes onto a collective's lane slices, its counters and its markers."""

from __future__ import annotations

from typing import Optional

from commtag.merge.analysis.align import alignment_marker
from commtag.merge.analysis.analyze import DEFAULT_STRAGGLER_MIN_SKEW_US
from commtag.merge.analysis.results import Analysis, MatchedCollective, to_us
from commtag.merge.records import (
    ALL_TIME,
    WINDOW_MARKER,
    WORLD_MARKER,
    CounterSeries,
    Coverage,
    Marker,
)
from commtag.merge.steps import encode, in_window
from commtag.vocab import (
    ANN_ALGBW, ANN_BUSBW, ANN_BUSBW_IMPLAUSIBLE, ANN_BYTES, ANN_CAUSE, ANN_NODES, MAX_PLAUSIBLE_BUSBW_GBPS, ANN_DESYNC,
    ANN_LAST_RANK, ANN_MARKER, ANN_MEMBERS_NOT_FOUND, ANN_MISSING_RANKS, ANN_RANKS_MATCHED, ANN_SKEW_US, ANN_WINDOW_NS,
    ANN_WINDOW_RANK, ANN_WINDOW_SELECTION, ANN_WINDOW_STEPS, ANN_WORLD_SIZE,
)


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
    """The merge's own analysis (``pipeline.merge(analysis=...)``), shared out between the merge
    workers (:mod:`commtag.merge.engine.shards`): its figures go onto every member's lane slice,
    its busbw and impact counters and straggler and desync markers into the trace, and the lead
    keeps the result (:attr:`result`) so that ``merge --strict`` can fail on its desyncs.
    """

    def __init__(self, straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US, keep: bool = False) -> None:
        self.straggler_min_skew_us = straggler_min_skew_us
        #: Keep every matched collective whole, with its markers, in the result: only in a world of one
        #: (:func:`commtag.merge.engine.shards.analyze`); else they stay with the workers that matched them.
        self.keep = keep
        self.result: Optional[Analysis] = None
