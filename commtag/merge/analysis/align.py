"""Clock alignment across hosts from collectives that end together.

Every rank's timestamps are CLOCK_REALTIME of its host, so ranks on one host
share a clock and hosts differ by their NTP/PTP error. A synchronizing
collective (all-reduce, all-gather, reduce-scatter, all-to-all, barrier)
cannot end on any member before the last member has joined, and its members
finish within a few microseconds of each other, so their end times are the
same instant seen through each clock. The offset of each clock (one per host
when hosts are known, else one per rank) is the median, over the matched
instances it takes part in, of (instance's median corrected end - own end),
iterated to a fixed point and pinned to 0 on the lowest rank's clock. The
residual is what remains of the end spread after correction.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from commtag.merge.records import CollectiveInstance, match_groups
from commtag.merge.inputs.selection import describe_numbers
from commtag.vocab import SYNCHRONIZING_FAMILIES, family

_ROUNDS = 30


@dataclass(slots=True)
class Alignment:
    """Per-rank clock offsets (ns, add to the rank's timestamps) and the residual error."""

    offsets: dict[int, int] = field(default_factory=dict)
    #: "host" (ranks of one host share an offset) or "rank".
    unit: str = "rank"
    matched: int = 0
    residual_median_ns: int = 0
    residual_max_ns: int = 0
    #: Distinct clocks among the ranks (hosts, or ranks when hosts are unknown).
    clocks: int = 0

    def describe(self) -> str:
        if self.clocks == 1 and self.unit == "host":
            return "--align collectives: every rank ran on one host (one clock); nothing to align"
        if not self.matched:
            return "--align collectives: no synchronizing collective matched across clocks; offsets left at 0"
        shifts = ", ".join(f"{who}: {shift}" for shift, who in self._ranks_by_shift())
        return (
            f"--align collectives: {self.matched} collectives, one offset per {self.unit}"
            f" ({shifts or 'all 0'}); residual end spread median {self.residual_median_ns / 1000:.1f} us,"
            f" max {self.residual_max_ns / 1000:.1f} us"
        )


    def _ranks_by_shift(self) -> list[tuple[str, str]]:
        """(shift as printed, the ranks it moved) per distinct non-zero shift, in rank order: a
        1,024-rank job on 128 hosts says 128 shifts, not 1,024."""
        ranks: dict[str, list[int]] = {}
        for rank, offset in sorted(self.offsets.items()):
            if offset:
                ranks.setdefault(f"{offset / 1000:+.1f} us", []).append(rank)
        return [(shift, (f"rank {members[0]}" if len(members) == 1 else f"ranks {describe_numbers(members)}"))
                for shift, members in ranks.items()]


def estimate_offsets(instances: Sequence[CollectiveInstance], hosts: Mapping[int, str]) -> Alignment:
    """Offsets that make matched synchronizing collectives end together."""
    ranks = sorted({i.rank for i in instances} | set(hosts))
    by_host = bool(ranks) and all(hosts.get(r) for r in ranks)
    unit_of = {r: (hosts[r] if by_host else str(r)) for r in ranks}
    synchronizing = [i for i in instances if family(i.collective) in SYNCHRONIZING_FAMILIES]
    matched = [g for g in match_groups(synchronizing) if len({unit_of[i.rank] for i in g}) > 1]
    alignment = Alignment(unit="host" if by_host else "rank", matched=len(matched),
                          clocks=len(set(unit_of.values())))
    if not matched:
        alignment.offsets = {r: 0 for r in ranks}
        return alignment
    offset = {u: 0.0 for u in unit_of.values()}
    ref = unit_of[ranks[0]]
    for _ in range(_ROUNDS):
        pulls: dict[str, list[float]] = {}
        for g in matched:
            center = statistics.median(i.end_ns + offset[unit_of[i.rank]] for i in g)
            for i in g:
                pulls.setdefault(unit_of[i.rank], []).append(center - i.end_ns)
        new = {u: statistics.median(p) if p else offset[u] for u, p in pulls.items()}
        shift = new.get(ref, 0.0)
        new = {u: v - shift for u, v in new.items()}
        converged = all(abs(new[u] - offset.get(u, 0.0)) < 1.0 for u in new)
        offset.update(new)
        if converged:
            break
    alignment.offsets = {r: round(offset[unit_of[r]]) for r in ranks}
    spreads = []
    for g in matched:
        ends = [i.end_ns + alignment.offsets[i.rank] for i in g]
        center = statistics.median(ends)
        spreads.append(max(abs(e - center) for e in ends))
    alignment.residual_median_ns = round(statistics.median(spreads))
    alignment.residual_max_ns = round(max(spreads))
    return alignment
