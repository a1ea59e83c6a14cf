"""What the loader hands the Perfetto writer: one rank's tracks of slices.

Neutral types, so that the loader knows Kineto but not Perfetto and the
writer knows Perfetto but not Kineto. Slices are plain tuples (one per
event, hundreds of thousands per rank) because tuple creation is the
cheapest record Python has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

#: ``(start_ns, end_ns, name, category, args, flows_out, flows_in)``:
#: args is a dict or None; flows_out are the flow ids this slice starts (or
#: continues), flows_in the ids it terminates (tuples or None).
Slice = tuple

#: ``(ts_ns, name, category, args)``.
Instant = tuple

#: Names of the track groups directly under a rank's process. Perfetto orders a
#: process's direct children by name, so these read CPU, lanes, then GPUs.
CPU_GROUP = "CPU threads"
LANE_GROUP = "Comm lanes"


@dataclass(slots=True)
class Track:
    """A source thread or stream of one rank, written as one (merged) row."""

    name: str
    #: The group track it sits under (CPU_GROUP, "GPU 0", ...).
    group: str
    #: Explicit order within the group (lower first).
    order: int
    slices: list[Slice] = field(default_factory=list)
    instants: list[Instant] = field(default_factory=list)
    #: ``(name, args)`` of an instant the writer puts at the row's first slice
    #: (the row's kernel categories), or None.
    summary: Optional[tuple[str, dict]] = None


@dataclass(slots=True)
class RankTimeline:
    """Everything the writer needs to emit one rank's process."""

    rank: int
    process_name: str
    tracks: list[Track]
    labels: list[str] = field(default_factory=list)
    first_ns: Optional[int] = None
    #: Lane name -> debug annotations of the lane's kernel categories
    #: (:mod:`commtag.kernels`), for the lanes block.
    lane_kernels: dict[str, dict] = field(default_factory=dict)

