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

    @property
    def key(self) -> tuple[str, bool, int, Optional[int]]:
        """The cross-rank key: the same instance has it on every member rank."""
        return (self.pg_uid, self.is_p2p, self.seq, self.replay)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns
