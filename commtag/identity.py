"""Process-group identity: the formulas the runtime and the merge must share.

The runtime names a group's lane when it records; the merge rebuilds the same
identity from a trace's ``pg_config`` when a rank has no sidecar. Both import
these functions (and nothing here imports torch), so the two can never drift
apart and a group's lane is the same whichever side named it.

Everything here depends only on what every member rank agrees on: the group
name (its rendezvous store is prefixed with it) and the ordered global ranks.

**uid** = ``"<group_name>:<first 12 hex of sha1('_'.join(ranks))>"``, the
name plus a hash of the ranks as Flight Recorder identifies groups; from the
second life of the world on (``destroy_process_group()`` then
``init_process_group()`` again, see :mod:`commtag.runtime.describe.groups`) it ends in
``"~<generation>"``: torch gives the new groups the old names again and their
Seq restarts at 1, so without it calls of different lives would pair up.

**lane id** = ``60 + int(sha1(uid)[:8], 16) % 2**24``: a stable hash of the
uid, at or above 60 like PyTorch's own per-group lanes. Collisions are
possible in principle (about n^2 / 2^25 for n groups); the merger detects them.

**lane name** = ``"PG <name> (<desc>) <ranks>"``, plus ``" gen <generation>"``
from the second life on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from commtag.constants import MIN_LANE_ID

LANE_SPAN = 2**24
#: The profiler lists at most this many entries (ranks, split sizes) in full.
MAX_LIST_ENTRIES = 30

#: The lane of NCCL kernels with no metadata at all (old traces): its group is unknown, so it is named
#: here, beside every group's lane name, and numbered above every group's lane id.
UNATTRIBUTED_UID = "unattributed"
UNATTRIBUTED_LANE = "NCCL kernels (no metadata)"
UNATTRIBUTED_LANE_ID = MIN_LANE_ID + (1 << 30)


def format_list(values: Sequence[int]) -> str:
    """The profiler's list string: ``"[1, 2]"``; beyond 30 entries the first 29, ``...``, the last."""
    if len(values) > MAX_LIST_ENTRIES:
        values_text = [str(v) for v in values[: MAX_LIST_ENTRIES - 1]] + ["...", str(values[-1])]
    else:
        values_text = [str(v) for v in values]
    return "[" + ", ".join(values_text) + "]"


def group_uid(name: str, ranks: Sequence[int], generation: int = 0) -> str:
    """Rank-independent identity of a group in its life of the world (see module docstring)."""
    digest = hashlib.sha1("_".join(map(str, ranks)).encode(), usedforsecurity=False).hexdigest()
    return f"{name}:{digest[:12]}" + (f"~{generation}" if generation else "")


def lane_id(uid: str) -> int:
    """Virtual lane id of a group: a stable hash of its uid, >= 60."""
    digest = hashlib.sha1(uid.encode(), usedforsecurity=False).hexdigest()
    return MIN_LANE_ID + int(digest[:8], 16) % LANE_SPAN


def lane_name(name: str, desc: str, ranks: Sequence[int], generation: int = 0) -> str:
    """Name of a group's virtual lane, the same on every member rank."""
    return f"PG {name} ({desc}) {format_list(ranks)}" + (f" gen {generation}" if generation else "")


@dataclass(frozen=True)
class GroupRow:
    """A process-group table row as the merge uses it: the fields of
    :class:`commtag.schema.ProcessGroupInfo`, but a plain dataclass so a merge of
    traces without sidecars never imports pydantic.

    Not validated: the merge rebuilds groups from traces whose rank list may
    be unknown (``"[]"`` for a group that is not an arithmetic progression, or of one rank),
    and an empty list must still name a lane rather than fail the merge.
    """

    uid: str
    name: str
    desc: str
    ranks: list[int]
    backend: str
    lane_id: int
    lane_name: str


def group_info(name: str, desc: str, ranks: Sequence[int], backend: str) -> GroupRow:
    """A group's whole identity as a process-group table row."""
    uid = group_uid(name, ranks)
    return GroupRow(uid=uid, name=name, desc=desc, ranks=list(ranks), backend=backend,
                    lane_id=lane_id(uid), lane_name=lane_name(name, desc, ranks))


def describe_ranks(ranks: Sequence[int]) -> str:
    """Ranks as short runs, 'rank 3' or 'ranks 0-2, 5'."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    start = prev = None
    for r in [*ordered, None]:
        if r is not None and prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(runs)
