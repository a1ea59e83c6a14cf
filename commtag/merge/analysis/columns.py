"""The matched collectives as the impact replay reads them, in flat columns.

The replay (:mod:`commtag.merge.analysis.impact`) reads of each collective its op, whether it is
complete, its last arrival and first and last start, and of each member its rank, start and end.
Kept as a Python object per member those are the replay's memory peak in a job of a thousand
ranks (a quarter of a million members), so they are kept here as machine integers: per collective
one entry, and per member one entry of flat arrays, each collective's members together and
latest-first (the stable order of their recorded starts, latest first, over the order given).
"""

from __future__ import annotations

from array import array
from typing import Container, Optional, Protocol, Sequence

#: ``last_rank`` of a collective without a last arrival (incomplete).
NO_RANK = -1


class MatchedCollective(Protocol):
    """What the replay reads of a matched collective (:class:`commtag.merge.analysis.results.MatchedCollective`)."""

    collective: str
    members: dict
    last_rank: Optional[int]
    first_start_ns: int
    last_start_ns: int

    @property
    def complete(self) -> bool: ...


class Columns:
    """Collectives in the order added, each with its members at ``offset[k]:offset[k + 1]`` of
    ``start``, ``end`` and ``rank``, latest-first."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """No collective (what :meth:`__init__` starts from)."""
        self.op: list[str] = []
        self.complete = bytearray()
        self.last_rank = array("i")
        self.first_start = array("q")
        self.last_start = array("q")
        self.offset = array("q", [0])
        self.start = array("q")
        self.end = array("q")
        self.rank = array("i")
        #: Per collective, its place in one process's order (:meth:`keyed`), until :meth:`into_key_order`.
        self._keys: list = []

    def __len__(self) -> int:
        return len(self.op)

    @classmethod
    def of(cls, collectives: Sequence[MatchedCollective]) -> "Columns":
        """The columns of matched collectives, members in their ``members`` order before sorting."""
        out = cls()
        for m in collectives:
            ranks = list(m.members)
            out.add(m.collective, m.complete, m.last_rank, m.first_start_ns, m.last_start_ns, ranks,
                    [m.members[r].start_ns for r in ranks], [m.members[r].end_ns for r in ranks])
        return out

    def add(self, op: str, complete: bool, last_rank: Optional[int], first_start_ns: int, last_start_ns: int,
            ranks: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> None:
        """One collective, its members given as three equal-length sequences."""
        # Latest first, ties as given (a reversed sort keeps equal keys in their order).
        order = sorted(range(len(ranks)), key=starts.__getitem__, reverse=True) if len(ranks) > 1 else range(len(ranks))
        self.op.append(op)
        self.complete.append(bool(complete))
        self.last_rank.append(NO_RANK if last_rank is None else last_rank)
        self.first_start.append(first_start_ns)
        self.last_start.append(last_start_ns)
        self.start.extend(map(starts.__getitem__, order))
        self.end.extend(map(ends.__getitem__, order))
        self.rank.extend(map(ranks.__getitem__, order))
        self.offset.append(len(self.start))

    def keyed(self, key: list, *collective: object) -> None:
        """:meth:`add` with the collective's place in one process's order, for :meth:`into_key_order`."""
        self._keys.append(key)
        self.add(*collective)  # type: ignore[arg-type]

    def into_key_order(self) -> None:
        """Put the collectives added by :meth:`keyed` in the order of their keys, a column at a time
        (the members' columns are the size that matters: one is copied at once)."""
        order = sorted(range(len(self._keys)), key=self._keys.__getitem__)
        self._keys = []
        if order == list(range(len(order))):  # added in order (one worker's rows): nothing to move
            return
        offset = self.offset
        for name in ("start", "end", "rank"):
            old: array = getattr(self, name)
            new = array(old.typecode)
            for k in order:
                new.extend(old[offset[k]:offset[k + 1]])
            setattr(self, name, new)
            del old
        self.offset = array("q", [0])
        for k in order:
            self.offset.append(self.offset[-1] + offset[k + 1] - offset[k])
        self.op = [self.op[k] for k in order]
        self.complete = bytearray(self.complete[k] for k in order)
        for name in ("last_rank", "first_start", "last_start"):
            old = getattr(self, name)
            setattr(self, name, array(old.typecode, (old[k] for k in order)))

    def members(self, k: int) -> range:
        """Collective ``k``'s members (indexes into ``start``, ``end``, ``rank``), latest-first."""
        return range(self.offset[k], self.offset[k + 1])

    def first_arrival(self, k: int, among: Optional[Container[int]] = None) -> tuple[int, Optional[int]]:
        """Collective ``k``'s earliest (start, rank) of its members (of those ``among``, when given;
        ``(0, None)`` when none is)."""
        start, rank = self.start, self.rank
        best: tuple[int, Optional[int]] = (0, None)
        for n in self.members(k):
            if among is not None and rank[n] not in among:
                continue
            if best[1] is None or (start[n], rank[n]) < best:
                best = (start[n], rank[n])
        return best
