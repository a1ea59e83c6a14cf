"""This worker's ranks' instances between the analysis and their lanes, and what comes back for them.

A caller's own analysis hook runs over every rank's instances before the analysis, on every
worker (:func:`run_hook`): each keeps its own ranks' with what the hook wrote into their args.

Under a sharded analysis (:mod:`commtag.merge.engine.shards`) a worker's own instances are
held by (rank, lane) while other workers analyse them (packed where their rank's were,
:class:`commtag.merge.engine.routes.Carrier`); the figures, waits, flows and markers the
analysing workers send back (:func:`back_pieces`, :func:`apply`) are kept by place, and each
lane's instances are joined with them only when the lanes writer takes that lane (:class:`OwnLanes`).
"""

from __future__ import annotations

import base64
import math
from array import array
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from commtag.merge.engine.exchange import from_everyone
from commtag.merge.engine.options import AnalysisHook, Progress, Unshown
from commtag.merge.engine.routes import PIECE_ROWS, Carrier, packed, unpacked
from commtag.merge.pftrace.lanes import InstanceFlows
from commtag.merge.rank.attach import inferred_seqs, settle_inferred
from commtag.merge.records import CPU_OP_SOURCE, CollectiveInstance, Coverage, Interner, RankSummary, TraceAnnotations
from commtag.vocab import ANN_STRAGGLER, ANN_WAIT_US

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World


@dataclass
class Held:
    """This worker's ranks' instances, held as each rank is written (rank -> in the order read)
    by ``carrier`` (:func:`commtag.merge.engine.routes.carrier`: as objects, or packed beyond a
    worker's bound), their lanes' kernel annotations, and what every worker learns of every rank."""

    carrier: Carrier = field(default_factory=Carrier)
    records: dict[int, object] = field(default_factory=dict)
    lane_kernels: dict[tuple[int, str], dict] = field(default_factory=dict)
    #: Every rank's instance count and its lanes (:func:`commtag.merge.pftrace.lanes.lanes_used`).
    counts: dict[int, int] = field(default_factory=dict)
    used: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)
    #: This worker's ranks' instances timed by their CPU op, then the whole job's.
    timed_by_ops: int = 0
    #: This worker's ranks' metadata-less kernels' last Seqs, then every rank's.
    inferred: dict[str, dict[int, int]] = field(default_factory=dict)

    def take(self, summary: RankSummary) -> RankSummary:
        """``summary`` without its instances and kernel annotations, which stay here."""
        insts, summary.instances = summary.instances, []
        self.counts[summary.rank] = len(insts)
        self.timed_by_ops += sum(1 for i in insts if i.source == CPU_OP_SOURCE)
        for uid, per_rank in inferred_seqs(insts).items():
            self.inferred.setdefault(uid, {}).update(per_rank)
        self.records[summary.rank] = self.carrier.hold(summary.rank, insts)
        self.lane_kernels.update(((summary.rank, lane), args) for lane, args in summary.lane_kernels.items())
        summary.lane_kernels = {}
        return summary


def run_hook(world: World, held: Held, hook: AnalysisHook, coverage: Coverage,
             interner: Interner) -> Optional[TraceAnnotations]:
    """A caller's own :data:`AnalysisHook` on every worker, over every rank's instances in rank
    order, settled as the analysis settles them (with every rank's inferred Seqs, once
    :func:`commtag.merge.engine.shards.settle` has shared them); this worker's ranks' are held
    again with what the hook wrote into their args. What it returns is written by the workers
    holding the ranks its counters and markers are on."""
    mine = held.records
    by_rank = {rank: unpacked(kept, interner) for rank, kept in mine.items()}
    if world.size > 1:  # the other workers' ranks, packed to travel (a rank held packed goes as it is)
        for part in from_everyone(world, lambda: {"packed": [
                [rank, base64.b64encode(kept if isinstance(kept, bytes) else packed(rank, by_rank[rank])).decode("ascii")]
                for rank, kept in mine.items()]}):
            for rank, blob in part["packed"]:
                if rank not in mine:
                    by_rank[rank] = unpacked(base64.b64decode(blob), interner)
    instances = [inst for rank in sorted(by_rank) for inst in by_rank[rank]]
    settle_inferred(instances, held.inferred)
    told = hook(instances, coverage)
    for rank, kept in mine.items():
        mine[rank] = Carrier.like(kept, rank, by_rank[rank])
    return told


class FlowColumn:
    """Members' flows as JSON (:func:`flow_to_wire`) by position: a bare id in an array (a star's
    members, most of a large group's, have one), anything else by position; 0: none or not an id."""

    def __init__(self) -> None:
        self.ids = array("Q")
        self.other: dict[int, object] = {}

    def append(self, flow: object) -> None:
        if type(flow) is int and 0 < flow < 1 << 64:  # as put() at the end, without growing by a gap
            self.ids.append(flow)
            return
        if flow is not None:
            self.other[len(self.ids)] = flow
        self.ids.append(0)

    def put(self, at: int, flow: object) -> None:
        """``flow`` at position ``at`` (the column grows to it)."""
        if at == len(self.ids):  # the next position, as most come: no gap to grow by
            self.append(flow)
            return
        if at > len(self.ids):
            self.ids.extend(array("Q", [0]) * (at + 1 - len(self.ids)))
        if type(flow) is int and 0 < flow < 1 << 64:  # a bare id (a bool is none)
            self.ids[at] = flow
        else:
            self.ids[at] = 0
            if flow is not None:
                self.other[at] = flow

    def __getitem__(self, at: int) -> object:
        found = self.ids[at]
        return found if found else self.other.get(at)


class MemberFigures:
    """Per member, by position: its collective's figures number (-1: none), its wait (NaN: none),
    straggler flag and flows, as columns grown to the positions put (a row object per member was
    most of a worker's memory at the analysis' end)."""

    def __init__(self) -> None:
        self.figures = array("q")
        self.waits = array("d")
        self.stragglers = bytearray()
        self.flows = FlowColumn()

    def put(self, at: int, figures: Optional[int], wait: Optional[float], straggler: bool, flow: object) -> None:
        if at == len(self.figures):  # the next position, as most come: no gap to grow by
            self.append(figures, wait, straggler, flow)
            return
        grow = at + 1 - len(self.figures)
        if grow > 0:
            self.figures.extend(array("q", [-1]) * grow)
            self.waits.extend(array("d", [math.nan]) * grow)
            self.stragglers.extend(bytes(grow))
        self.figures[at] = -1 if figures is None else figures
        self.waits[at] = math.nan if wait is None else wait
        self.stragglers[at] = straggler
        self.flows.put(at, flow)

    def append(self, figures: Optional[int], wait: Optional[float], straggler: bool, flow: object) -> None:
        """:meth:`put` at the end, without growing by a gap (a row per member sent back)."""
        self.figures.append(-1 if figures is None else figures)
        self.waits.append(math.nan if wait is None else wait)
        self.stragglers.append(straggler)
        self.flows.append(flow)

    def get(self, at: int) -> tuple[Optional[int], Optional[float], bool, object]:
        k, wait = self.figures[at], self.waits[at]
        return None if k < 0 else k, None if math.isnan(wait) else wait, bool(self.stragglers[at]), self.flows[at]


class FigureTables(list):
    """The figures tables of the collectives matched here, each distinct one once, by the number
    rows name it by: equal tables (types included) share a number, so it travels once and each
    lane joins it to a call site's common args once (:meth:`OwnLanes.pop`)."""

    def __init__(self) -> None:
        super().__init__()
        self._numbers: dict[tuple, int] = {}

    def number(self, figures: dict) -> int:
        """``figures``' number, given it when first seen."""
        key = (tuple(figures.items()), tuple(map(type, figures.values())))
        k = self._numbers.get(key)
        if k is None:
            k = self._numbers[key] = len(self)
            self.append(figures)
        return k


class BackRows:
    """What goes back to one worker: per member of a collective matched here, its rank, place and
    :class:`MemberFigures`; and the markers."""

    def __init__(self) -> None:
        self.markers: list[list] = []
        self._empty()

    def _empty(self) -> None:
        self.ranks = array("i")
        self.places = array("q")
        self.members = MemberFigures()

    def instance(self, rank: int, place: int, figures: Optional[int], wait: Optional[float], straggler: bool,
                 flow: object) -> None:
        self.members.append(figures, wait, straggler, flow)
        self.ranks.append(rank)
        self.places.append(place)

    def rows(self) -> Iterator[list]:
        """Each as the row :func:`apply` reads, ``["instance", rank, place, figures, wait, straggler,
        flow]``, then the markers; all let go once read."""
        for j, rank in enumerate(self.ranks):
            yield ["instance", rank, self.places[j], *self.members.get(j)]
        self._empty()
        markers, self.markers = self.markers, []
        markers.reverse()
        while markers:
            yield markers.pop()


def back_pieces(me: int, back: BackRows, tables: list[dict]) -> Iterator[dict]:
    """The rows going back to one worker in pieces, each with the figures its rows name that
    the worker has not been sent yet (a collective's figures travel once, not once per member:
    a 1,024-rank group's list of matched ranks is 5 KB)."""
    sent: set[int] = set()
    rows = back.rows()
    while True:
        piece = {"rows": list(islice(rows, PIECE_ROWS))}
        if not piece["rows"]:
            return
        needed = {row[3] for row in piece["rows"] if row[0] == "instance" and row[3] is not None} - sent
        sent |= needed
        yield {"from": me, "figures": [[k, tables[k]] for k in sorted(needed)], **piece}


def apply(piece: dict, lanes: OwnLanes, own_markers: list) -> None:
    """Figures, waits, flows and markers that came back for this worker's instances and ranks."""
    source = piece["from"]
    for k, table in piece["figures"]:
        lanes.figures[(source, k)] = table
    for row in piece["rows"]:
        if row[0] == "marker":
            own_markers.append((tuple(row[1]), row[2:]))
            continue
        _, rank, idx, k, wait, straggler, flow = row
        found = lanes.updates.get(rank)
        if found is None:
            found = lanes.updates[rank] = Updates()
        found.put(idx, source, k, wait, straggler, flow)


class Updates:
    """What came back for one rank's instances, by place: the sending worker (-2: nothing came)
    and the :class:`MemberFigures` (a tuple per member was, with the figures' keys, a tenth of a
    worker's peak)."""

    def __init__(self) -> None:
        self.sources = array("i")
        self.members = MemberFigures()

    def put(self, at: int, source: int, k: Optional[int], wait: Optional[float], straggler: bool,
            flow: object) -> None:
        grow = at + 1 - len(self.sources)
        if grow == 1:  # the next place, as most come
            self.sources.append(source)
        else:
            if grow > 0:
                self.sources.extend(array("i", [-2]) * grow)
            self.sources[at] = source
        self.members.put(at, k, wait, straggler, flow)

    def take(self, at: int) -> Optional[tuple]:
        """``((worker, figures number) or None, wait or None, straggler, flows)`` for place ``at``; None if nothing came."""
        if at >= len(self.sources) or self.sources[at] == -2:
            return None
        k, wait, straggler, flow = self.members.get(at)
        return None if k is None else (self.sources[at], k), wait, straggler, flow


class OwnLanes:
    """This worker's ranks' instances by (rank, lane), held until the lanes writer takes them
    (:class:`commtag.merge.pftrace.lanes.LaneInstances`); each is then unpacked where it was packed
    and given what the analysis gave it (figures, wait, flows: into :attr:`flows`, replaced at every take)."""

    def __init__(self, interner: Interner) -> None:
        self.interner = interner
        #: (rank, lane) -> its instances as held (:class:`commtag.merge.engine.routes.Carrier`), and
        #: their places among the rank's.
        self.held: dict[tuple[int, str], tuple[object, list[int]]] = {}
        #: rank -> what came back for its instances, by place.
        self.updates: dict[int, Updates] = {}
        self.figures: dict[tuple[int, int], dict] = {}
        self.flows: InstanceFlows = {}
        self._joined: dict[tuple[int, int, int], dict] = {}  # (worker, figures, id of the common args) -> both
        #: Told of each lane taken (the lanes' progress).
        self.taken: Progress = Unshown()

    def pop(self, key: tuple[int, str], default: Sequence[CollectiveInstance], /) -> Sequence[CollectiveInstance]:
        found = self.held.pop(key, None)
        self.flows.clear()
        if found is None:
            return default
        kept, idxs = found
        self.taken.update()
        insts = unpacked(kept, self.interner)
        updates = self.updates.get(key[0], Updates())
        for inst, idx in zip(insts, idxs):
            update = updates.take(idx)
            if update is None:
                continue
            figures, wait, straggler, flow = update
            if figures is not None:
                base = inst.common_args
                joined = (figures[0], figures[1], id(base))
                both = self._joined.get(joined)
                if both is None:
                    both = self._joined[joined] = self.interner.common({**base, **self.figures[figures]})
                inst.common_args = both
                if wait is not None:
                    inst.args[ANN_WAIT_US] = wait
                if straggler:
                    inst.args[ANN_STRAGGLER] = True
            if flow is not None:
                self.flows[id(inst)] = flow if flow.__class__ is int else (
                    None if flow[0] is None else range(flow[0], flow[0] + flow[1]),
                    None if flow[2] is None else tuple(flow[2]))
        return insts

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self.held)

    def __len__(self) -> int:
        return len(self.held)


def flow_to_wire(found) -> object:
    """A member's flows (:func:`commtag.merge.pftrace.lanes.group_flows`) as JSON: an id, or [first out, count, into]."""
    if found.__class__ is int:
        return found
    out, into = found
    return [None if out is None else out.start, 0 if out is None else len(out), None if into is None else list(into)]
