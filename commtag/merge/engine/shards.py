"""The merge's one analysis driver, whatever the number of workers (one process is a world of
one, :class:`commtag.merge.engine.worlds.SoloWorld`): each collective is matched and analysed by
one worker, and a worker holds its own ranks' records and those of the collectives it owns.
:func:`analyze` runs it over any instances in a world of one (``commtag summary``).

Why shared out: when every worker received every rank's records, each held as much as one process
merging alone or more (on a 1,024-rank job, 345 and 322 MiB against one process's 245), and every
worker analysed all of them: ``-j`` and torchrun divided the time of reading, not the memory.
"One process's order" below is the job's instances rank by rank, each rank's as read: the order
in which a world of one meets them, and so the order every number of workers writes them in.

How: a worker holds each rank's records once the rank is written (:class:`Held`: objects, packed
beyond a bound); their summaries travel without them. Then:

1. Every worker learns each rank's instance counts, metadata-less kernels' last Seqs (so that
   each settles its own as one process would), lanes, and Seq runs
   (:func:`commtag.merge.analysis.parts.seq_runs`): numbers, not records.
2. Each worker makes its instances' match keys (:func:`commtag.merge.records.match_keys`, a
   rank's need only its own) and deals each to the worker owning its key, by a CRC of the
   group, Seq and replay (every collective a Seq gap could name on one worker; a p2p message
   by its key), and to a bucket there; sealed in small pieces as it goes (:class:`routes.Carrier`).
3. Bucket by bucket (about :data:`BUCKET_ROWS` instances), each worker receives its
   collectives' records (:mod:`commtag.merge.engine.routes`), matches, measures and checks them
   as one process would (members in the order one process meets them) and keeps of each member
   only its times. Then the straggler noise pools every worker's skews, the cross-rank flows are
   numbered from every worker's counts in one process's order, and a group's busbw counter is
   made from every worker's transfers.
4. What a writer needs goes back to the worker holding the instance: its figures (once per
   collective), wait and flows, and the markers of its ranks, each with its place in one
   process's order; the worker unpacks a lane's records only when it writes that lane
   (:mod:`commtag.merge.engine.owned`). The lanes each worker writes are the bytes a worker
   holding every record writes.
5. Then, with what went back let go, the lead replays the lateness (impact) from every
   collective's member times and gathers the findings (:class:`ForLead`).
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import astuple, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from commtag.merge.analysis.alltoall import AllToAll, traffic
from commtag.merge.analysis.analyze import (
    DEFAULT_STRAGGLER_MIN_SKEW_US, busbw_edges, busbw_series, flag_stragglers, markers, measure, skews,
)
from commtag.merge.analysis.checks import check, seq_gaps
from commtag.merge.analysis.hook import (
    MergeAnalysis, busbw_counter, collective_figures, window_markers,
)
from commtag.merge.analysis.columns import Columns
from commtag.merge.analysis.impact import impact_counters
from commtag.merge.analysis.parts import (
    Member, SeqRef, SeqRun, SeqRuns, lead_result, seq_issued, seq_runs, timed, timed_row,
)
from commtag.merge.analysis.results import Analysis, MatchedCollective, to_us
from commtag.merge.batches import BATCH_KEY, BATCHES_OF, batch_keys
from commtag.merge.engine.exchange import from_everyone
from commtag.merge.engine.options import Progress, Unshown
from commtag.merge.engine.owned import BackRows, FigureTables, Held, OwnLanes, apply, back_pieces, flow_to_wire
from commtag.merge.engine.worlds import SoloWorld
from commtag.merge.engine import routes
from commtag.merge.engine.routes import Carrier, route, rows_pieces, unpacked, unseal
from commtag.merge.pftrace.lanes import flows_of, group_flows, lanes_used
from commtag.merge.rank.attach import settle_inferred
from commtag.merge.records import (
    CollectiveInstance, CounterSeries, Coverage, Interner, Marker, RankSummary, TraceAnnotations,
    match_keys,
)
from commtag.vocab import ANN_INFERRED

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World


@dataclass
class Outcome:
    """What this worker's lanes need, and (on the lead) the analysis for the result."""

    #: This worker's ranks' instances, for its lanes.
    lanes: OwnLanes = field(default_factory=lambda: OwnLanes(Interner()))
    annotations: Optional[TraceAnnotations] = None
    analysis: Optional[Analysis] = None
    #: Instances matched here: all of them, and the most held at once (one bucket's).
    analysed: int = 0
    most_at_once: int = 0


#: Instances a worker matches at once: its collectives are matched in buckets of about this many.
BUCKET_ROWS = 8192


def settle(world: World, held: Held) -> None:
    """Step 1's first half: every rank's counts, and every rank's metadata-less kernels' Seqs."""
    mine = {"counts": list(held.counts.items()), "timed": held.timed_by_ops,
            "inferred": [[uid, list(per_rank.items())] for uid, per_rank in held.inferred.items()]}
    held.timed_by_ops = 0
    held.inferred = {}
    for part in from_everyone(world, lambda: mine):
        held.counts.update((rank, count) for rank, count in part["counts"])
        held.timed_by_ops += part["timed"]
        for uid, per_rank in part["inferred"]:
            held.inferred.setdefault(uid, {}).update((rank, seq) for rank, seq in per_rank)


def owner_of(key: tuple, inst: CollectiveInstance, size: int, buckets: int = 1) -> tuple[int, int]:
    """The worker that matches and analyses the collective of ``key``, and the bucket it is matched
    in there: every collective of one group, Seq and replay on one worker (a Seq gap is found on
    the collective holding that Seq), a p2p message by its key, nccl2's batches of one group and
    replay together (they link across ranks); a stable CRC, the same in every process."""
    named = key if key[0] == BATCHES_OF[0] or inst.is_p2p else (inst.pg_uid, inst.seq, inst.replay)
    code = zlib.crc32(repr(named).encode())
    return code % size, code // size % buckets


def gap_owner(pg_uid: str, seq: int, size: int) -> int:
    """:func:`owner_of` a non-p2p collective of ``pg_uid`` at ``seq`` (no replay): where its gap attaches."""
    return zlib.crc32(repr((pg_uid, seq, None)).encode()) % size


def analyse(world: World, held: Held, hook: Optional[MergeAnalysis], coverage: Coverage,
            interner: Interner, shown: Callable[[int], Progress] = lambda total: Unshown()) -> Outcome:
    """Steps 1 to 4 of the module docstring (figures only with ``hook``, flows always), shown by parts."""
    me, size = world.index, world.size
    if hook is not None and hook.keep and size > 1:  # each worker would keep only the collectives it owns
        raise ValueError("MergeAnalysis(keep=True) runs in a world of one")
    buckets = max(1, -(-sum(held.counts.values()) // (size * BUCKET_ROWS)))
    outcome = Outcome(lanes=OwnLanes(interner))
    staged: dict[tuple[tuple[int, int], bool], list] = {}  # (worker, bucket), as objects -> rows
    sealed: dict[tuple[int, int], list[tuple[int, object]]] = {}
    runs: list[SeqRun] = []
    found: dict[str, list] = {}
    bar = shown(len(held.records) + buckets + 1)
    for rank in sorted(held.records):  # settled as one process settles them, keyed, dealt out, held again
        insts = unpacked(holding := held.records[rank], interner)
        local = holding is insts  # held as objects: what this worker deals to itself stays objects
        settle_inferred(insts, held.inferred)
        held.used[rank] = lanes_used(insts)
        if hook is not None:
            runs += seq_runs(insts, coverage)
        for idx, (inst, key) in enumerate(zip(insts, match_keys(insts))):
            if inst.pg_uid not in found and seq_issued(inst):  # the cheap test first: most groups are found
                found[inst.pg_uid] = [rank, idx, inst.lane_name, list(inst.group_ranks)]
            if key[0] == "alone" and len(key) == 2:
                key = ("alone", rank, idx)
            elif key[0] == BATCH_KEY:  # batches link across ranks: their owner keys them anew
                key = BATCHES_OF + (inst.pg_uid, inst.replay)
            where = (0, 0) if size == buckets == 1 else owner_of(key, inst, size, buckets)  # one place: no CRC
            rows = staged.setdefault(slot := (where, local and where[0] == me), [])
            rows.append((rank, idx, key, inst))
            if len(rows) >= routes.SEAL_ROWS:
                sealed.setdefault(where, []).append(Carrier.seal(staged.pop(slot), slot[1]))
        by_lane: dict[str, list[int]] = {}
        for idx, inst in enumerate(insts):
            by_lane.setdefault(inst.lane_name, []).append(idx)
        for lane, idxs in by_lane.items():
            outcome.lanes.held[(rank, lane)] = (Carrier.like(holding, rank, [insts[idx] for idx in idxs]), idxs)
        del held.records[rank], insts, holding
        bar.update()
    for slot in list(staged):
        sealed.setdefault(slot[0], []).append(Carrier.seal(staged.pop(slot), slot[1]))
    holder: dict[int, int] = {}
    refs: dict[str, list] = {}
    for w, part in enumerate(from_everyone(world, lambda: {
            "used": list(held.used.items()), "runs": [list(run) for run in runs], "refs": list(found.items())})):
        for rank, used in part["used"]:
            held.used[rank] = [tuple(row) for row in used]
            holder[rank] = w
        if w != me:
            runs += [SeqRun(*run) for run in part["runs"]]
        for pg, ref in part["refs"]:
            if pg not in refs or ref[:2] < refs[pg][:2]:
                refs[pg] = ref
    seqs = SeqRuns(runs, {pg: SeqRef(ref[2], interner.shared(tuple(ref[3]))) for pg, ref in refs.items()})
    runs, found = [], {}
    groups: list[tuple[_Members, Optional[MatchedCollective[Member]], Optional[AllToAll]]] = []
    kept: list[tuple[tuple, MatchedCollective, MatchedCollective[Member]]] = []  # hook.keep: (place, whole, as kept)
    for bucket in range(buckets):  # step 2 and the matching of step 3, a bucket at a time
        shard: list[tuple[int, int, tuple, CollectiveInstance]] = []

        def arrived(piece: dict) -> None:
            for part in piece["parts"]:
                shard.extend(Carrier.rows(part, interner))

        route(world, [unseal(sealed.pop((w, bucket), [])) for w in range(size)], arrived)
        outcome.analysed += len(shard)
        outcome.most_at_once = max(outcome.most_at_once, len(shard))
        groups += _match(shard, hook, coverage, seqs, kept)
        bar.update()
    tables = FigureTables()  # the figures of the collectives matched here, by the number rows name them by
    back, pending = _conclude(world, groups, hook, coverage, seqs, holder, outcome, tables)
    own_markers: list[tuple] = []
    route(world, [back_pieces(me, rows, tables) for rows in back],
          lambda piece: apply(piece, outcome.lanes, own_markers))
    del back, tables
    if hook is not None:
        assert outcome.annotations is not None and pending is not None
        _on_lead(world, pending, coverage, hook, outcome)
        outcome.annotations.markers = [Marker(*mk) for _, mk in sorted(own_markers, key=lambda pair: pair[0])] + \
            window_markers(coverage)
        if hook.keep and hook.result is not None:  # judged as kept: flagged there
            for _, whole, light in kept:
                whole.straggler = light.straggler
            hook.result.collectives = [whole for _, whole, _ in sorted(kept, key=lambda row: row[0])]
            for whole in hook.result.collectives if held.carrier.as_objects else ():  # copies: the lanes annotate these
                whole.members = {rank: replace(inst, args=dict(inst.args)) for rank, inst in whole.members.items()}
            hook.result.markers = markers(hook.result.collectives)
    bar.update()
    bar.close()
    return outcome


class _Members:
    """One matched group's members as this worker keeps them until what goes back is made: each
    member's rank, place among its rank's instances and times, in one process's order (by rank,
    start and Seq, then as read), and the first member's Seq (the group's place in that order).
    Columns, not a tuple per member: a worker holds every member of the collectives it matched."""

    __slots__ = ("ranks", "places", "members", "first_seq")

    def __init__(self, rows: list[tuple[int, int, CollectiveInstance]], members: list[Member]) -> None:
        self.ranks = array("i", [rank for rank, _, _ in rows])
        self.places = array("q", [idx for _, idx, _ in rows])
        self.members = members
        self.first_seq = rows[0][2].seq

    def __len__(self) -> int:
        return len(self.members)

    def first(self) -> tuple[int, int]:
        """The first member's (rank, place): where one process meets the group's flows."""
        return min(zip(self.ranks, self.places))

    def flows(self, base: Optional[int]) -> dict[int, object]:
        """Member position -> its flows as JSON (:func:`commtag.merge.pftrace.lanes.group_flows`,
        numbered after ``base``; none without a base), made when its rows go back, not kept."""
        if base is None:
            return {}
        members, ranks = self.members, self.ranks
        ordered = sorted(range(len(members)), key=lambda j: (members[j].start_ns, ranks[j]))
        return {j: flow_to_wire(f) for j, f in zip(ordered, group_flows(len(members), base))}


def _match(shard: list, hook: Optional[MergeAnalysis], coverage: Coverage, seqs: SeqRuns,
           kept: list) -> list[tuple[_Members, Optional[MatchedCollective[Member]], Optional[AllToAll]]]:
    """One bucket's collectives matched, measured and checked; each as its :class:`_Members`, its
    matched collective, whose members keep only their times (:class:`commtag.merge.analysis.parts.Member`),
    and an all-to-all's traffic (read from the whole members' split sizes). With ``hook.keep``, each
    whole too, into ``kept`` with its place in one process's order."""
    batches = [inst for _, _, key, inst in shard if key[0] == BATCHES_OF[0]]
    batched = batch_keys(batches) if batches else {}
    by_key: dict[tuple, list[tuple[int, int, CollectiveInstance]]] = {}
    for rank, idx, key, inst in shard:
        by_key.setdefault(batched.get(id(inst), key), []).append((rank, idx, inst))
    shard.clear()
    out: list[tuple[_Members, Optional[MatchedCollective[Member]], Optional[AllToAll]]] = []
    for rows in by_key.values():
        rows.sort(key=lambda r: (r[0], r[2].start_ns, r[2].seq, r[1]))
        light = [Member(inst.start_ns, inst.end_ns, bool(inst.arg(ANN_INFERRED))) for _, _, inst in rows]
        m, sent = None, None
        if hook is not None:
            whole = measure([r[2] for r in rows], coverage, seqs)
            whole.findings.extend(check(whole))
            sent = next(iter(traffic([whole])), None)
            m = whole.keeping({inst.rank: kept for (_, _, inst), kept in zip(rows, light)})  # a rank's last
            if hook.keep:
                first = rows[0]
                kept.append(((m.first_start_ns, m.pg_uid, m.seq, first[0], first[2].start_ns, first[2].seq, first[1]),
                             whole, m))
        out.append((_Members(rows, light), m, sent))
    return out


def _conclude(world: World, groups: list[tuple[_Members, Optional[MatchedCollective[Member]], Optional[AllToAll]]],
              hook: Optional[MergeAnalysis],
              coverage: Coverage, seqs: SeqRuns, holder: dict[int, int], outcome: Outcome,
              tables: FigureTables) -> tuple[list[BackRows], Optional[ForLead]]:
    """Step 3's end: this worker's collectives numbered, judged against the whole job (stragglers,
    Seq gaps) and described; what goes back to each worker (:class:`commtag.merge.engine.owned.BackRows`:
    per member its figures by their number in ``tables``, wait, straggler flag and flows; markers)."""
    me, size = world.index, world.size
    back = [BackRows() for _ in range(size)]
    bases = _number_flows(world, [members for members, _, _ in groups])
    if hook is None:
        for (members, _, _), base in zip(groups, bases):
            for j, flow in members.flows(base).items():
                rank = members.ranks[j]
                back[holder[rank]].instance(rank, members.places[j], None, None, False, flow)
        return back, None
    # Each collective's place in one process's order, as the JSON it travels as (lists, not tuples:
    # the lead compares its own places with other workers').
    keyed = [((m.first_start_ns, m.pg_uid, m.seq, [members.ranks[0], members.members[0].start_ns, members.first_seq,
                                                    members.places[0]]), m, members, base)
             for (members, m, _), base in zip(groups, bases) if m is not None]
    sent = [[list(key), list(astuple(a2a))] for key, (_, _, a2a) in
            zip((item[0] for item in keyed), (g for g in groups if g[1] is not None)) if a2a is not None]
    del bases
    keyed.sort(key=lambda item: item[0])
    matched = [m for _, m, _, _ in keyed]
    pooled = [tuple(row) for part in from_everyone(world, lambda: {"skews": skews(matched)}) for row in part["skews"]]
    flag_stragglers(matched, coverage, hook.straggler_min_skew_us, pooled)
    del pooled
    gaps = seq_gaps(seqs, coverage)
    by_key = {(m.pg_uid, m.is_p2p, m.seq, m.replay): m for m in matched if not m.is_p2p}
    attached: list[int] = []
    for g, gap in enumerate(gaps):
        target = by_key.get((gap.pg_uid, False, gap.seq, gap.replay)) \
            if gap_owner(gap.pg_uid, gap.seq, size) == me else None
        if target is not None:
            target.findings.append(gap)
            attached.append(g)
    del by_key
    findings: list[list] = []
    lead: list = []
    for key, m, members, base in keyed:
        if m.findings:
            findings += [[list(key), k, [str(f.kind), *list(astuple(f))[1:]]] for k, f in enumerate(m.findings)]
        for k, mk in enumerate(markers([m]) if m.straggler or m.findings else ()):  # the rest have none
            back[holder[mk.rank]].markers.append(["marker", [mk.ts_ns, mk.rank, *key, k], mk.rank, mk.ts_ns,
                                                  mk.name, mk.args])
        figures = tables.number(collective_figures(m))
        waits = m.waits_ns
        taken = {id(member) for member in m.members.values()} if len(m.members) < len(members) else None  # None: all
        found = members.flows(base) if base is not None else {}
        for j, member in enumerate(members.members):
            rank, flow = members.ranks[j], found.get(j)
            if taken is None or id(member) in taken:
                back[holder[rank]].instance(rank, members.places[j], figures, to_us(waits[rank]) if rank in waits
                                            else None, m.straggler and rank == m.last_rank, flow)
            elif flow is not None:
                back[holder[rank]].instance(rank, members.places[j], None, None, False, flow)
        lead.append(timed_row(list(key), m, travels=size > 1))  # a world of one's rows stay in it
    busbw, series = _busbw_counters(world, keyed)
    outcome.annotations = TraceAnnotations(counters=busbw)
    keyed, matched = [], []
    groups.clear()  # the members' times now travel in ``lead``
    return back, ForLead(lead, findings, attached, gaps, series, sent)


@dataclass
class ForLead:
    """What the lead gathers once the figures have gone back (the replay then has the room they
    held): this worker's collectives' member times (:func:`commtag.merge.analysis.parts.timed_row`)
    and findings, the Seq gaps attached here, and the whole job's (every worker's) gaps and busbw series."""

    timed: list
    findings: list
    attached: list[int]
    gaps: list
    series: dict[str, list[tuple[int, float]]]
    #: This worker's all-to-all instances' traffic (:class:`commtag.merge.analysis.alltoall.AllToAll`), each by its place.
    all_to_all: list


def _on_lead(world: World, pending: ForLead, coverage: Coverage, hook: MergeAnalysis, outcome: Outcome) -> None:
    """Step 3's last part: the lead replays the lateness (impact) from every collective's member
    times and gathers the findings; every worker gets the impact tracks."""
    assert outcome.annotations is not None
    replayed = Columns()
    route(world, [rows_pieces(pending.timed, "impact") if w == 0 else iter(()) for w in range(world.size)],
          lambda piece: timed(piece["impact"], replayed))
    everyone_findings = _to_lead(world, pending.findings, "findings")
    every_all_to_all = _to_lead(world, pending.all_to_all, "all_to_all")
    every_attached = {g for part in from_everyone(world, lambda: {"attached": pending.attached})
                      for g in part["attached"]}
    result: Optional[Analysis] = None
    counters: list[CounterSeries] = []
    if world.index == 0:
        result = lead_result(replayed, everyone_findings,
                             [g for k, g in enumerate(pending.gaps) if k not in every_attached], coverage, pending.series,
                             every_all_to_all)
        counters = impact_counters(result.impact)
    shared = from_everyone(world, lambda: {"impact": [[c.rank, c.track, c.points, c.unit] for c in counters]})[0]
    outcome.annotations.counters += [CounterSeries(rank, track, [tuple(p) for p in points], unit)
                                     for rank, track, points, unit in shared["impact"]]
    outcome.analysis = result
    hook.result = result


def _number_flows(world: World, groups: list[_Members]) -> list[Optional[int]]:
    """Each group's flows numbered after those of every group one process meets first (by its
    first member as read: rank, place); None for a group with no flow (alone, or a rank twice)."""
    flowing = [len(g) >= 2 and len(set(g.ranks)) == len(g) for g in groups]
    counts = [[list(g.first()), flows_of(len(g))] for g, yes in zip(groups, flowing) if yes]
    every = sorted((tuple(first), n) for part in from_everyone(world, lambda: {"counts": counts})
                   for first, n in part["counts"])
    before: dict[tuple[int, int], int] = {}
    total = 0
    for first, n in every:
        before[first] = total
        total += n
    del every
    return [before[g.first()] if yes else None for g, yes in zip(groups, flowing)]


def _busbw_counters(world: World, keyed: list[tuple]) -> tuple[list[CounterSeries], dict[str, list[tuple[int, float]]]]:
    """Every group's busbw counter, from every worker's transfers: on its lowest member, named
    after the lane of its first collective in one process's order; and the series by group.
    ``keyed``: this worker's matched collectives, each with its place in that order."""
    named: dict[str, list] = {}
    for key, m, _, _ in keyed:
        first = named.setdefault(m.pg_uid, [list(key), m.lane_name or m.pg_uid, m.first_rank, []])
        first[2] = min(first[2], *m.members)
    for pg, edges in busbw_edges([m for _, m, _, _ in keyed]).items():
        named[pg][3] = [list(edge) for edge in edges]
    found: dict[str, list] = {}
    for part in from_everyone(world, lambda: {"busbw": list(named.items())}):
        for pg, (key, name, rank, edges) in part["busbw"]:
            row = found.setdefault(pg, [key, name, rank, []])
            if key < row[0]:
                row[0], row[1] = key, name
            row[2] = min(row[2], rank)
            row[3] += [tuple(edge) for edge in edges]
    series = busbw_series({pg: row[3] for pg, row in found.items() if row[3]})
    return [busbw_counter(found[pg][2], found[pg][1], points) for pg, points in sorted(series.items())], series


def _to_lead(world: World, rows: list, name: str) -> list:
    """``rows`` of every worker, on the lead (in pieces); an empty list elsewhere."""
    got: list = []
    route(world, [rows_pieces(rows, name) if w == 0 else iter(()) for w in range(world.size)],
          lambda piece: got.extend(piece[name]))
    return got


def analyze(instances: Iterable[CollectiveInstance], *, coverage: Optional[Coverage] = None,
            loaded_ranks: Optional[Iterable[int]] = None,
            straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US) -> Analysis:
    """The analysis of ``instances`` (any ranks', e.g. read back from a merged trace: ``commtag
    summary``) by the merge's driver in a world of one, its matched collectives kept whole.

    ``coverage``: the ranks read and when each was profiled (see :class:`Coverage`). Without it,
    ``loaded_ranks`` (default: every rank seen) are taken as profiled all the time; a rank
    outside them is never blamed. The members are the records as the driver reads them (copies).
    """
    by_rank: dict[int, list[CollectiveInstance]] = {}
    for inst in instances:
        by_rank.setdefault(inst.rank, []).append(inst)
    if coverage is None:
        coverage = Coverage.unknown_windows(loaded_ranks if loaded_ranks is not None else by_rank)
    held = Held(Carrier(0))  # packed, though a world of one: the members are the caller's records' copies
    for rank in sorted(by_rank):
        held.take(RankSummary(rank, "", None, [], instances=by_rank.pop(rank)))
    world = SoloWorld()
    settle(world, held)
    hook = MergeAnalysis(straggler_min_skew_us, keep=True)
    analyse(world, held, hook, coverage, Interner())
    assert hook.result is not None  # the lead of a world of one
    return hook.result
