"""What the converter hands the Perfetto writer: one rank's tracks of slices.

Neutral types, so that the converter knows Kineto but not Perfetto and the
writer knows Perfetto but not Kineto: an event's payload is opaque bytes the
writer's encoder made while the events were read.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Optional

class Row:
    """One source row's events, packed: times in arrays, payloads in one buffer.

    Why packed: a rank has hundreds of thousands of events; as one tuple,
    two ints and a bytes object each they cost several times their payload,
    and, allocated between the parsed batches' short-lived dicts, they keep
    the allocator from returning that memory. Here a row is a handful of
    objects whatever its length. ``extra`` holds bytes appended to some
    payloads after the fact (attached events, flows, breakdowns): the
    payload's fields may come in any order, so appending is enough.
    """

    __slots__ = ("starts", "ends", "offsets", "data", "extra")

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.offsets = array("q", [0])
        self.data = bytearray()
        self.extra: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, start: int, end: int, payload: bytes) -> None:
        self.starts.append(start)
        self.ends.append(end)
        self.data += payload
        self.offsets.append(len(self.data))

    def payload(self, k: int) -> bytes | bytearray:
        offsets = self.offsets
        more = self.extra.get(k)
        return self.data[offsets[k]:offsets[k + 1]] + more if more else self.data[offsets[k]:offsets[k + 1]]

    def append_to(self, k: int, more: bytes) -> None:
        """Add ``more`` to the payload of event ``k``."""
        self.extra[k] = self.extra.get(k, b"") + more

    def shift(self, first: int, delta: int) -> None:
        """Move the times of events ``first..`` by ``delta`` ns."""
        for k in range(first, len(self.starts)):
            self.starts[k] += delta
            self.ends[k] += delta

    def in_start_order(self) -> list[int]:
        """Indices by start, longer first at equal starts (an outer BEGIN before an inner one)."""
        order = sorted(range(len(self.starts)), key=self.ends.__getitem__, reverse=True)
        order.sort(key=self.starts.__getitem__)
        return order


#: The track group of a rank's CPU threads, directly under its process. Perfetto orders a
#: process's direct children by name: CPU threads, then GPUs, then commtag's markers.
#: (The process-group lanes are not in the process: see commtag.merge.pftrace.views.)
CPU_GROUP = "CPU threads"


@dataclass(slots=True)
class Track:
    """A source thread or stream of one rank, written as one (merged) row."""

    name: str
    #: The group track it sits under (CPU_GROUP, "GPU 0", ...).
    group: str
    #: Explicit order within the group (lower first).
    order: int
    #: Slices: (start, end, payload); the payload holds name, category, args
    #: and flows, encoded (commtag.merge.pftrace.sequence.SequenceWriter.body).
    slices: Row = field(default_factory=Row)
    #: Instants: start == end.
    instants: Row = field(default_factory=Row)
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

