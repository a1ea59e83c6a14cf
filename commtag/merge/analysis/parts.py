"""The analysis in parts: what a merge worker analysing some of the job's collectives needs to
know of the rest, in numbers, not records.

A merge worker of several (:mod:`commtag.merge.engine.shards`) matches and measures only the
collectives it owns, but two checks look past one collective: whether a member that lacks it
ran past its Seq, and the Seq gaps of a group. Both read each rank's Seqs of a group, which
:class:`SeqRuns` keeps as runs of consecutive Seqs (a few per rank, group and window) built by
the worker holding the rank (:func:`seq_runs`), so every worker can hold every rank's.
Once matched and checked, a member is only its times (:class:`Member`); the lead replays the
impact from every collective's member times, kept in columns as they arrive (:func:`timed`), and
lists the findings (:func:`lead_result`).
"""

from __future__ import annotations

import base64
import bisect
import sys
from array import array
from collections import defaultdict
from operator import attrgetter
from typing import NamedTuple, Optional, Sequence

from commtag.merge.analysis.alltoall import AllToAll
from commtag.merge.analysis.checks import gap_spans
from commtag.merge.analysis.columns import Columns
from commtag.merge.analysis.impact import impact
from commtag.merge.analysis.results import Analysis, Finding, FindingKind, MatchedCollective
from commtag.merge.records import CollectiveInstance, Coverage
from commtag.vocab import ANN_INFERRED, ANN_SEQ_FROM


class SeqRun(NamedTuple):
    """Consecutive Seqs one rank issued on one group (:func:`seq_issued`), with the windows they ran in."""

    pg_uid: str
    rank: int
    first: int
    last: int
    #: The windows the first and the last Seq ran in (None: outside every window).
    first_window: Optional[int]
    last_window: Optional[int]
    #: The first Seq's start and the last Seq's end (ns).
    start_ns: int
    end_ns: int


class SeqRef(NamedTuple):
    """What a Seq gap names of its group: its lane and members (its first instance's, in rank order)."""

    lane_name: str
    group_ranks: tuple[int, ...]


def seq_issued(inst: CollectiveInstance) -> bool:
    """Whether ``inst``'s Seq is one its backend issued in its window (the Seq checks' instances).

    A graph replay is not: it carries the Seq its call took at capture time, which was issued
    then, not in the window the replay ran in (between two captured calls, others may run outside
    any capture and any window). Nor is a Seq the merge numbered itself (a kernel that named none
    and no record claimed: ``"commtag seq from"``): it is no Seq the backend issued.
    """
    return not inst.is_p2p and inst.replay is None and inst.arg(ANN_SEQ_FROM) is None


def seq_runs(instances: Sequence[CollectiveInstance], coverage: Coverage) -> list[SeqRun]:
    """The runs of consecutive Seqs of ``instances`` (one rank's or several, in the order read),
    per group and rank; a Seq's first instance gives its times."""
    found: dict[tuple[str, int], dict[int, CollectiveInstance]] = defaultdict(dict)
    for inst in instances:
        if seq_issued(inst):
            found[(inst.pg_uid, inst.rank)].setdefault(inst.seq, inst)
    runs: list[SeqRun] = []
    for (pg, rank), seqs in found.items():
        run: Optional[list] = None
        for s, inst in sorted(seqs.items()):
            window = coverage.window_of(rank, inst.start_ns)
            if run is not None and s == run[3] + 1:
                run[3], run[5], run[7] = s, window, inst.end_ns
                continue
            if run is not None:
                runs.append(SeqRun(*run))
            run = [pg, rank, s, s, window, window, inst.start_ns, inst.end_ns]
        if run is not None:
            runs.append(SeqRun(*run))
    return runs


class SeqRuns:
    """Each rank's Seqs of each group as runs (:func:`seq_runs`, every worker's): what the checks
    read of them (:class:`commtag.merge.analysis.checks.Seqs`).

    ``refs``: each group's lane and members, from its first instance in rank order."""

    def __init__(self, runs: Sequence[SeqRun], refs: dict[str, SeqRef]) -> None:
        by_rank: dict[tuple[str, int], list[SeqRun]] = defaultdict(list)
        for run in sorted(runs, key=lambda run: run.rank):  # each group's ranks in rank order
            by_rank[(run.pg_uid, run.rank)].append(run)
        for listed in by_rank.values():
            listed.sort(key=lambda run: run.first)
        #: (pg, rank) -> its runs in Seq order.
        self.by_rank = dict(by_rank)
        #: (pg, rank) -> each run's first Seq, for bisecting.
        self._firsts = {key: [run.first for run in listed] for key, listed in self.by_rank.items()}
        self.groups = refs

    def _around(self, pg: str, rank: int, seq: int) -> tuple[Optional[SeqRun], Optional[SeqRun]]:
        """The run holding or last before ``seq``, and the first run after it."""
        firsts = self._firsts.get((pg, rank))
        if not firsts:
            return None, None
        at = bisect.bisect_right(firsts, seq) - 1
        runs = self.by_rank[(pg, rank)]
        return (runs[at] if at >= 0 else None), (runs[at + 1] if at + 1 < len(runs) else None)

    def recorded(self, pg: str, rank: int, seq: int) -> bool:
        before, _ = self._around(pg, rank, seq)
        return before is not None and before.first <= seq <= before.last

    def passed(self, pg: str, rank: int, seq: int) -> bool:
        """Whether ``rank`` recorded ``seq`` of ``pg``, or Seqs on both sides of it in one window."""
        before, after = self._around(pg, rank, seq)
        if before is not None and seq <= before.last:
            return True
        return before is not None and after is not None and before.last_window is not None \
            and before.last_window == after.first_window

    def holes(self) -> dict[tuple[str, int, int], dict[int, tuple[int, int]]]:
        """(pg, first, last Seq) -> rank -> (end of the Seq before, start of the Seq after): Seqs a rank
        skipped between two runs of one window (between windows nothing is known), as
        :func:`commtag.merge.analysis.checks.gap_spans` splits them."""
        gaps: dict[str, list[tuple[int, int, int, tuple[int, int]]]] = defaultdict(list)
        bounds: dict[str, set[int]] = defaultdict(set)
        for (pg, rank), runs in self.by_rank.items():
            bounds[pg].update(b for run in runs for b in (run.first, run.last + 1))
            for a, b in zip(runs, runs[1:]):
                if a.last_window is not None and a.last_window == b.first_window:
                    gaps[pg].append((a.last + 1, b.first - 1, rank, (a.end_ns, b.start_ns)))
        return gap_spans(gaps, bounds)


class Member:
    """A matched member once matched and checked: its times and the one arg later steps read
    (whether it was paired by order, for the straggler rule); its record stays with its holder."""

    __slots__ = ("start_ns", "end_ns", "inferred")

    def __init__(self, start_ns: int, end_ns: int, inferred: bool) -> None:
        self.start_ns, self.end_ns, self.inferred = start_ns, end_ns, inferred

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def arg(self, key: str, default: object = None) -> object:
        return self.inferred if key == ANN_INFERRED else default


def timed(rows: list, into: Columns) -> None:
    """Rows of :func:`timed_row` into the replay's columns as they arrive, each with its place in
    one process's order (:meth:`Columns.into_key_order` puts them in it)."""
    for key, collective, complete, last, first, lastst, ranks, starts, ends in rows:
        if ranks.__class__ is str:  # packed to travel (timed_row)
            ranks, starts, ends = _unpacked(ranks, "i"), _unpacked(starts, "q"), _unpacked(ends, "q")
        into.keyed(key, collective, complete, last, first, lastst, ranks, starts, ends)


_START, _END = attrgetter("start_ns"), attrgetter("end_ns")


def timed_row(key: list, m: MatchedCollective, travels: bool = True) -> list:
    """What the impact replay reads of a matched collective, as JSON (``key``: its place); the
    members' ranks and times packed (:func:`_packed`): decoded, a row of a 1,024-rank collective
    is a few strings, not 3,072 ints. A row that stays in its process (``travels`` False: a world
    of one) holds the arrays the packing would have carried, unpacked."""
    members = m.members.values()
    columns = (array("i", m.members), array("q", map(_START, members)), array("q", map(_END, members)))
    return [key, m.collective, m.complete, m.last_rank, m.first_start_ns, m.last_start_ns,
            *([_packed(words) for words in columns] if travels else columns)]


def _packed(words: array) -> str:
    """Integers as the base64 of their little-endian machine words."""
    if sys.byteorder == "big":
        words.byteswap()
    return base64.b64encode(words.tobytes()).decode("ascii")


def _unpacked(text: str, typecode: str) -> array:
    """The integers :func:`_packed` packed."""
    words = array(typecode, base64.b64decode(text))
    if sys.byteorder == "big":
        words.byteswap()
    return words


def lead_result(collectives: Columns, findings: list, unattached: list[Finding],
                coverage: Coverage, busbw: dict[str, list[tuple[int, float]]], all_to_all: list) -> Analysis:
    """The lead's analysis of the whole job: the findings in one process's order, the impact
    replay over every collective's member times (:func:`timed`), the busbw series and the
    all-to-all traffic (rows of a place and the fields of an
    :class:`commtag.merge.analysis.alltoall.AllToAll`, in one process's order); no matched
    collectives: those stayed with the workers that matched them."""
    collectives.into_key_order()
    replayed = impact(collectives, coverage)
    collectives.clear()
    findings.sort(key=lambda row: (row[0], row[1]))
    listed = [Finding(FindingKind(kind), pg, lane, seq, replay, p2p, tuple(ranks), tuple(fields), detail, desync)
              for _, _, (kind, pg, lane, seq, replay, p2p, ranks, fields, detail, desync) in findings]
    all_to_all.sort(key=lambda row: row[0])
    traffic = [AllToAll(pg, lane, seq, replay, collective, dtype, tuple(ranks), matrix, imbalance, why)
               for _, (pg, lane, seq, replay, collective, dtype, ranks, matrix, imbalance, why) in all_to_all]
    return Analysis([], listed + unattached, busbw, [], coverage, replayed, traffic)
