"""How the merged trace numbers its tracks, processes, sequences and flows.

Written once here because both sides read it: the attacher numbers the
flows it links Kineto events with, the writer numbers tracks and sequences,
and :mod:`commtag.merge.pftrace.readback` recognises a rank's process by its ids.
Every id is derived from a rank, so merge workers writing different ranks
never collide and their parts concatenate.

Track uuids interleave the bits of ``rank + 1`` and a per-rank ``local``
(see :func:`track_uuid`: event packets off their row's default track name
it, so small ids matter); rank blocks use locals below ``LANE_LOCAL``, the lanes block above
it. Flow ids carry their kind in the top bits (:func:`flow_id`). Rank blocks
are written on packet sequences and lanes on others, each shared by a block of
consecutive ranks (:func:`sequence_block`) and numbered after the first of
them written on it (:func:`rank_sequence_id`, :func:`lanes_sequence_id`); the
header has its own.
"""

from __future__ import annotations

HEADER_SEQ = 1
#: The rank blocks' sequences are RANK_SEQ_BASE + 2k, the lanes' the next (k: :func:`rank_sequence_id`).
RANK_SEQ_BASE = 2
#: Sequences started inside a block are numbered after their rank from here on, past every block's.
_INSIDE_BLOCK = 1 << 24
#: At most about this many sequences of each kind: ranks share them in blocks (:func:`sequence_block`).
SEQUENCE_BLOCKS = 64
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
    """A trace-unique flow id: 4 bits kind, 24 bits rank, 36 bits counter."""
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


def sequence_block(ranks: int) -> int:
    """How many consecutive rank numbers share a sequence in a merge of ``ranks`` ranks (rank r is in
    block r // this). Why blocks: a sequence's interning starts afresh, so its bytes do not depend on
    what else its writer wrote, and merge workers take whole blocks (:func:`commtag.merge.engine.hosts.chunks`):
    any number of them writes one process's bytes. Why not a sequence per rank: each interns the names
    and args its ranks repeat (a 1,024-rank job's world rank list alone is 5 kB), and the blocks depend
    on the ranks alone, never on the number of workers."""
    return max(1, -(-ranks // SEQUENCE_BLOCKS))


def rank_sequence_id(rank: int, block: int = 1) -> int:
    """The rank blocks' sequence a writer starts at ``rank`` (``block``: :func:`sequence_block`):
    numbered after the block where ``rank`` is its first (every packet names its sequence: the
    first 63 blocks' ids take one byte), else after ``rank``, where no other writer starts one."""
    return RANK_SEQ_BASE + 2 * (rank // block if rank % block == 0 else _INSIDE_BLOCK + rank)


def lanes_sequence_id(rank: int, block: int = 1) -> int:
    """The lanes' sequence a writer starts at ``rank``: the one after :func:`rank_sequence_id`'s."""
    return rank_sequence_id(rank, block) + 1


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
