"""Plain records the merge wing hands to the analysis.

The loader and attacher turn every rank's trace and sidecar into these; the
analysis, the text/JSON report, the plot and the Perfetto annotations all read
them, so none of those needs to know Kineto or Perfetto.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(slots=True)
class CollectiveInstance:
    """One collective as it ran on one rank."""

    rank: int
    pg_uid: str
    is_p2p: bool
    seq: int
    #: Replay index for a graph-replayed collective, else None.
    replay: Optional[int]
    collective: str
    in_nelems: int
    out_nelems: int
    dtype: str
    group_size: int
    #: Global ranks of the group in group-rank order (empty if unknown).
    group_ranks: tuple[int, ...]
    start_ns: int
    end_ns: int
    #: Where the timing came from: "gloo", "nccl-kernel", "graph-replay", "cpu".
    source: str
    lane_name: str = ""
    #: Eager-style key/values as attached to the slice (for the report and the trace).
    args: dict[str, object] = field(default_factory=dict)
    #: The group's lane id (orders lanes identically on every rank).
    lane_id: int = 0
    #: Flow id the source slice (gloo op, kernel) starts and the lane slice ends.
    source_flow: Optional[int] = None

    @property
    def key(self) -> tuple[str, bool, int, Optional[int]]:
        """The cross-rank key: the same instance has it on every member rank."""
        return (self.pg_uid, self.is_p2p, self.seq, self.replay)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class CounterSeries:
    """A counter track under one rank's lanes (e.g. bus bandwidth of a group)."""

    rank: int
    #: Track name, unique per rank (e.g. "busbw pg 0 (GB/s)").
    track: str
    #: ``(ts_ns, value)`` points, any order.
    points: list[tuple[int, float]]
    unit: str = ""


@dataclass(slots=True)
class Marker:
    """An instant on one rank's marker track (e.g. a desync or a straggler)."""

    rank: int
    ts_ns: int
    name: str
    args: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class TraceAnnotations:
    """What an analysis adds to the merged trace besides per-slice args."""

    counters: list[CounterSeries] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
