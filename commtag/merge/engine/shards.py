"""The analysis shared out between merge workers: each match part of each lane is matched and
analysed by one worker, and each worker holds only its own ranks' records and those of the parts
it analyses.

Why: a worker that received every rank's records held the whole job's (a 1,024-rank merge's
workers each held as much as one process merging alone), and every worker decoded and
analysed all of them: ``-j`` and torchrun divided the time of reading, not the memory.

How, once each worker has written its ranks (it keeps their instances, :class:`Held`; the
others get each rank's summary without them, :func:`hold`):

1. A lane's collectives are matched in parts (:func:`commtag.merge.records.match_part`: by Seq
   modulo 64; p2p transfers and collectives without metadata in one more). A lane one worker
   holds stays with it, whole; the parts of the others are dealt out (:class:`Owners`). Every
   worker works this out alike, from the summaries.
2. Each worker sends the instances it holds to their part's worker, in rounds of at most
   :func:`commtag.merge.engine.rounds.piece_rows` (:func:`commtag.merge.engine.rounds.route`).
3. What a part's analysis needs beyond its own instances comes as numbers: the Seq checks see
   every Seq of the group (a gap or a skipped member is found from the Seqs around it), the
   straggler noise every worker's skews, and a group's busbw counter is made by one worker from
   every worker's transfers. Each worker analyses its parts' instances in the order one process
   has them (by rank, then as read) and numbers each part's cross-rank flows in its own scope
   (:func:`commtag.merge.pftrace.lanes.lane_flows`).
4. What the writer of an instance needs goes back to the worker holding it: the args the
   analysis added, its flows, and the markers and counters of that worker's ranks, each with the
   place it takes in one process's order (:class:`Written`).
5. Every worker gets the findings (few) for the result; the lead reports them.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional

from commtag.merge.analysis.analyze import (
    Analysis, Finding, MergeAnalysis, SeqRun, annotate, busbw_counter, busbw_edges, busbw_series, conclude, markers,
    measure, seq_issued, seq_runs, trace_annotations,
)
from commtag.merge.engine.exchange import all_done, from_wire, to_wire
from commtag.merge.engine.rounds import flow_from_wire, flow_to_wire, piece_rows, pieces, route
from commtag.merge.pftrace.lanes import InstanceFlows, lane_flows
from commtag.merge.rank.attach import settle_inferred
from commtag.merge.records import (
    MATCH_PARTS, CollectiveInstance, CounterSeries, Coverage, GroupLane, Interner, Marker, RankSummary, match_part,
)

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World

@dataclass
class Held:
    """This worker's ranks' instances (rank -> in the order read) and their lanes' kernel annotations."""

    instances: dict[int, list[CollectiveInstance]] = field(default_factory=dict)
    lane_kernels: dict[tuple[int, str], dict] = field(default_factory=dict)

    def ordered(self) -> list[CollectiveInstance]:
        """Every held instance, by rank, then as read."""
        return [inst for rank in sorted(self.instances) for inst in self.instances[rank]]


def hold(summaries: list[RankSummary], held: Held, holder: int) -> list[RankSummary]:
    """The summaries without their instances and kernel annotations, which go into ``held``."""
    for s in summaries:
        s.holder = holder
        held.instances[s.rank], s.instances = s.instances, []
        held.lane_kernels.update(((s.rank, lane), args) for lane, args in s.lane_kernels.items())
        s.lane_kernels = {}
    return summaries


class Owners:
    """Which worker analyses each match part of each lane (:func:`commtag.merge.records.match_part`).

    A lane whose instances one worker holds stays there, whole; the parts of the others are dealt
    out, heaviest first, to the least loaded worker (a part's weight: its lane's instances in it,
    those by Seq taken as even). Every worker works this out alike, from the summaries."""

    def __init__(self, everyone: list[RankSummary], size: int) -> None:
        holders: dict[str, set[int]] = {}
        counts: dict[str, list[int]] = {}
        for s in everyone:
            for name, _, _, count, whole in s.lanes_used:
                holders.setdefault(name, set()).add(s.holder)
                total = counts.setdefault(name, [0, 0])
                total[0] += count
                total[1] += whole
        load = [0.0] * size
        #: Lane -> the one worker holding (and analysing) all of it.
        self.lanes: dict[str, int] = {}
        #: (lane, part) -> its worker, for the lanes several workers hold.
        self.parts: dict[tuple[str, int], int] = {}
        units: list[tuple[tuple[str, int], float]] = []
        alone: list[tuple[str, int]] = []  # lanes matched in part -1 alone: dealt out whole
        for name, who in holders.items():
            count, whole = counts[name]
            if len(who) == 1:
                self.lanes[name] = next(iter(who))
                load[self.lanes[name]] += count
            elif whole == count:
                alone.append((name, count))
            else:
                units += [((name, -1), float(whole))] + [((name, p), (count - whole) / MATCH_PARTS)
                                                        for p in range(MATCH_PARTS)]
        for name, count in sorted(alone, key=lambda lane: (-lane[1], lane[0])):
            self.lanes[name] = min(range(size), key=lambda w: (load[w], w))
            load[self.lanes[name]] += count
        for unit, weight in sorted(units, key=lambda u: (-u[1], u[0])):
            self.parts[unit] = min(range(size), key=lambda w: (load[w], w))
            load[self.parts[unit]] += weight
        #: Lane -> the workers analysing some part of it.
        self.of_lane: dict[str, set[int]] = {name: {w} for name, w in self.lanes.items()}
        for (name, _), w in self.parts.items():
            self.of_lane.setdefault(name, set()).add(w)

    def __call__(self, lane: str, part: int) -> int:
        found = self.lanes.get(lane)
        return self.parts[(lane, part)] if found is None else found


@dataclass
class Written:
    """What this worker's lanes blocks need: its instances' flows, and its ranks' counters and
    markers, in the order one process writes them."""

    flows: InstanceFlows = field(default_factory=dict)
    counters: list[CounterSeries] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    #: Every worker's findings, in one process's order (for the result).
    findings: list[Finding] = field(default_factory=list)
    #: With one worker: the whole analysis.
    analysis: Optional[Analysis] = None
    #: Instances other workers sent here to analyse.
    received: int = 0


def analyse(world: World, held: Held, everyone: list[RankSummary], hook: Optional[MergeAnalysis],
            coverage: Coverage, orders: dict[str, int], interner: Interner) -> Written:
    """Steps 1 to 5 of the module docstring; ``orders``: lane name -> its place in the lane order."""
    owner = Owners(everyone, world.size)
    holder = {s.rank: s.holder for s in everyone}
    me = world.index
    shard: list[tuple[int, int, CollectiveInstance]] = []
    foreign: set[int] = set()  # ids of the instances other workers sent
    runs: list[SeqRun] = []  # of the lanes this worker analyses
    refs: dict[str, tuple] = {}  # pg -> ((rank, idx), lane, lane id, ranks, whole) of its first instance

    def arrived(piece: dict) -> None:
        for s, places in zip(from_wire(piece, interner), piece["places"]):
            for idx, inst in zip(places, s.instances):
                shard.append((s.rank, idx, inst))
                foreign.add(id(inst))

    def seqs_arrived(piece: dict) -> None:
        runs.extend(tuple(run) for run in piece["runs"])
        for pg, rank, idx, lane, lane_id, ranks, whole in piece["refs"]:
            _first(refs, pg, ((rank, idx), lane, lane_id, interner.shared(tuple(ranks)), whole))

    for rank, insts in held.instances.items():
        shard += [(rank, idx, i) for idx, i in enumerate(insts) if owner(i.lane_name, match_part(i)) == me]
    # The Seq runs first: the instances sent away are dropped here until they come back analysed.
    seqs = [list(_seqs_for(held, owner, w, coverage, piece_rows(world.size))) if hook is not None else []
            for w in range(world.size)]
    size = piece_rows(world.size)
    route(world, [_instances_for(held, owner, w, size) for w in range(world.size)], arrived)
    shard.sort(key=lambda t: (t[0], t[1]))
    instances = [inst for _, _, inst in shard]
    settle_inferred(instances)
    written = Written(received=len(foreign))
    keyed: list[tuple[tuple, Marker]] = []
    series: list[list] = []
    if hook is not None:
        route(world, [iter(out) for out in seqs], seqs_arrived)
        for piece in seqs[me]:  # its own ranks' of the lanes it shares
            seqs_arrived(piece)
        del seqs
        whole_lanes = [inst for inst in instances if inst.lane_name in owner.lanes]  # all of them here
        runs += seq_runs(whole_lanes, coverage)
        for rank, idx, inst in shard:
            if seq_issued(inst) and inst.lane_name in owner.lanes:
                _first(refs, inst.pg_uid, ((rank, idx), inst.lane_name, inst.lane_id, inst.group_ranks,
                                           match_part(inst) == -1))
        groups = {pg: GroupLane(lane, lane_id, pg, ranks) for pg, (_, lane, lane_id, ranks, _) in refs.items()}
        whole = {pg for pg, ref in refs.items() if ref[4]}
        measured = measure(instances, coverage, runs, groups)
        del whole_lanes, runs
        skews = measured.skews()
        for part in all_done(world, lambda: {"skews": skews}):
            skews += [] if part is None else [tuple(row) for row in part["skews"]]
        result = conclude(measured, coverage, hook.straggler_min_skew_us, skews, lambda pg, seq: owner(
            groups[pg].lane_name, -1 if pg in whole else seq % MATCH_PARTS) == me)
        annotate(result)
        # One process's order: by first start, group and Seq, then (where a p2p transfer and a collective of
        # one group, analysed on two workers, tie) by their first member as its matching meets them.
        ordered = [(m.first_start_ns, m.pg_uid, m.seq, min((i.rank, i.start_ns, i.seq) for i in m.members.values()), n)
                   for n, m in enumerate(result.collectives)]
        for key, m in zip(ordered, result.collectives):
            keyed += [((mk.ts_ns, mk.rank, *key, k), mk) for k, mk in enumerate(markers([m]))]
        series = _busbw_parts(result)
        findings = _keyed_findings(result, ordered)
        written.analysis = result if world.size == 1 else None
        del measured, result, ordered  # their matched collectives hold every instance analysed here
    flows = lane_flows(instances, orders)
    del instances
    analysed: list[list[tuple]] = [[] for _ in range(world.size)]  # (rank, idx, instance, flow) to go back
    for rank, idx, inst in shard:
        flow = flows.pop(id(inst), None)
        if id(inst) in foreign:
            analysed[holder[rank]].append((rank, idx, inst, flow_to_wire(flow)))
        elif flow is not None:
            written.flows[id(inst)] = flow
    shard.clear()
    foreign.clear()
    del flows
    notes: list[dict] = [{"markers": [], "counters": []} for _ in range(world.size)]
    for key, mk in keyed:
        notes[holder[mk.rank]]["markers"].append([list(key), mk.rank, mk.ts_ns, mk.name, mk.args])
    for pg, c in _busbw_counters(world, owner, series):
        notes[holder[c.rank]]["counters"].append([pg, c.rank, c.track, c.points, c.unit, c.lane])
    got: list[dict] = [notes[me]]
    route(world, [itertools.chain(_returned(analysed[w], size), pieces(notes[w], _NOTES, size)) if w != me else iter(())
                  for w in range(world.size)], got.append)
    del analysed, notes
    _apply(held, got, written)
    if hook is not None:
        windows = Coverage({r: coverage.windows[r] for r in held.instances if r in coverage.windows},
                           coverage.world_size)
        written.markers += trace_annotations(Analysis([], [], {}, [], windows)).markers
        written.findings = _gather_findings(world, findings)
    return written


#: The lists of what goes back to the worker holding an instance besides the instance itself.
_NOTES = ("markers", "counters")


def _first(refs: dict[str, tuple], pg: str, ref: tuple) -> None:
    """Keep the first (by rank, then place) of a group's instances' lane and members."""
    if pg not in refs or ref[0] < refs[pg][0]:
        refs[pg] = ref


def _returned(analysed: list[tuple], size: int) -> Iterator[dict]:
    """The analysed instances of another worker's ranks, in pieces of at most ``size``, each with
    its place among its rank's and its flows; each piece's are dropped here once it is sent (the
    instances that come back to this worker meanwhile take their room)."""
    for at in range(0, len(analysed), size):
        by_rank: dict[int, list[tuple]] = {}
        for rank, idx, inst, flow in analysed[at:at + size]:
            by_rank.setdefault(rank, []).append((idx, inst, flow))
        piece = {**to_wire([RankSummary(rank, "", None, [], instances=[inst for _, inst, _ in rows])
                            for rank, rows in by_rank.items()]),
                 "places": [[idx for idx, _, _ in rows] for rows in by_rank.values()],
                 "flows": [[flow for _, _, flow in rows] for rows in by_rank.values()]}
        del by_rank
        analysed[at:at + size] = [()] * len(analysed[at:at + size])
        yield piece


def _apply(held: Held, got: list[dict], written: Written) -> None:
    """Put the analysed instances that came back in their places, with their flows; and keep
    the markers and counters, each in one process's order."""
    own_markers: list[tuple] = []
    counters: list[tuple[str, CounterSeries]] = []
    for part in got:
        if "summaries" in part:  # decoded with an interner of its own: what it shares is in it
            for s, places, flows in zip(from_wire(part, Interner()), part["places"], part["flows"]):
                for inst, idx, flow in zip(s.instances, places, flows):
                    held.instances[s.rank][idx] = inst
                    if flow is not None:
                        written.flows[id(inst)] = flow_from_wire(flow)
        own_markers += [(tuple(key), Marker(rank, ts, name, args)) for key, rank, ts, name, args in part.get("markers", ())]
        counters += [(pg, CounterSeries(rank, track, [tuple(point) for point in points], unit, lane))
                     for pg, rank, track, points, unit, lane in part.get("counters", ())]
        part.clear()
    written.markers = [mk for _, mk in sorted(own_markers, key=lambda pair: pair[0])]
    written.counters = [c for _, c in sorted(counters, key=lambda pair: pair[0])]


def _busbw_parts(result: Analysis) -> list[list]:
    """Per group this worker matched some of: [pg, lane, its name, its lowest member rank, busbw edges]."""
    found: dict[str, list] = {}
    for m in result.collectives:
        row = found.setdefault(m.pg_uid, [m.pg_uid, m.lane_name, m.lane_name or m.pg_uid, m.first_rank, []])
        row[3] = min(row[3], m.first_rank, *m.members)
    for pg, edges in busbw_edges(result.collectives).items():
        found[pg][4] = [list(edge) for edge in edges]
    return list(found.values())


def _busbw_counters(world: World, owner: Owners, parts: list[list]) -> list[tuple[str, CounterSeries]]:
    """Each group's busbw counter (with its pg), made by the worker of its lane's part -1 from every
    worker's edges (its transfers overlap whichever worker measured them)."""
    gathered: list[list] = [row for row in parts if owner(row[1], -1) == world.index]
    route(world, [pieces({"busbw": [row for row in parts if owner(row[1], -1) == w]}, ("busbw",), piece_rows(world.size))
                  for w in range(world.size)], lambda piece: gathered.extend(piece["busbw"]))
    by_pg: dict[str, list] = {}
    for pg, _, name, rank, edges in gathered:
        row = by_pg.setdefault(pg, [name, rank, []])
        row[1] = min(row[1], rank)
        row[2] += [tuple(edge) for edge in edges]
    made = busbw_series({pg: row[2] for pg, row in by_pg.items() if row[2]})
    return [(pg, busbw_counter(by_pg[pg][1], by_pg[pg][0], points)) for pg, points in sorted(made.items())]


def _instances_for(held: Held, owner: Owners, worker: int, size: int) -> Iterator[dict]:
    """Pieces of at most ``size`` of the held instances ``worker`` analyses; once a piece is
    sent its instances are dropped here (``None`` in their place until they come back analysed)."""
    summaries: list[RankSummary] = []
    places: list[list[int]] = []
    count = 0

    def sent() -> Iterator[dict]:
        yield {**to_wire(summaries), "places": places}
        for s, where in zip(summaries, places):
            for idx in where:
                held.instances[s.rank][idx] = None  # type: ignore[call-overload]

    for rank in sorted(held.instances):
        chosen = [(idx, i) for idx, i in enumerate(held.instances[rank]) if owner(i.lane_name, match_part(i)) == worker]
        for at in range(0, len(chosen), size):
            run = chosen[at:at + size]
            if count + len(run) > size and summaries:
                yield from sent()
                summaries, places, count = [], [], 0
            summaries.append(RankSummary(rank, "", None, [], instances=[inst for _, inst in run]))
            places.append([idx for idx, _ in run])
            count += len(run)
    if summaries:
        yield from sent()


def _seqs_for(held: Held, owner: Owners, worker: int, coverage: Coverage, size: int) -> Iterator[dict]:
    """The Seq runs (:func:`commtag.merge.analysis.analyze.seq_runs`) of the held ranks in the
    lanes ``worker`` analyses parts of and shares with others, and each group's first instance
    here: a few numbers per rank and group, where its instances were thousands."""
    chosen: list[CollectiveInstance] = []
    refs: list[list] = []
    named: set[str] = set()
    for rank in sorted(held.instances):
        for idx, inst in enumerate(held.instances[rank]):
            lane = inst.lane_name
            if lane in owner.lanes or worker not in owner.of_lane[lane] or not seq_issued(inst):
                continue
            chosen.append(inst)
            if inst.pg_uid not in named:
                named.add(inst.pg_uid)
                refs.append([inst.pg_uid, rank, idx, lane, inst.lane_id, inst.group_ranks, match_part(inst) == -1])
    runs = [list(run) for run in seq_runs(chosen, coverage)]
    yield from pieces({"runs": runs, "refs": refs}, ("runs",), size)


def _keyed_findings(result: Analysis, ordered: list[tuple]) -> list[tuple[tuple, Finding]]:
    """Each finding with its place in one process's list: by collective (``ordered``: each one's
    place in one process's order), then the Seq gaps no recorded collective holds, by group and Seq."""
    out: list[tuple[tuple, Finding]] = []
    attached = set()
    for key, m in zip(ordered, result.collectives):
        for k, f in enumerate(m.findings):
            out.append(((0, *key, k), f))
            attached.add(id(f))
    out += [((1, f.pg_uid, f.seq), f) for f in result.findings if id(f) not in attached]
    return out


def _gather_findings(world: World, findings: list[tuple[tuple, Finding]]) -> list[Finding]:
    every = list(findings)
    for part in all_done(world, lambda: {"findings": [[list(key), dataclasses.astuple(f)] for key, f in findings]}):
        if part is not None:
            every += [(tuple(key), Finding(kind, pg, lane, seq, replay, p2p, tuple(ranks), tuple(fields), detail, desync))
                      for key, (kind, pg, lane, seq, replay, p2p, ranks, fields, detail, desync) in part["findings"]]
    return [f for _, f in sorted(every, key=lambda pair: pair[0])]

