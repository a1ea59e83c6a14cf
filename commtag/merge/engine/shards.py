"""The analysis shared out between merge workers: each collective is matched and analysed by
one worker, and a worker holds its own ranks' records and those of the collectives it owns.

Why: when every worker received every rank's records, each held as much as one process merging
alone (a 1,024-rank merge's two workers 222 MB each against 237 MB), and every worker analysed
all of them: ``-j`` and torchrun divided the time of reading, not the memory.

How, once each worker has written its ranks (their summaries travel without instances):

1. Every worker learns each rank's instance counts, metadata-less kernels' last Seqs (so that
   each settles its own as one process would), lanes, and its Seq runs
   (:func:`commtag.merge.analysis.parts.seq_runs`): numbers, not records.
2. Each worker makes its instances' match keys (:func:`commtag.merge.records.match_keys`, a
   rank's need only its own) and sends each to the worker that owns its key: by a CRC of the
   group, Seq and replay (every collective a Seq gap could name on one worker), of the key for
   a p2p message; packed, its own wait until they come back (:mod:`commtag.merge.engine.routes`).
3. Each worker matches and measures its collectives as one process would (members in the
   order one process meets them); the straggler noise pools every worker's skews, the cross-rank
   flows are numbered from every worker's counts in one process's order, a group's busbw
   counter is made from every worker's transfers, and the lead replays the lateness (impact)
   from every collective's member times and gathers the findings.
4. What a writer needs goes back to the worker holding the instance: its figures, wait and
   flows, and the markers of its ranks, each with its place in one process's order; the lanes
   each worker writes are the bytes of today's worker writing its ranks.
"""

from __future__ import annotations

import zlib
from dataclasses import astuple, dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional

from commtag.merge.analysis.analyze import busbw_edges, busbw_series, flag_stragglers, markers, measure, skews
from commtag.merge.analysis.checks import check, seq_gaps
from commtag.merge.analysis.hook import (
    MergeAnalysis, busbw_counter, collective_figures, window_markers,
)
from commtag.merge.analysis.impact import impact, impact_counters
from commtag.merge.analysis.parts import SeqRef, SeqRun, SeqRuns, seq_issued, seq_runs
from commtag.merge.analysis.results import Analysis, Finding, FindingKind, MatchedCollective, to_us
from commtag.merge.engine.exchange import from_everyone
from commtag.merge.engine.routes import instance_pieces, instances_from, pack, route, rows_pieces, unpack
from commtag.merge.pftrace.lanes import InstanceFlows, flows_of, group_flows, lanes_used
from commtag.merge.rank.attach import inferred_seqs, settle_inferred
from commtag.merge.records import (
    CPU_OP_SOURCE, CollectiveInstance, CounterSeries, Coverage, Interner, Marker, RankSummary, TraceAnnotations,
    match_keys,
)
from commtag.vocab import ANN_STRAGGLER, ANN_WAIT_US

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World


@dataclass
class Held:
    """This worker's ranks' instances (rank -> in the order read) and their lanes' kernel annotations."""

    instances: dict[int, list[CollectiveInstance]] = field(default_factory=dict)
    lane_kernels: dict[tuple[int, str], dict] = field(default_factory=dict)
    #: rank -> its instances packed (:func:`commtag.merge.engine.routes.pack`) while others' are analysed here.
    packed: dict[int, bytes] = field(default_factory=dict)
    #: Every rank's instance count and its lanes (:func:`commtag.merge.pftrace.lanes.lanes_used`).
    counts: dict[int, int] = field(default_factory=dict)
    used: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)
    #: Instances timed by their CPU op, in the whole job.
    timed_by_ops: int = 0

    def take(self, summaries: list[RankSummary]) -> list[RankSummary]:
        """``summaries`` without their instances and kernel annotations, which stay here."""
        for s in summaries:
            self.instances[s.rank], s.instances = s.instances, []
            self.lane_kernels.update(((s.rank, lane), args) for lane, args in s.lane_kernels.items())
            s.lane_kernels = {}
        return summaries

    def ordered(self) -> list[CollectiveInstance]:
        """Every held instance, by rank, then as read."""
        return [inst for rank in sorted(self.instances) for inst in self.instances[rank]]


@dataclass
class Outcome:
    """What this worker's lanes need, and (on the lead) the analysis for the result."""

    flows: InstanceFlows = field(default_factory=dict)
    annotations: Optional[TraceAnnotations] = None
    analysis: Optional[Analysis] = None
    #: Instances other workers sent here to match and analyse, and those of this worker's ranks.
    received: int = 0
    analysed: int = 0


def settle(world: World, held: Held) -> None:
    """Step 1's first half: every rank's counts, and the metadata-less kernels settled alike everywhere."""
    def mine() -> dict:
        return {"counts": [[rank, len(insts), sum(1 for i in insts if i.source == CPU_OP_SOURCE)]
                           for rank, insts in held.instances.items()],
                "inferred": [[uid, list(per_rank.items())] for uid, per_rank in inferred_seqs(held.ordered()).items()]}

    seqs: dict[str, dict[int, int]] = {}
    for part in from_everyone(world, mine):
        for rank, count, timed in part["counts"]:
            held.counts[rank] = count
            held.timed_by_ops += timed
        for uid, per_rank in part["inferred"]:
            seqs.setdefault(uid, {}).update((rank, seq) for rank, seq in per_rank)
    settle_inferred(held.ordered(), seqs)


def owner_of(key: tuple, inst: CollectiveInstance, size: int) -> int:
    """The worker that matches and analyses the collective of ``key``: every collective of one
    group, Seq and replay on one (a Seq gap is found on the collective holding that Seq), a p2p
    message by its key; a stable CRC, the same in every process."""
    named = (inst.pg_uid, inst.seq, inst.replay) if not inst.is_p2p else key
    return zlib.crc32(repr(named).encode()) % size


def gap_owner(pg_uid: str, seq: int, size: int) -> int:
    """:func:`owner_of` a non-p2p collective of ``pg_uid`` at ``seq`` (no replay): where its gap attaches."""
    return zlib.crc32(repr((pg_uid, seq, None)).encode()) % size


def analyse(world: World, held: Held, everyone: list[RankSummary], hook: Optional[MergeAnalysis],
            coverage: Coverage, interner: Interner) -> Outcome:
    """Steps 1 to 4 of the module docstring; ``everyone``'s summaries carry no instances."""
    me, size = world.index, world.size
    holder: dict[int, int] = {}
    refs: dict[str, tuple] = {}
    runs: list[SeqRun] = []

    def mine() -> dict:
        found: dict[str, list] = {}
        for rank in sorted(held.instances):
            for idx, inst in enumerate(held.instances[rank]):
                if seq_issued(inst) and inst.pg_uid not in found:
                    found[inst.pg_uid] = [rank, idx, inst.lane_name, list(inst.group_ranks)]
        return {"used": [[rank, lanes_used(insts)] for rank, insts in held.instances.items()],
                "runs": [list(run) for run in seq_runs(held.ordered(), coverage)] if hook else [],
                "refs": list(found.items())}

    for w, part in enumerate(from_everyone(world, mine)):
        for rank, used in part["used"]:
            held.used[rank] = [tuple(row) for row in used]
            holder[rank] = w
        runs += [SeqRun(*run) for run in part["runs"]]
        for pg, ref in part["refs"]:
            if pg not in refs or ref[:2] < refs[pg][:2]:
                refs[pg] = ref
    seqs = SeqRuns(runs, {pg: SeqRef(ref[2], interner.shared(tuple(ref[3]))) for pg, ref in refs.items()})
    del runs
    # Step 2: keys, owners, and this worker's ranks packed until their figures come back.
    shard: list[tuple[int, int, tuple, CollectiveInstance]] = []
    outgoing: list[list] = [[] for _ in range(size)]
    for rank in sorted(held.instances):
        insts = held.instances[rank]
        for idx, (inst, key) in enumerate(zip(insts, match_keys(insts))):
            if key[0] == "alone" and len(key) == 2:
                key = ("alone", rank, idx)
            w = owner_of(key, inst, size)
            (shard if w == me else outgoing[w]).append((rank, idx, key, inst))
        held.packed[rank] = pack(rank, insts)
    held.instances = {}
    outcome = Outcome(analysed=len(shard))
    before = len(shard)
    route(world, [iter(()) if w == me else instance_pieces(rows) for w, rows in enumerate(outgoing)],
          lambda piece: shard.extend(instances_from(piece, interner)))
    outcome.received = len(shard) - before
    del outgoing
    tables: list[dict] = []  # the figures of each collective matched here, by the number rows name them by
    back = _analyse_shard(world, shard, hook, coverage, seqs, holder, outcome, tables)
    del shard
    for rank in sorted(held.packed):  # this worker's ranks again, for their lanes
        held.instances[rank] = unpack(held.packed.pop(rank), interner)
    own_markers: list[tuple] = []
    joined: dict[tuple[int, int, int], dict] = {}  # (worker, figures, id of the common args) -> both
    figures: dict[tuple[int, int], dict] = {}  # (worker, its number) -> a collective's figures
    route(world, [_back_pieces(me, rows, tables) for rows in back],
          lambda piece: _apply(piece, held, outcome, own_markers, interner, figures, joined))
    del joined, figures
    if hook is not None:
        assert outcome.annotations is not None
        outcome.annotations.markers = [Marker(*mk) for _, mk in sorted(own_markers, key=lambda pair: pair[0])] + \
            window_markers(coverage)
    return outcome


def _back_pieces(me: int, rows: list, tables: list[dict]) -> Iterator[dict]:
    """The rows going back to one worker in pieces, each with the figures its rows name that
    the worker has not been sent yet (a collective's figures travel once, not once per member:
    a 1,024-rank group's list of matched ranks is 5 KB)."""
    sent: set[int] = set()
    for piece in rows_pieces(rows, "rows"):
        needed = {row[3] for row in piece["rows"] if row[0] == "instance" and row[3] is not None} - sent
        sent |= needed
        yield {"from": me, "figures": [[k, tables[k]] for k in sorted(needed)], **piece}


def _apply(piece: dict, held: Held, outcome: Outcome, own_markers: list, interner: Interner,
           figures: dict[tuple[int, int], dict], joined: dict[tuple[int, int, int], dict]) -> None:
    """Figures, waits, flows and markers that came back for this worker's instances and ranks."""
    source = piece["from"]
    for k, table in piece["figures"]:
        figures[(source, k)] = table
    for row in piece["rows"]:
        if row[0] == "marker":
            own_markers.append((tuple(row[1]), row[2:]))
            continue
        _, rank, idx, k, wait, straggler, flow = row
        inst = held.instances[rank][idx]
        if k is not None:
            base = inst.common_args
            both = joined.get((source, k, id(base)))
            if both is None:
                both = joined[(source, k, id(base))] = interner.common({**base, **figures[(source, k)]})
            inst.common_args = both
            if wait is not None:
                inst.args[ANN_WAIT_US] = wait
            if straggler:
                inst.args[ANN_STRAGGLER] = True
        if flow is not None:
            outcome.flows[id(inst)] = flow if flow.__class__ is int else (
                None if flow[0] is None else range(flow[0], flow[0] + flow[1]),
                None if flow[2] is None else tuple(flow[2]))


def _analyse_shard(world: World, shard: list, hook: Optional[MergeAnalysis], coverage: Coverage, seqs: SeqRuns,
                   holder: dict[int, int], outcome: Outcome, tables: list[dict]) -> list[list]:
    """Step 3: this worker's collectives matched, measured and numbered; what goes back to each
    worker (``("instance", rank, place, figures, wait, straggler, flow)`` and ``("marker", ...)``
    rows, figures by their number in ``tables``)."""
    me, size = world.index, world.size
    groups: dict[tuple, list[tuple[int, int, CollectiveInstance]]] = {}
    for rank, idx, key, inst in shard:
        groups.setdefault(key, []).append((rank, idx, inst))
    shard.clear()
    # Members in the order one process meets them: by rank, start and Seq, then as read.
    members = [sorted(rows, key=lambda r: (r[0], r[2].start_ns, r[2].seq, r[1])) for rows in groups.values()]
    del groups
    back: list[list] = [[] for _ in range(size)]
    flows: list[dict[int, object]] = []  # per group: id(instance) -> its flows as JSON
    for rows, base in zip(members, _number_flows(world, members)):
        found: dict[int, object] = {}
        if base is not None:
            ordered = sorted(rows, key=lambda r: (r[2].start_ns, r[2].rank))
            found = {id(r[2]): _flow_to_wire(f) for r, f in zip(ordered, group_flows(len(rows), base))}
        flows.append(found)
    if hook is None:
        for rows, found in zip(members, flows):
            for rank, idx, inst in rows:
                if id(inst) in found:
                    back[holder[rank]].append(["instance", rank, idx, None, None, False, found[id(inst)]])
        return back
    matched = [measure([r[2] for r in rows], coverage, seqs) for rows in members]
    keys = [(m.first_start_ns, m.pg_uid, m.seq, (rows[0][0], rows[0][2].start_ns, rows[0][2].seq, rows[0][1]))
            for m, rows in zip(matched, members)]
    place = {id(m): (k, rows, found) for m, k, rows, found in zip(matched, keys, members, flows)}
    order = sorted(range(len(matched)), key=keys.__getitem__)
    matched = [matched[k] for k in order]
    del keys, order, flows
    pooled = [tuple(row) for part in from_everyone(world, lambda: {"skews": skews(matched)}) for row in part["skews"]]
    flag_stragglers(matched, coverage, hook.straggler_min_skew_us, pooled)
    del pooled
    for m in matched:
        m.findings.extend(check(m))
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
    for m in matched:
        key, rows, found = place[id(m)]
        findings += [[list(key), k, [str(f.kind), *list(astuple(f))[1:]]] for k, f in enumerate(m.findings)]
        for k, mk in enumerate(markers([m])):
            back[holder[mk.rank]].append(["marker", [mk.ts_ns, mk.rank, *key, k], mk.rank, mk.ts_ns, mk.name, mk.args])
        tables.append(collective_figures(m))
        figures = len(tables) - 1
        waits = m.waits_ns
        taken = {id(inst) for inst in m.members.values()}
        for rank, idx, inst in rows:
            flow = found.get(id(inst))
            if id(inst) in taken:
                back[holder[rank]].append(["instance", rank, idx, figures, to_us(waits[rank]) if rank in waits
                                           else None, m.straggler and rank == m.last_rank, flow])
            elif flow is not None:
                back[holder[rank]].append(["instance", rank, idx, None, None, False, flow])
        ranks = list(m.members)
        lead.append([list(key), m.collective, m.complete, m.last_rank, m.first_start_ns, m.last_start_ns, ranks,
                     [m.members[r].start_ns for r in ranks], [m.members[r].end_ns for r in ranks]])
    busbw, series = _busbw_counters(world, matched, place)
    outcome.annotations = TraceAnnotations(counters=busbw)
    del place, members
    impact_rows = _to_lead(world, lead, "impact")
    del lead, matched
    everyone_findings = _to_lead(world, findings, "findings")
    every_attached = {g for part in from_everyone(world, lambda: {"attached": attached}) for g in part["attached"]}
    result: Optional[Analysis] = None
    counters: list[CounterSeries] = []
    if world.index == 0:
        result = _lead_result(impact_rows, everyone_findings, [g for k, g in enumerate(gaps) if k not in every_attached],
                              coverage, series)
        counters = impact_counters(result.impact)
    del impact_rows
    shared = from_everyone(world, lambda: {"impact": [[c.rank, c.track, c.points, c.unit] for c in counters]})[0]
    outcome.annotations.counters += [CounterSeries(rank, track, [tuple(p) for p in points], unit)
                                     for rank, track, points, unit in shared["impact"]]
    outcome.analysis = result
    hook.result = result
    return back


def _flow_to_wire(found) -> object:
    """A member's flows (:func:`commtag.merge.pftrace.lanes.group_flows`) as JSON: an id, or [first out, count, into]."""
    if found.__class__ is int:
        return found
    out, into = found
    return [None if out is None else out.start, 0 if out is None else len(out), None if into is None else list(into)]


def _number_flows(world: World, members: list[list]) -> list[Optional[int]]:
    """Each group's flows numbered after those of every group one process meets first (by its
    first member as read: rank, place); None for a group with no flow (alone, or a rank twice)."""
    counts = []
    for rows in members:
        n = len(rows)
        if n >= 2 and len({r[0] for r in rows}) == n:
            counts.append([min(r[:2] for r in rows), flows_of(n)])
    every = sorted((tuple(first), n) for part in from_everyone(world, lambda: {"counts": counts})
                   for first, n in part["counts"])
    before: dict[tuple[int, int], int] = {}
    total = 0
    for first, n in every:
        before[first] = total
        total += n
    del every
    out: list[Optional[int]] = []
    for rows in members:
        n = len(rows)
        out.append(before[min(r[:2] for r in rows)] if n >= 2 and len({r[0] for r in rows}) == n else None)
    return out


def _busbw_counters(world: World, matched: list[MatchedCollective],
                    place: dict) -> tuple[list[CounterSeries], dict[str, list[tuple[int, float]]]]:
    """Every group's busbw counter, from every worker's transfers: on its lowest member, named
    after the lane of its first collective in one process's order; and the series by group."""
    named: dict[str, list] = {}
    for m in matched:
        first = named.setdefault(m.pg_uid, [list(place[id(m)][0]), m.lane_name or m.pg_uid, m.first_rank, []])
        first[2] = min(first[2], *m.members)
    for pg, edges in busbw_edges(matched).items():
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


class _Member:
    """A member's times, all the impact replay reads of an instance."""

    __slots__ = ("start_ns", "end_ns")

    def __init__(self, start_ns: int, end_ns: int) -> None:
        self.start_ns, self.end_ns = start_ns, end_ns


@dataclass(slots=True)
class _Timed:
    """A matched collective as the impact replay reads it (:class:`commtag.merge.analysis.impact.MatchedCollective`)."""

    collective: str
    complete: bool
    last_rank: Optional[int]
    first_start_ns: int
    last_start_ns: int
    members: dict[int, _Member]


def _lead_result(impact_rows: list, findings: list, unattached: list[Finding], coverage: Coverage,
                 busbw: dict[str, list[tuple[int, float]]]) -> Analysis:
    """The lead's analysis of the whole job: the findings in one process's order, the impact
    replay over every collective's member times, the busbw series (no matched collectives: those
    stayed with the workers that matched them)."""
    impact_rows.sort(key=lambda row: row[0])
    timed = [_Timed(collective, complete, last, first, lastst,
                    {r: _Member(s, e) for r, s, e in zip(ranks, starts, ends)})
             for _, collective, complete, last, first, lastst, ranks, starts, ends in impact_rows]
    impact_rows.clear()
    replayed = impact(timed, coverage)  # type: ignore[arg-type]
    del timed
    findings.sort(key=lambda row: (row[0], row[1]))
    listed = [Finding(FindingKind(kind), pg, lane, seq, replay, p2p, tuple(ranks), tuple(fields), detail, desync)
              for _, _, (kind, pg, lane, seq, replay, p2p, ranks, fields, detail, desync) in findings]
    return Analysis([], listed + unattached, busbw, [], coverage, replayed)
