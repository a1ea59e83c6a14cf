"""The analysis shared out between merge workers: each lane's collectives are matched and analysed
by one worker, and each worker holds only its own ranks' records and those of the lanes it analyses.

Why: a worker that received every rank's records held the whole job's (a 1,024-rank merge's
workers each held as much as one process merging alone), and every worker decoded and
analysed all of them: ``-j`` and torchrun divided the time of reading, not the memory.

How, once each worker has written its ranks (it keeps their instances, :class:`Held`; the
others get each rank's summary without them, :func:`hold`):

1. Each lane (a process group's, the unit every match, Seq and figure of the analysis stays
   within) goes to one worker (:func:`owners`): a lane whose instances one worker holds stays
   there; the others are dealt out largest first to the least loaded worker. Every worker
   works this out alike, from the summaries.
2. Each worker sends the instances it holds to their lane's worker, in rounds of at most
   :data:`ROUND_INSTANCES` (:func:`route`: what a round brings is all a worker decodes at once).
3. Each worker analyses its lanes' instances in the order one process has them (by rank, then
   as read); the straggler noise is the run's, so the skews of every worker's collectives are
   gathered first. It numbers each lane's cross-rank flows in the lane's own scope
   (:func:`commtag.merge.pftrace.lanes.lane_flows`).
4. What the writer of an instance needs goes back to the worker holding it: the args the
   analysis added, its flows, and the markers and counters of that worker's ranks, each with the
   place it takes in one process's order (:class:`Written`).
5. Every worker gets the findings (few) for the result; the lead reports them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import orjson

from commtag.merge.analysis.analyze import (
    Analysis, Finding, MergeAnalysis, annotate, conclude, markers, measure, trace_annotations,
)
from commtag.merge.engine.exchange import all_done, from_wire, to_wire
from commtag.merge.errors import MergeInputError
from commtag.merge.pftrace.lanes import InstanceFlows, lane_flows
from commtag.merge.rank.attach import settle_inferred
from commtag.merge.records import CollectiveInstance, CounterSeries, Coverage, Interner, Marker, RankSummary

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World

#: Instances a worker sends to one other worker per round (about 250 bytes each on the wire).
ROUND_INSTANCES = 8192


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


def owners(everyone: list[RankSummary], size: int) -> dict[str, int]:
    """Lane name -> the worker analysing it (see the module docstring)."""
    holders: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for s in everyone:
        for name, _, _, count in s.lanes_used:
            holders.setdefault(name, set()).add(s.holder)
            counts[name] = counts.get(name, 0) + count
    load = [0] * size
    found: dict[str, int] = {}
    for name, who in holders.items():
        if len(who) == 1:
            found[name] = next(iter(who))
            load[found[name]] += counts[name]
    for name in sorted((n for n, who in holders.items() if len(who) > 1), key=lambda n: (-counts[n], n)):
        found[name] = min(range(size), key=lambda w: (load[w], w))
        load[found[name]] += counts[name]
    return found


def route(world: World, sources: list[Iterator[dict]], receive: Callable[[dict], None]) -> None:
    """Send what ``sources[w]`` yields to worker ``w``, one piece per worker per round, and give
    ``receive`` each piece sent here, until no worker has any left. A blob is a JSON header (each
    piece's length, whether more follow) and the pieces: a worker parses only its own."""
    if world.size == 1:
        return
    while True:
        pieces = [b"" if w == world.index or (piece := next(source, None)) is None else orjson.dumps(piece)
                  for w, source in enumerate(sources)]
        more = any(pieces)
        blobs = world.all_gather_bytes(orjson.dumps({"sizes": [len(p) for p in pieces], "more": more}) + b"\n"
                                       + b"".join(pieces))
        del pieces
        for w in range(len(blobs)):
            blob, blobs[w] = blobs[w], b""
            if w == world.index:
                continue
            cut = blob.find(b"\n")  # none: all_done's word of an error (a worker stopped in another step)
            head = orjson.loads(blob if cut < 0 else blob[:cut])
            if "error" in head:
                raise MergeInputError(*head["error"])
            more = more or head["more"]
            at = cut + 1 + sum(head["sizes"][:world.index])
            if head["sizes"][world.index]:
                receive(orjson.loads(memoryview(blob)[at:at + head["sizes"][world.index]]))
        if not more:
            return


@dataclass
class Written:
    """What this worker's lanes block needs: its instances' flows, and its ranks' counters and
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
    owner = owners(everyone, world.size)
    holder = {s.rank: s.holder for s in everyone}
    shard: list[tuple[int, int, CollectiveInstance]] = []
    foreign: dict[int, tuple] = {}  # id -> (args, common args, pg uid) as received

    def arrived(piece: dict) -> None:
        for s, places in zip(from_wire(piece, interner), piece["places"]):
            for idx, inst in zip(places, s.instances):
                shard.append((s.rank, idx, inst))
                foreign[id(inst)] = (dict(inst.args), inst.common_args, inst.pg_uid)

    for rank, insts in held.instances.items():
        shard += [(rank, idx, inst) for idx, inst in enumerate(insts) if owner[inst.lane_name] == world.index]
    route(world, [_instances_for(held, owner, w) for w in range(world.size)], arrived)
    shard.sort(key=lambda t: (t[0], t[1]))
    instances = [inst for _, _, inst in shard]
    settle_inferred(instances)
    written = Written(received=len(foreign))
    keyed: list[tuple[tuple, Marker]] = []
    counters: list[tuple[str, CounterSeries]] = []
    if hook is not None:
        measured = measure(instances, coverage)
        skews = measured.skews()
        for part in all_done(world, lambda: {"skews": skews}):
            skews += [] if part is None else [tuple(row) for row in part["skews"]]
        result = conclude(measured, coverage, hook.straggler_min_skew_us, skews)
        annotate(result)
        for i, m in enumerate(result.collectives):
            place = (m.first_start_ns, m.pg_uid, m.seq, i)
            keyed += [((mk.ts_ns, mk.rank, *place, k), mk) for k, mk in enumerate(markers([m]))]
        # The counters alone: each worker adds its own ranks' windows (Coverage({}): none here).
        series = trace_annotations(dataclasses.replace(result, coverage=Coverage({}))).counters
        counters = list(zip(sorted(result.busbw), series))  # one per group, in the groups' order
        findings = _keyed_findings(result)
        written.analysis = result if world.size == 1 else None
    flows = lane_flows(instances, orders)
    del instances
    back: list[dict] = [{"instances": [], "markers": [], "counters": [], "common": []} for _ in range(world.size)]
    shared: list[dict[int, int]] = [{} for _ in range(world.size)]
    for rank, idx, inst in shard:
        flow = flows.pop(id(inst), None)
        before = foreign.get(id(inst))
        if before is None:
            if flow is not None:
                written.flows[id(inst)] = flow
            continue
        args, common, uid = before
        to = holder[rank]
        added = {k: v for k, v in inst.args.items() if k not in args or args[k] != v}
        figures = {k: v for k, v in inst.common_args.items() if k not in common or common[k] != v}
        ref = shared[to].setdefault(id(inst.common_args), len(back[to]["common"]))
        if ref == len(back[to]["common"]):
            back[to]["common"].append(figures)
        back[to]["instances"].append([rank, idx, ref, added or None, None if inst.pg_uid == uid else inst.pg_uid,
                                      _flow_to_wire(flow)])
    shard.clear()
    foreign.clear()
    del flows
    for key, mk in keyed:
        back[holder[mk.rank]]["markers"].append([list(key), mk.rank, mk.ts_ns, mk.name, mk.args])
    for pg, c in counters:
        back[holder[c.rank]]["counters"].append([pg, c.rank, c.track, c.points, c.unit, c.lane])
    mine = back[world.index]
    back[world.index] = {}
    got: list[dict] = [mine]
    route(world, [_pieces(part) if w != world.index else iter(()) for w, part in enumerate(back)], got.append)
    del back
    cached: dict[tuple[int, int, int], dict] = {}
    own_markers: list[tuple] = []
    own_counters: list[tuple] = []
    for n, part in enumerate(got):
        for rank, idx, ref, added, uid, flow in part.get("instances", ()):
            inst = held.instances[rank][idx]
            if uid is not None:
                inst.pg_uid = uid
            if added:
                inst.args.update(added)
            key = (n, id(inst.common_args), ref)
            joined = cached.get(key)
            if joined is None:
                joined = cached[key] = {**inst.common_args, **part["common"][ref]}
            inst.common_args = joined
            if flow is not None:
                written.flows[id(inst)] = _flow_from_wire(flow)
        own_markers += [(tuple(key), Marker(rank, ts, name, args)) for key, rank, ts, name, args in part.get("markers", ())]
        own_counters += [(pg, CounterSeries(rank, track, [tuple(p) for p in points], unit, lane))
                         for pg, rank, track, points, unit, lane in part.get("counters", ())]
        part.clear()
    if hook is not None:
        written.markers = [mk for _, mk in sorted(own_markers, key=lambda pair: pair[0])]
        windows = Coverage({r: coverage.windows[r] for r in held.instances if r in coverage.windows},
                           coverage.world_size)
        written.markers += trace_annotations(Analysis([], [], {}, [], windows)).markers
        written.counters = [c for _, c in sorted(own_counters, key=lambda pair: pair[0])]
        written.findings = _gather_findings(world, findings)
    return written


def _instances_for(held: Held, owner: dict[str, int], worker: int) -> Iterator[dict]:
    """Pieces of at most ROUND_INSTANCES of the held instances ``worker`` analyses."""
    summaries: list[RankSummary] = []
    places: list[list[int]] = []
    count = 0
    for rank in sorted(held.instances):
        chosen = [(idx, inst) for idx, inst in enumerate(held.instances[rank]) if owner[inst.lane_name] == worker]
        for at in range(0, len(chosen), ROUND_INSTANCES):
            run = chosen[at:at + ROUND_INSTANCES]
            if count + len(run) > ROUND_INSTANCES and summaries:
                yield {**to_wire(summaries), "places": places}
                summaries, places, count = [], [], 0
            summaries.append(RankSummary(rank, "", None, [], instances=[inst for _, inst in run]))
            places.append([idx for idx, _ in run])
            count += len(run)
    if summaries:
        yield {**to_wire(summaries), "places": places}


def _pieces(part: dict) -> Iterator[dict]:
    """``part``'s lists in pieces of at most ROUND_INSTANCES rows each (the shared args with every piece)."""
    rows = max(len(part[name]) for name in ("instances", "markers", "counters"))
    for at in range(0, max(rows, 1), ROUND_INSTANCES):
        yield {"common": part["common"], **{name: part[name][at:at + ROUND_INSTANCES]
                                            for name in ("instances", "markers", "counters")}}


def _flow_to_wire(flow: object) -> object:
    if flow is None or flow.__class__ is int:
        return flow
    out, into = flow
    return [None if out is None else [out.start, out.stop], None if into is None else list(into)]


def _flow_from_wire(flow: object) -> object:
    if flow.__class__ is int:
        return flow
    out, into = flow
    return (None if out is None else range(*out), None if into is None else tuple(into))


def _keyed_findings(result: Analysis) -> list[tuple[tuple, Finding]]:
    """Each finding with its place in one process's list: by collective (as sorted), then the Seq
    gaps no recorded collective holds, by group and Seq."""
    out: list[tuple[tuple, Finding]] = []
    attached = set()
    for i, m in enumerate(result.collectives):
        for k, f in enumerate(m.findings):
            out.append(((0, m.first_start_ns, m.pg_uid, m.seq, i, k), f))
            attached.add(id(f))
    out += [((1, f.pg_uid, "", f.seq, 0, 0), f) for f in result.findings if id(f) not in attached]
    return out


def _gather_findings(world: World, findings: list[tuple[tuple, Finding]]) -> list[Finding]:
    every = list(findings)
    for part in all_done(world, lambda: {"findings": [[list(key), dataclasses.astuple(f)] for key, f in findings]}):
        if part is not None:
            every += [(tuple(key), Finding(kind, pg, lane, seq, replay, p2p, tuple(ranks), tuple(fields), detail, desync))
                      for key, (kind, pg, lane, seq, replay, p2p, ranks, fields, detail, desync) in part["findings"]]
    return [f for _, f in sorted(every, key=lambda pair: pair[0])]

