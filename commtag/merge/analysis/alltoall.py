"""All-to-all traffic: who sent whom how much, per all_to_all(v) instance (MoE dispatch/combine).

Read from each member's ``"In split size"``, in the eager format
(docs/eager-metadata.md): all_to_all_single's dim-0 split
list (``"[]"``: an even split), all_to_all's per-tensor element counts. A row
of a split list holds ``In msg nelems / sum(splits)`` elements, so a split of
``k`` rows sends ``k`` times that. ``matrix[i][j]`` is what the group's i-th
rank sent its j-th (group-rank order; ``ranks`` names their global ranks);
``size_imbalance`` is the busiest sender's bytes over the mean sender's.

Where the splits are not recorded the matrix is None and ``not_recorded``
says why, never a guess: nccl2's all_to_all_v_single records only the totals, a call only
c10d's hook saw carries ``"commtag splits": "not recorded"``,
the eager format cuts a list of more than 30 entries, a member rank has no
record of the instance, or its counts do not divide into whole rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from commtag.merge.records import CollectiveInstance
from commtag.vocab import (
    ALL_TO_ALL_NAMES, ANN_SPLITS, COLLECTIVE_NAME_KEY, IN_SPLIT_KEY, NCCL2_ALLTOALL_EVEN, NCCL2_ALLTOALL_SPLIT,
    SCALAR_TYPE_BYTES, SPLITS_NOT_RECORDED,
)

#: Every collective name whose instances are listed (their traffic known or not).
TRAFFIC_NAMES = ALL_TO_ALL_NAMES | {NCCL2_ALLTOALL_EVEN, NCCL2_ALLTOALL_SPLIT}


class Matched(Protocol):
    """What this module reads of a matched collective (:class:`commtag.merge.analysis.results.MatchedCollective`)."""

    pg_uid: str
    lane_name: str
    seq: int
    replay: Optional[int]
    collective: str
    dtype: str
    group_size: int
    members: dict[int, CollectiveInstance]


@dataclass(slots=True)
class AllToAll:
    """One all-to-all instance's rank-pair traffic."""

    pg_uid: str
    lane_name: str
    seq: int
    replay: Optional[int]
    collective: str
    dtype: str
    #: Global ranks in group-rank order: the matrix's rows and columns.
    ranks: tuple[int, ...]
    #: Elements the i-th rank sent the j-th; None when not recorded.
    matrix: Optional[list[list[int]]]
    #: Max over senders of bytes sent / their mean; None when not recorded (or nothing sent).
    size_imbalance: Optional[float]
    #: Why the matrix is None ("" when it is known).
    not_recorded: str = ""

    @property
    def sent_elements(self) -> Optional[list[int]]:
        return [sum(row) for row in self.matrix] if self.matrix is not None else None

    def to_dict(self) -> dict[str, object]:
        size = SCALAR_TYPE_BYTES.get(self.dtype)
        sent = self.sent_elements
        return {
            "pg": self.pg_uid,
            "lane": self.lane_name,
            "seq": self.seq,
            "replay": self.replay,
            "collective": self.collective,
            "dtype": self.dtype,
            "ranks": list(self.ranks),
            "size_imbalance": self.size_imbalance,
            "matrix": self.matrix,
            "sent_bytes": [n * size for n in sent] if sent is not None and size is not None else None,
            "not_recorded": self.not_recorded or None,
        }


def traffic(collectives: list[Matched]) -> list[AllToAll]:
    """Every all-to-all instance's matrix, in the order of ``collectives``."""
    return [_one(m) for m in collectives if m.collective in TRAFFIC_NAMES]


def _one(m: Matched) -> AllToAll:
    first = next(iter(m.members.values()))
    ranks = first.group_ranks or tuple(sorted(m.members))
    rows: list[list[int]] = []
    why = ""
    for rank in ranks:
        inst = m.members.get(rank)
        row, why = (None, f"rank {rank} has no record of it") if inst is None else _row(inst, len(ranks))
        if row is None:
            break
        rows.append(row)
    matrix = rows if len(rows) == len(ranks) and not why else None
    return AllToAll(m.pg_uid, m.lane_name, m.seq, m.replay, m.collective, m.dtype, tuple(ranks), matrix,
                    imbalance([sum(r) for r in matrix]) if matrix is not None else None, why)


def _row(inst: CollectiveInstance, n: int) -> tuple[Optional[list[int]], str]:
    """What one rank sent each peer, or None and why it is not known."""
    own = inst.arg(COLLECTIVE_NAME_KEY)  # the backend's own name (an nccl2 slice keeps it)
    name = own if isinstance(own, str) else inst.collective
    if inst.arg(ANN_SPLITS) == SPLITS_NOT_RECORDED:
        return None, f"rank {inst.rank}'s split sizes were not recorded (a call only c10d's hook saw)"
    if name == NCCL2_ALLTOALL_SPLIT:
        return None, f"nccl2's {NCCL2_ALLTOALL_SPLIT} records only the totals, not the split sizes"
    text = inst.arg(IN_SPLIT_KEY)
    if not isinstance(text, str):
        return None, f"rank {inst.rank} recorded no {IN_SPLIT_KEY!r}"
    if "..." in text:
        return None, f"rank {inst.rank}'s {IN_SPLIT_KEY!r} is cut short (more than 30 entries)"
    try:
        splits = [int(part) for part in text.strip("[]").split(",") if part.strip()]
    except ValueError:
        return None, f"rank {inst.rank}'s {IN_SPLIT_KEY!r} is not a list of counts: {text!r}"
    even = not splits if name != NCCL2_ALLTOALL_EVEN else len(splits) <= 1
    if even:
        if name == "all_to_all" or inst.in_nelems % n:
            return None, f"rank {inst.rank} sent {inst.in_nelems} elements with no split sizes"
        return [inst.in_nelems // n] * n, ""
    if len(splits) != n:
        return None, f"rank {inst.rank}'s {IN_SPLIT_KEY!r} has {len(splits)} entries for {n} ranks"
    total = sum(splits)
    if total == 0:
        return [0] * n, ""
    if inst.in_nelems % total:
        return None, f"rank {inst.rank} sent {inst.in_nelems} elements, not whole rows of its splits {text}"
    per_row = inst.in_nelems // total
    return [s * per_row for s in splits], ""


def imbalance(sent: list[int]) -> Optional[float]:
    """Max over senders of what each sent / their mean (None when nothing was sent)."""
    mean = sum(sent) / len(sent) if sent else 0
    return round(max(sent) / mean, 6) if mean > 0 else None


@dataclass(slots=True)
class GroupTraffic:
    """One group's all-to-all instances in the text summary."""

    pg_uid: str
    lane_name: str
    count: int
    #: Instances whose matrix is known.
    recorded: int
    worst: Optional[AllToAll]
    p50_imbalance: Optional[float]


def by_group(items: list[AllToAll]) -> list[GroupTraffic]:
    """Per group: how many instances, how many with known traffic, the worst and the median imbalance."""
    groups: dict[str, list[AllToAll]] = {}
    for item in items:
        groups.setdefault(item.pg_uid, []).append(item)
    out = []
    for pg, members in groups.items():
        # (imbalance, instance) of the instances with one, by imbalance.
        known = sorted(((a.size_imbalance, a) for a in members if a.size_imbalance is not None), key=lambda k: k[0])
        middle = None
        if known:
            half = len(known) // 2
            middle = known[half][0] if len(known) % 2 else round((known[half - 1][0] + known[half][0]) / 2, 6)
        out.append(GroupTraffic(pg, members[0].lane_name, len(members), sum(1 for a in members if a.matrix is not None),
                                known[-1][1] if known else None, middle))
    return out
