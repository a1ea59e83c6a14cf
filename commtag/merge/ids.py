"""How the merged trace numbers its tracks, processes, sequences and flows.

Written once here because both sides read it: the attacher numbers the
flows it links Kineto events with, the writer numbers tracks and sequences,
and :mod:`commtag.merge.pftrace.readback` recognises a rank's process by its ids.
Every id is derived from a rank, so merge workers writing different ranks
never collide and their parts concatenate.

Track uuids interleave the bits of ``rank + 1`` and a per-rank ``local``
(see :func:`track_uuid`: every event packet names its track, so small ids
matter); rank blocks use locals below ``LANE_LOCAL``, the lanes block above
it. Flow ids carry their kind in the top bits (:func:`flow_id`). A segment's
rank blocks are one packet sequence and its lanes block another, both
numbered after the segment's first rank (:func:`rank_sequence_id`,
:func:`lanes_sequence_id`; :mod:`commtag.merge.engine.segments`); the header has its own.
"""

from __future__ import annotations

HEADER_SEQ = 1
#: A worker whose chunk starts at rank r writes its rank blocks on sequence RANK_SEQ_BASE + 2r
#: and its lanes on the next.
RANK_SEQ_BASE = 16
LOCAL_BITS = 20
#: The first local id of the lanes block (rank blocks use those below).
LANE_LOCAL = 1 << (LOCAL_BITS - 1)
PID_BASE = 100_000
ROOT_UUID = 0

#: Flow kinds: a CPU launch to its GPU kernel, a source event to its lane slice, members of one collective.
FLOW_LAUNCH = 1
FLOW_SOURCE = 2
FLOW_CROSS_RANK = 3


def flow_id(kind: int, rank: int, counter: int) -> int:
    """A trace-unique flow id: 4 bits kind, 24 bits rank, 36 bits counter. Cross-rank flows, which
    link several ranks, put their lane's place in the lane order where the rank goes: each lane
    numbers its own (:func:`commtag.merge.pftrace.lanes.lane_flows`)."""
    return (kind << 60) | ((rank & 0xFFFFFF) << 36) | (counter & 0xFFFFFFFFF)


def track_uuid(rank: int, local: int) -> int:
    """The bits of ``rank + 1`` and ``local`` interleaved (a Morton code): unique per
    pair, and small where both are: the varint every event packet carries takes 2 bytes
    for the first 127 tracks of ranks 0 to 126 (``(rank + 1) << LOCAL_BITS`` took 4)."""
    if local >= 1 << LOCAL_BITS:
        raise ValueError(f"rank {rank} needs more than {1 << LOCAL_BITS} tracks")
    return _spread(rank + 1) | _spread(local) << 1


def _spread(n: int) -> int:
    """``n``'s bits at the even positions (bits beyond the 20th of ``rank + 1`` stay above
    every local's: the pairing stays one to one)."""
    out = 0
    for i in range(LOCAL_BITS):
        out |= ((n >> i) & 1) << (2 * i)
    return out | (n >> LOCAL_BITS) << (2 * LOCAL_BITS)


def group_uuid(order: int) -> int:
    """The track group of the process-group view at place ``order`` of the lane order: the
    locals of "rank -1", which no rank's tracks use (see :mod:`commtag.merge.pftrace.views`)."""
    return track_uuid(-1, order + 1)


def process_uuid(rank: int) -> int:
    return track_uuid(rank, 1)


def synthetic_pid(rank: int) -> int:
    """Every rank its own pid: trace_processor treats a repeated pid as pid reuse."""
    return PID_BASE + rank


def rank_sequence_id(first_rank: int) -> int:
    """The sequence of the rank blocks of the worker whose chunk starts at ``first_rank``."""
    return RANK_SEQ_BASE + 2 * first_rank


def lanes_sequence_id(first_rank: int) -> int:
    """The sequence of that worker's lanes block."""
    return RANK_SEQ_BASE + 2 * first_rank + 1


class LocalIds:
    """One rank's track uuids in creation order, from ``first`` up to (not including) ``limit``."""

    def __init__(self, rank: int, first: int, limit: int) -> None:
        self.rank = rank
        self.next = first
        self.limit = limit

    def __call__(self) -> int:
        if self.next >= self.limit:
            raise ValueError(f"rank {self.rank} needs more tracks than its block has ids for")
        uuid = track_uuid(self.rank, self.next)
        self.next += 1
        return uuid
