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
from typing import Mapping, Optional, Sequence

import orjson

from commtag.merge.records import ALIGNMENT_MARKER, CollectiveInstance, Coverage, Marker, match_groups
from commtag.merge.inputs.selection import describe_numbers
from commtag.vocab import ANN_ALIGNMENT, ANN_MARKER, SYNCHRONIZING_FAMILIES, family

#: What an unaligned merge can say of its clocks' error: each host's CLOCK_REALTIME as its NTP or
#: PTP daemon kept it, which nothing in the traces measures.
NOT_MEASURED = "not measured: each host's CLOCK_REALTIME as NTP/PTP kept it (--align collectives measures it)"
ONE_CLOCK = "none: every rank ran on one host, one clock"

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
    #: Each clock's median distance of its ends from their instances' median after correction (ns).
    residual_by_clock: dict[str, int] = field(default_factory=dict)

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
    by_clock: dict[str, list[float]] = {}
    for g in matched:
        center = statistics.median(i.end_ns + alignment.offsets[i.rank] for i in g)
        for i in g:
            by_clock.setdefault(unit_of[i.rank], []).append(abs(i.end_ns + alignment.offsets[i.rank] - center))
    alignment.residual_by_clock = {u: round(statistics.median(d)) for u, d in by_clock.items()}
    return alignment


def alignment_entry(alignment: Optional[Alignment], hosts: Mapping[int, str], ranks: Sequence[int]) -> dict:
    """How a merge's clocks were aligned, for the merged trace and the summary's JSON: the method
    ("collectives" or "none"), the reference clock (the lowest rank's), and per clock (a host, or a
    rank where some rank's host is unknown) its ranks, its offset and its residual (us; null where
    nothing measured it), with the uncertainty where no residual was measured."""
    ranks = sorted(ranks)
    by_host = bool(ranks) and all(hosts.get(r) for r in ranks)
    members: dict[str, list[int]] = {}
    for r in ranks:
        members.setdefault(hosts[r] if by_host else str(r), []).append(r)
    measured = alignment if alignment is not None and alignment.matched > 0 else None
    offsets = measured.offsets if measured else {}
    residuals = measured.residual_by_clock if measured else {}
    one_clock = len(members) == 1
    clocks = [{"clock": clock if by_host else f"rank {clock}", "ranks": rs,
               "offset_us": round(offsets.get(rs[0], 0) / 1000, 3),
               "residual_us": (round(residuals[clock] / 1000, 3) if clock in residuals
                               else 0.0 if one_clock else None)}
              for clock, rs in members.items()]
    return {
        "method": "collectives" if alignment is not None else "none",
        "unit": "host" if by_host else "rank",
        "reference": clocks[0]["clock"] if clocks else None,
        "matched": alignment.matched if alignment is not None else None,
        "residual_median_us": round(measured.residual_median_ns / 1000, 3) if measured else None,
        "residual_max_us": round(measured.residual_max_ns / 1000, 3) if measured else None,
        "uncertainty": ONE_CLOCK if one_clock else None if measured else NOT_MEASURED,
        "clocks": clocks,
    }


def with_clocks(covered: Coverage, alignment: Optional[Alignment]) -> Coverage:
    """``covered`` saying how its clocks were aligned (``alignment``: None where they were not)."""
    covered.alignment = alignment_entry(alignment, covered.hosts, covered.ranks)
    return covered


def alignment_marker(covered: Coverage) -> list[Marker]:
    """The merged trace's alignment entry, at the lowest rank's first event (none where not said)."""
    entry = covered.alignment
    if entry is None or not covered.firsts:
        return []
    rank = min(covered.firsts)
    said = entry["uncertainty"] or f"residual median {entry['residual_median_us']} us"
    name = f"clock alignment: {entry['method']}, {len(entry['clocks'])} clock(s), {said}"
    return [Marker(rank, covered.firsts[rank], name,
                   {ANN_MARKER: ALIGNMENT_MARKER, ANN_ALIGNMENT: orjson.dumps(entry).decode()})]
