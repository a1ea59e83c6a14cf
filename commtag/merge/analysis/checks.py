"""The desync checks: what the ranks of one matched collective disagree on, and the Seq gaps of a group."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Callable, Iterable, Mapping, Protocol

from commtag.merge.records import (
    CollectiveInstance,
    Coverage,
)
from commtag.identity import describe_ranks
from commtag.merge.batches import is_batch, mismatches
from commtag.vocab import (
    COLLECTIVES, COLLECTIVE_NAME_KEY,
    DTYPE_KEY, GROUP_SIZE_KEY, IN_NELEMS_KEY, IN_SPLIT_KEY, OUT_NELEMS_KEY, OUT_SPLIT_KEY, P2P_COLLECTIVES, RECV, SEND, SEQ_KEY,
)
from commtag.merge.analysis.results import Finding, FindingKind, MatchedCollective


class SeqGroup(Protocol):
    """What the Seq gap check names a group by."""

    @property
    def lane_name(self) -> str: ...

    @property
    def group_ranks(self) -> tuple[int, ...]: ...


class Seqs(Protocol):
    """What the checks read of every rank's Seqs: the runs merge workers share
    (:class:`commtag.merge.analysis.parts.SeqRuns`)."""

    @property
    def groups(self) -> Mapping[str, SeqGroup]: ...

    @property
    def by_rank(self) -> Mapping[tuple[str, int], object]: ...

    def recorded(self, pg: str, rank: int, seq: int) -> bool: ...

    def passed(self, pg: str, rank: int, seq: int) -> bool: ...

    def holes(self) -> dict[tuple[str, int, int], dict[int, tuple[int, int]]]: ...


def gap_spans(gaps: dict[str, list[tuple[int, int, int, tuple[int, int]]]],
              runs: dict[str, set[int]]) -> dict[tuple[str, int, int], dict[int, tuple[int, int]]]:
    """Each group's gaps, ``(first, last, rank, times)``, as spans of Seqs ``(pg, first, last)``
    over which every rank is alike: the same ranks skipped them, and each other rank recorded all
    of them or none (``runs``: the Seqs where a rank's run of consecutive Seqs starts, or ends +1).
    So a gap of a million Seqs is a span, not a million entries, and each span is checked once."""
    out: dict[tuple[str, int, int], dict[int, tuple[int, int]]] = defaultdict(dict)
    for pg, listed in gaps.items():
        cuts = sorted({b for first, last, _, _ in listed for b in (first, last + 1)} | runs.get(pg, set()))
        for first, last, rank, times in listed:
            at = bisect.bisect_left(cuts, first)
            while cuts[at] <= last:
                out[(pg, cuts[at], cuts[at + 1] - 1)][rank] = times
                at += 1
    return out


def check(m: MatchedCollective) -> list[Finding]:
    """The Flight Recorder checks on one matched instance."""
    found: list[Finding] = []

    def add(kind: FindingKind, ranks: Iterable[int], fields: tuple[str, ...], detail: str) -> None:
        found.append(
            Finding(kind, m.pg_uid, m.lane_name, m.seq, m.replay, m.is_p2p, tuple(sorted(ranks)), fields, detail)
        )

    if m.blamed_ranks:
        add(FindingKind.MISSING_RANKS, m.blamed_ranks, (), f"{m.collective} ran on ranks {list(m.ranks)} only")
    insts = list(m.members.values())
    if m.is_p2p:
        _check_p2p(insts, add)
        return found
    row = COLLECTIVES.get(m.collective)
    if len(insts) > 1:  # a lone member disagrees with no other
        for kind, key, attr in ((FindingKind.OP_MISMATCH, COLLECTIVE_NAME_KEY, "collective"),
                                (FindingKind.DTYPE_MISMATCH, DTYPE_KEY, "dtype")):
            odd, detail = _odd_ones(insts, lambda i: getattr(i, attr))
            if odd:
                add(kind, odd, (key,), detail)
        odd, detail = _odd_ones(insts, lambda i: i.group_size)
        if odd:  # one group, sized differently: its bus bandwidth is not measured (analyze.measure)
            add(FindingKind.SIZE_MISMATCH, odd, (GROUP_SIZE_KEY,), f"{GROUP_SIZE_KEY}: {detail}")
        if any(f.kind == FindingKind.OP_MISMATCH for f in found):
            return found  # sizes of different ops are not comparable
        checked = [(key, attr) for key, attr, equal in (
            (IN_NELEMS_KEY, "in_nelems", row.equal_in if row else True),
            (OUT_NELEMS_KEY, "out_nelems", row.equal_out if row else True),
        ) if equal]
        differing = [(key, attr) for key, attr in checked if len({getattr(i, attr) for i in insts}) > 1]
        if differing:
            odd, detail = _odd_ones(insts, lambda i: _show(getattr(i, attr) for _, attr in differing))
            add(FindingKind.SIZE_MISMATCH, odd, tuple(key for key, _ in differing), detail)
    shape = row.shape if row else None
    n = m.group_size
    for inst in insts if shape == "out = in x n" or shape == "in = out x n" else ():
        if shape == "out = in x n" and inst.out_nelems != inst.in_nelems * n:
            add(FindingKind.SIZE_MISMATCH, [inst.rank], (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"rank {inst.rank} gathers {inst.in_nelems} x {n} ranks into {inst.out_nelems}")
        if shape == "in = out x n" and inst.in_nelems != inst.out_nelems * n:
            add(FindingKind.SIZE_MISMATCH, [inst.rank], (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"rank {inst.rank} scatters {inst.in_nelems} over {n} ranks into {inst.out_nelems}")
    if shape == "sum in = sum out" and not m.missing_ranks:
        total_in, total_out = sum(i.in_nelems for i in insts), sum(i.out_nelems for i in insts)
        if total_in != total_out:
            add(FindingKind.SIZE_MISMATCH, m.ranks, (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"ranks send {total_in} elements in total but receive {total_out}")
    return found


def _check_p2p(insts: list[CollectiveInstance], add: Callable[..., None]) -> None:
    if insts and is_batch(insts[0]):  # nccl2's batches: each rank's sends are its peers' receives
        for pair, detail in mismatches(insts):
            add(FindingKind.SIZE_MISMATCH, pair, (IN_SPLIT_KEY, OUT_SPLIT_KEY), detail)
        return
    if any(i.collective not in P2P_COLLECTIVES for i in insts):
        return  # e.g. NCCL SendRecv kernels without metadata: both ends send and receive
    sends = [i for i in insts if i.collective == SEND]
    recvs = [i for i in insts if i.collective == RECV]
    if len(insts) == 2 and (len(sends), len(recvs)) != (1, 1):
        add(FindingKind.OP_MISMATCH, [i.rank for i in insts], (COLLECTIVE_NAME_KEY,),
            f"expected a send and a recv, found {sorted(i.collective for i in insts)}")
        return
    if len(sends) == 1 and len(recvs) == 1:
        s, r = sends[0], recvs[0]
        if s.dtype != r.dtype:
            add(FindingKind.DTYPE_MISMATCH, [s.rank, r.rank], (DTYPE_KEY,), f"send is {s.dtype}, recv is {r.dtype}")
        if s.in_nelems != r.out_nelems:
            add(FindingKind.SIZE_MISMATCH, [s.rank, r.rank], (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"rank {s.rank} sends {s.in_nelems} elements, rank {r.rank} receives {r.out_nelems}")


def _show(values: Iterable[object]) -> str:
    """One value as is, several as 'a/b' (In/Out msg nelems)."""
    return "/".join(str(v) for v in values)


def _odd_ones(insts: list[CollectiveInstance], value: Callable[[CollectiveInstance], object]) -> tuple[list[int], str]:
    """Ranks whose value differs from the most common one, and a detail line."""
    by_value: dict[object, list[int]] = defaultdict(list)
    for inst in insts:
        by_value[value(inst)].append(inst.rank)
    if len(by_value) < 2:
        return [], ""
    # The majority is taken as right; on a tie, the value of the lowest rank.
    common = max(by_value, key=lambda v: (len(by_value[v]), -min(by_value[v])))
    odd = sorted(r for v, ranks in by_value.items() if v != common for r in ranks)
    detail = "; ".join(f"{v!s} on ranks {sorted(r)}" for v, r in sorted(by_value.items(), key=lambda kv: min(kv[1])))
    return odd, detail


def seq_gaps(seqs: Seqs, coverage: Coverage) -> list[Finding]:
    """Seq numbers a rank skipped inside one of its windows, where every member was profiled."""
    found = []
    for (pg, s, last), gapped in sorted(seqs.holes().items()):
        ref = seqs.groups[pg]
        members = (set(ref.group_ranks) or {r for (p, r) in seqs.by_rank if p == pg}) & set(coverage.windows)
        start, end = next(iter(gapped.values()))
        if not all(r in gapped or seqs.passed(pg, r, s) or coverage.covers(r, start, end) for r in members):
            continue  # some member was not profiled then: nothing to compare with
        shared = not any(seqs.recorded(pg, r, s) for r in members)
        ranks = tuple(sorted(gapped))
        which = f"Seq {s}" if last == s else f"Seqs {s} to {last} ({last - s + 1})"
        detail = (
            f"no rank recorded {which} (issued where commtag could not see it?)"
            if shared
            else f"{which} missing on {describe_ranks(ranks)} between their neighbouring Seqs"
        )
        found.append(Finding(FindingKind.SEQ_GAP, pg, ref.lane_name, s, None, False, ranks, (SEQ_KEY,), detail, desync=not shared))
    return found
