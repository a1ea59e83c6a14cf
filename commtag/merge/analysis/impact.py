"""What each late rank cost the job: a what-if replay of the matched collectives.

A straggler finding says who arrived last; this says how much sooner the
profiled window would have ended had that rank not been late. The replay
keeps every recorded time and moves only what depends on the removed lateness:

* a rank's work is one sequence of its collective instances; an instance
  depends on the rank's latest instance that ended at or before it started
  in the same profiled window (what the rank did in between, compute or idle,
  keeps its length and moves with it; between windows nothing was recorded,
  so a window's first instances keep their recorded arrivals). The streams
  and threads of a rank are not told apart (its instances do not carry them):
  work that overlapped an instance never waits for it, but an instance on one
  stream follows the latest one that ended before it on any;
* a complete collective ends, on each member, at its last member's arrival
  plus that member's own recorded time after the last arrival (the transfer);
* removing rank ``r``'s lateness: wherever ``r`` arrived last, it arrives
  instead as early as the next-latest member did (its lead over the others,
  measured in the recorded times, is cut from the time before its arrival),
  but never before its own previous instance ends: only the time it spent
  between the two can be cut (a rank whose previous transfer ran long is
  late by that much still, and a later step is not charged what this one
  could not remove).
  As for a straggler finding, a lead counts only where the late rank's own
  trace covers it: a rank whose profiler started later arrives late to its
  first collective without having made anyone wait in the job.

Without any change the replay reproduces the recorded times exactly, so a cost
is a difference of two replays of the same model. An incomplete instance (a
member did not record it) has no last arrival to move: it keeps its members'
own times, moved with each member's earlier work. A profiled window is a
trace file of each rank: its cost is how much earlier the last collective
that began in it would have ended, and a rank's cost is the sum over the
windows.

Where the traces hold ``ProfilerStep#N`` spans (a profiler schedule), each
collective belongs to the step its first arrival lies in, on the first
arriving member whose steps are known (a step reaches to the next one's
start, as ``--steps`` cuts them), and each step gets its part of the
window's cost: how much earlier its last collective would have ended, less
how much earlier the step before it in the window ended. A step's cost is
thus the time the lateness added to that step alone (a step after a late
one is not charged again for it), and a window's steps sum to its cost; a
step can be negative where its end was set by work the lateness did not hold
up, which then gives back what an earlier step was charged.

Each rank that was the last arrival somewhere is replayed once for the
window, and once per op it was late to (the window's cost per op type): a
rank's cost is at most the sum of its leads, so the ranks are replayed in
that order and at most :data:`MAX_REPLAYED_RANKS` of them.
"""

from __future__ import annotations

import bisect
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from commtag.merge.analysis.columns import NO_RANK, Columns, MatchedCollective
from commtag.merge.records import CounterSeries, Coverage
from commtag.merge.steps import StepIndex

#: The ranks with the largest total lead are replayed; the rest are counted, not replayed.
MAX_REPLAYED_RANKS = 16


@dataclass(slots=True)
class StepCost:
    """One profiler step's part of a rank's cost (module docstring)."""

    window: int
    step: int
    #: How much earlier its last collective would have ended, less the step before it's (us).
    cost_us: float
    #: ``cost_us`` over the step's collective time: its first arrival to its last collective's end.
    share: float
    #: That collective time (recorded ns): where the merged trace's per-step track shows the cost.
    start_ns: int = 0
    end_ns: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"window": self.window, "step": self.step, "cost_us": self.cost_us, "share": self.share}


@dataclass(slots=True)
class RankImpact:
    """How much earlier the profiled windows would have ended without one rank's lateness."""

    rank: int
    #: Summed over the profiled windows: how much earlier each ends without its lateness (us).
    cost_us: float
    #: ``cost_us`` over the profiled time (:attr:`Impact.profiled_ns`).
    share: float
    #: The lateness removed: its summed lead over the next-latest member where it arrived last (us).
    late_us: float
    #: Instances it arrived last to with a lead.
    late_count: int
    #: Op -> the cost of only its lateness at that op (us).
    by_op: dict[str, float] = field(default_factory=dict)
    #: Profiled window (1-based, as the trace's window markers) -> how much earlier its last collective
    #: would have ended (us).
    by_window: dict[int, float] = field(default_factory=dict)
    #: Per ProfilerStep with collectives, in window and step order: its part of its window's cost.
    steps: list[StepCost] = field(default_factory=list)
    #: (recorded end of a collective, how much earlier it would have ended, ns) where that changes:
    #: the merged trace's track of this rank's cost.
    timeline: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "cost_us": self.cost_us,
            "share": self.share,
            "late_us": self.late_us,
            "late_count": self.late_count,
            "by_op": dict(sorted(self.by_op.items())),
            "by_window": {str(w): cost for w, cost in sorted(self.by_window.items())},
            "steps": [s.to_dict() for s in self.steps],
        }


@dataclass(slots=True)
class Impact:
    """The replay's result: one row per replayed rank, largest cost first."""

    ranks: list[RankImpact]
    #: The profiled time: per window, its first arrival to its last collective end, summed (ns).
    profiled_ns: int = 0
    #: Ranks that were late somewhere but not replayed (beyond :data:`MAX_REPLAYED_RANKS`).
    not_replayed: int = 0
    #: Collectives in no ProfilerStep span where the traces hold some: in their window's cost, in no step's.
    outside_steps: int = 0

    @property
    def profiled_us(self) -> float:
        return self.profiled_ns / 1000.0


class _Replay:
    """The dependency graph of the matched collectives, replayable with some lateness removed.

    Nodes are one rank's instances: the members in :class:`Columns`, numbered as there (each
    collective's latest-first); ``pred[n]`` is the node of the same rank that ``n`` waits for
    (-1: none). A replay only moves times earlier, so a synchronizing collective's last arrival
    is found scanning its members latest-first and stopping at the first recorded start no later
    than the best found: in a job of 1,024 ranks a replay reads a few members of each collective,
    not all of them.
    """

    def __init__(self, cols: Columns, coverage: Optional[Coverage]) -> None:
        self.cols = cols
        count = len(cols)
        self.owner = array("i")
        for k in range(count):
            self.owner.extend(array("i", [k]) * (cols.offset[k + 1] - cols.offset[k]))
        self.pred = array("i", [-1]) * len(cols.start)
        by_rank: dict[int, array] = {}  # rank -> its nodes, in node order
        for node, rank in enumerate(cols.rank):
            nodes = by_rank.get(rank)
            if nodes is None:
                nodes = by_rank[rank] = array("i")
            nodes.append(node)
        start, end = cols.start, cols.end
        while by_rank:
            rank, nodes = by_rank.popitem()
            ended = sorted(nodes, key=lambda n: (end[n], start[n]))  # ties in node order: stable
            del nodes
            ends = [end[n] for n in ended]
            several = coverage is not None and len(coverage.windows.get(rank, ())) > 1
            for node in ended:
                at = bisect.bisect_right(ends, start[node]) - 1
                while at >= 0 and ended[at] == node:
                    at -= 1
                pred = ended[at] if at >= 0 else -1
                if several and coverage is not None and pred >= 0 and \
                        coverage.window_of(rank, start[pred]) != coverage.window_of(rank, start[node]):
                    pred = -1  # a new window: what ran between was not recorded
                self.pred[node] = pred
        # A collective is replayed after those its members wait for: in order of its last arrival.
        self.order = sorted(range(count), key=lambda k: (cols.last_start[k], k))
        self.place = {k: i for i, k in enumerate(self.order)}
        self.synchronized = bytearray(cols.complete[k] and cols.offset[k + 1] - cols.offset[k] > 1
                                      for k in range(count))
        #: (collective index, rank) -> that rank's recorded lead over the next-latest member.
        self.leads: dict[tuple[int, int], int] = {}
        for k in range(count):
            last = cols.last_rank[k]
            if self.synchronized[k] and last != NO_RANK:
                before = next(start[n] for n in cols.members(k) if cols.rank[n] != last)
                lead = cols.last_start[k] - before
                if lead > 0 and (coverage is None or coverage.covers(last, before, cols.last_start[k])):
                    self.leads[(k, last)] = lead

    def shifts(self, removed: dict[int, int], rank: int) -> list[int]:
        """Per collective, how much (ns, <= 0) its end moves when ``rank`` arrives earlier by
        ``removed[k]`` at collective ``k``."""
        cols = self.cols
        moved = [0] * len(cols)
        if not removed:
            return moved
        own: dict[int, int] = {}  # node of an unsynchronized collective -> its shift
        start, end, pred, ranks, owner, synchronized = (cols.start, cols.end, self.pred, cols.rank, self.owner,
                                                        self.synchronized)

        def shift_of(node: int) -> int:
            if node < 0:
                return 0
            k = owner[node]
            return moved[k] if synchronized[k] else own.get(node, 0)

        def cut_at(node: int, cut: int) -> int:
            """The part of ``cut`` the rank spent between its previous instance's end and this start."""
            before = pred[node]
            return cut if before < 0 else min(cut, start[node] - end[before])

        first = min(self.place[k] for k in removed)  # nothing before it moves
        for k in self.order[first:]:
            cut = removed.get(k, 0)
            if synchronized[k]:
                best = None
                for n in cols.members(k):
                    if best is not None and start[n] <= best:
                        break  # times only move earlier: no later member can arrive after best
                    arrival = start[n] + shift_of(pred[n]) - (cut_at(n, cut) if cut and ranks[n] == rank else 0)
                    if best is None or arrival > best:
                        best = arrival
                assert best is not None, "a synchronized collective has members"
                moved[k] = best - cols.last_start[k]
            else:
                for n in cols.members(k):
                    own[n] = shift_of(pred[n]) - (cut_at(n, cut) if cut and ranks[n] == rank else 0)
                moved[k] = max(own[n] for n in cols.members(k))
        return moved


def impact(collectives: Union[Sequence[MatchedCollective], Columns], coverage: Optional[Coverage] = None) -> Impact:
    """Each late rank's cost to the window, and per op it was late to (``coverage``: when
    each rank was profiled; without it, every lead counts). ``collectives``: matched ones, or
    their columns (:class:`Columns`, what a sharded merge's lead builds from the workers' rows)."""
    cols = collectives if isinstance(collectives, Columns) else Columns.of(collectives)
    if not len(cols):
        return Impact([])
    replay = _Replay(cols, coverage)
    ends = [max(cols.end[cols.offset[k]:cols.offset[k + 1]]) for k in range(len(cols))]
    firsts = [cols.first_arrival(k) for k in range(len(cols))]  # each collective's (start, rank), read twice
    windows = _by_window(cols, coverage, firsts)
    steps, outside_steps = _by_step(cols, coverage, windows, firsts)
    profiled = sum(max(ends[k] for k in ks) - min(cols.first_start[k] for k in ks) for ks in windows.values())
    lateness: dict[int, list[int]] = defaultdict(list)
    for (k, rank), lead in replay.leads.items():
        lateness[rank].append(k)
    ranked = sorted(lateness, key=lambda r: (-sum(replay.leads[(k, r)] for k in lateness[r]), r))
    rows = []
    for rank in ranked[:MAX_REPLAYED_RANKS]:
        mine = lateness[rank]
        removed = {k: replay.leads[(k, rank)] for k in mine}
        moved = replay.shifts(removed, rank)
        by_window = _window_costs(ends, moved, windows)
        cost = sum(by_window.values())
        row = RankImpact(rank, _us(cost), round(cost / max(profiled, 1), 6), _us(sum(removed.values())), len(mine),
                         by_window={w: _us(ns) for w, ns in by_window.items()}, timeline=_timeline(ends, moved),
                         steps=_step_costs(cols, ends, moved, steps))
        ops = sorted({cols.op[k] for k in mine})
        for op in ops:
            only = {k: lead for k, lead in removed.items() if cols.op[k] == op}
            row.by_op[op] = row.cost_us if len(ops) == 1 else \
                _us(sum(_window_costs(ends, replay.shifts(only, rank), windows).values()))
        rows.append(row)
    rows.sort(key=lambda r: (-r.cost_us, r.rank))
    return Impact(rows, profiled, max(0, len(ranked) - MAX_REPLAYED_RANKS), outside_steps)


def _window_costs(ends: list[int], moved: list[int], windows: dict[int, list[int]]) -> dict[int, int]:
    """Window -> how much earlier (ns) its last collective ends."""
    return {w: max(ends[k] for k in ks) - max(ends[k] + moved[k] for k in ks) for w, ks in windows.items()}


def _by_window(cols: Columns, coverage: Optional[Coverage],
               firsts: list[tuple[int, Optional[int]]]) -> dict[int, list[int]]:
    """Profiled window (1-based) -> the collectives whose first arrival (``firsts``, by collective)
    lies in it, on that rank's windows (one window when they are not known)."""
    out: dict[int, list[int]] = defaultdict(list)
    for k in range(len(cols)):
        first_rank = firsts[k][1]
        if coverage is None:
            at: Optional[int] = 0
        else:  # (a collective without a member would be in no window)
            at = coverage.window_of(first_rank, cols.first_start[k]) if first_rank is not None else None
        if at is not None:
            out[at + 1].append(k)
    return dict(sorted(out.items()))


def _by_step(cols: Columns, coverage: Optional[Coverage], windows: dict[int, list[int]],
             firsts: list[tuple[int, Optional[int]]]) -> tuple[dict[tuple[int, int], list[int]], int]:
    """(window, step) -> the collectives of that step, in window and step order, and how many
    collectives lie in no step. A collective's step is the one its first arrival lies in, on the
    first member to arrive whose steps are known."""
    known = {rank: StepIndex(spans, coverage.windows.get(rank, ())) for rank, spans in coverage.steps.items()} \
        if coverage is not None else {}
    if not known:
        return {}, 0
    found: dict[tuple[int, int], list[int]] = defaultdict(list)
    outside = 0
    for w, ks in windows.items():
        for k in ks:
            arrival, rank = firsts[k]
            if rank not in known:
                arrival, rank = cols.first_arrival(k, among=known)
            step = known[rank].at(arrival) if rank is not None else None
            if step is None:
                outside += 1
            else:
                found[(w, step[0])].append(k)
    return dict(sorted(found.items())), outside


def _step_costs(cols: Columns, ends: list[int], moved: list[int],
                steps: dict[tuple[int, int], list[int]]) -> list[StepCost]:
    """Each step's part of its window's cost (module docstring): the change in how much earlier
    its last collective ends, from the step before it in the window."""
    out = []
    before: dict[int, int] = {}  # window -> how much earlier (ns) its previous step ended
    for (w, step), ks in steps.items():
        last = max(ends[k] for k in ks)
        earlier = last - max(ends[k] + moved[k] for k in ks)
        cost = earlier - before.get(w, 0)
        before[w] = earlier
        first = min(cols.first_start[k] for k in ks)
        out.append(StepCost(w, step, _us(cost), round(cost / max(last - first, 1), 6), first, last))
    return out


def _timeline(ends: list[int], moved: list[int]) -> list[tuple[int, int]]:
    """(recorded end, how much earlier it would have been) in time order, where that changes."""
    points: list[tuple[int, int]] = [(min(ends), 0)]
    for end, delta in sorted(zip(ends, moved)):
        if -delta != points[-1][1]:
            points.append((end, -delta))
    return points


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)


def impact_counters(result: Impact) -> list[CounterSeries]:
    """The merged trace's impact tracks, on each late rank: how much earlier the collectives
    ending at each time would have ended without its lateness (one point where that changes),
    and, where the traces hold steps, what it cost each step (:func:`step_points`)."""
    out = []
    for row in result.ranks:
        if row.cost_us <= 0:
            continue
        out.append(CounterSeries(row.rank, f"impact: without rank {row.rank}'s lateness, ends earlier by (ms)",
                                 [(ts, round(ns / 1e6, 6)) for ts, ns in row.timeline], unit="ms"))
        if row.steps:
            out.append(CounterSeries(row.rank, f"impact per step: what rank {row.rank}'s lateness cost the step (ms)",
                                     step_points(row.steps), unit="ms"))
    return out


def step_points(steps: list[StepCost]) -> list[tuple[int, float]]:
    """A counter that holds each step's cost (ms) from the step's first arrival to the next step's
    (0 from the end of its window's last step on). Where two steps begin at the same time the
    later step's cost stands: a counter has one value at a time."""
    points: dict[int, float] = {}
    for k, s in enumerate(steps):
        points[s.start_ns] = round(s.cost_us / 1000, 6)
        if k + 1 == len(steps) or steps[k + 1].window != s.window:
            points.setdefault(s.end_ns, 0.0)
    return sorted(points.items())
