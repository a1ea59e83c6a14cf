"""The lanes block of the merged trace: process-group lanes, cross-rank flows, counters, markers.

Written by each merge worker after its ranks' blocks (see
:mod:`commtag.merge.pftrace.writer`), on its own packet sequence. Which members
of a collective get a flow between them is decided here
(:func:`cross_rank_flows`), from what :func:`commtag.merge.records.match_groups`
calls one collective.
"""

from __future__ import annotations

from typing import BinaryIO, Collection, Optional, Sequence

from commtag.merge.ids import FLOW_CROSS_RANK, LANE_LOCAL, LOCAL_BITS, LocalIds, flow_id, lanes_sequence_id, process_uuid
from commtag.merge.records import MATCH_PARTS, CollectiveInstance, CounterSeries, Marker, match_groups, match_part
from commtag.merge.timeline import Row
from commtag.merge.pftrace.packets import track_descriptor
from commtag.merge.pftrace.writer import SequenceWriter, track_field
from commtag.merge.pftrace.views import write_group_view

#: Groups up to this size get a flow between every pair of members, so that
#: selecting any member shows all others; bigger groups get a star.
FULL_MESH_MAX = 8
#: Sibling order of a rank's counter and marker tracks: after every lane.
_AFTER_LANES = 1 << 20

#: Flows of one instance, by ``id(instance)``: (flow ids it starts, flow ids it terminates), None for
#: none; or one id alone, the only flow it terminates (a big group's members but the first). Held for
#: every instance at once: tuples of each one's ids were most of a 512-rank merge's peak memory.
InstanceFlows = dict[int, "int | tuple[Optional[Sequence[int]], Optional[Sequence[int]]]"]


def cross_rank_flows(instances: Sequence[CollectiveInstance], numbered: int = 0,
                     ranks: Optional[Collection[int]] = None, scope: int = 0) -> tuple[InstanceFlows, int]:
    """Flows linking the members of each matched instance, numbered in the order of ``instances``
    after the ``numbered`` flows written before; and the count with these. Only the members on
    ``ranks`` (None: all) are in the result (a merge worker writes its own ranks' lanes, but
    numbers the flows of every rank's). ``scope``: the lane whose instances these are (its place
    in the lane order, :func:`lane_flows`): each lane numbers its flows from 1, so that whoever
    numbers one lane's flows needs none of the others'.

    Members are what :func:`~commtag.merge.records.match_groups` (the
    analysis's rule too) calls one collective. The earlier starting slice
    of a pair starts the flow (ties: lower rank, which a lanes block writes
    first): trace_processor drops a terminating id it has not seen start.
    Pairs are numbered member by member (first member with each later one,
    then the second's, ...), so the ids a member starts are one run.
    """
    flows: InstanceFlows = {}
    counter = numbered
    for members in match_groups(instances):
        n = len(members)
        if n < 2 or len({m.rank for m in members}) != n:
            continue
        members.sort(key=lambda m: (m.start_ns, m.rank))
        first = flow_id(FLOW_CROSS_RANK, scope, counter + 1)  # the id of this group's pair number k is first + k
        if n <= FULL_MESH_MAX:
            # Pair (i, j), i < j, is number starts[i] + (j - i - 1), where starts[i] counts the pairs before i's.
            starts = [0] * n
            for i in range(1, n):
                starts[i] = starts[i - 1] + n - i
            for j, member in enumerate(members):
                if ranks is not None and member.rank not in ranks:
                    continue
                out = range(first + starts[j], first + starts[j] + n - 1 - j) if j < n - 1 else None
                into = tuple(first + starts[i] + j - i - 1 for i in range(j)) or None
                flows[id(member)] = (out, into)
            counter += n * (n - 1) // 2
        else:  # a star from the first member
            if ranks is None or members[0].rank in ranks:
                flows[id(members[0])] = (range(first, first + n - 1), None)
            for j in range(1, n):
                if ranks is None or members[j].rank in ranks:
                    flows[id(members[j])] = first + j - 1
            counter += n - 1
    return flows, counter


def lane_flows(instances: Sequence[CollectiveInstance], orders: dict[str, int],
               ranks: Optional[Collection[int]] = None) -> InstanceFlows:
    """:func:`cross_rank_flows` of every lane's instances (in the order of ``instances``), each match
    part of each lane (:func:`commtag.merge.records.match_part`) numbered in its own scope: from its
    lane's place in the lane order (``orders``: lane name -> place) and the part."""
    by_part: dict[tuple[str, int], list[CollectiveInstance]] = {}
    for inst in instances:
        by_part.setdefault((inst.lane_name, match_part(inst)), []).append(inst)
    flows: InstanceFlows = {}
    for (lane, part), members in by_part.items():
        flows.update(cross_rank_flows(members, 0, ranks, orders.get(lane, 0) * (MATCH_PARTS + 1) + part + 1)[0])
    return flows


class LanesWriter:
    """Lanes, cross-rank flows, counters and markers of a merge worker's ranks, written after them.

    ``first_rank``: the first rank of the segment (:mod:`commtag.merge.engine.segments`), which names its sequence.
    """

    def __init__(self, origin: int = 0, first_rank: int = 0) -> None:
        self.seq = SequenceWriter(lanes_sequence_id(first_rank), origin)
        self._ids: dict[int, LocalIds] = {}

    def rank_ids(self, rank: int) -> LocalIds:
        """``rank``'s track uuids in the lanes block (the process-group view takes its rows from them too)."""
        ids = self._ids.get(rank)
        if ids is None:
            ids = self._ids[rank] = LocalIds(rank, LANE_LOCAL, 1 << LOCAL_BITS)
        return ids

    def write(self, stream: BinaryIO, lanes: dict[int, list[tuple[str, int]]],
              instances: Sequence[CollectiveInstance], counters: Sequence[CounterSeries] = (),
              markers: Sequence[Marker] = (), lane_kernels: Optional[dict[tuple[int, str], dict]] = None,
              ranks: Optional[Collection[int]] = None, flows: Optional[InstanceFlows] = None) -> None:
        """Write the lanes with their slices and flows, then counters and markers, of ``ranks``
        (default: every rank).

        ``lanes`` maps a rank to its ``(lane_name, order)`` rows, the order
        being the lane's position in the one global lane order, so a group's
        lane sits at the same place on every member rank. ``instances``:
        every rank's, as the cross-rank flows are numbered over all of them
        (so workers writing different ranks agree on them); each goes to the
        lane named by its ``lane_name``. ``lane_kernels``: (rank, lane name)
        -> annotations of the lane's kernel categories, an instant at its first slice. ``flows``: the
        cross-rank flows of ``ranks``' instances when they were numbered elsewhere (a merge worker
        that sees only its own ranks' instances, :mod:`commtag.merge.engine.shards`); then
        ``instances`` need only be theirs.
        """
        wanted = None if ranks is None else set(ranks)
        if flows is None:
            orders = {name: order for rows in lanes.values() for name, order in rows}
            flows = lane_flows(instances, orders, wanted)
        by_lane: dict[tuple[int, str], list[CollectiveInstance]] = {}
        for inst in instances:
            if wanted is None or inst.rank in wanted:
                by_lane.setdefault((inst.rank, inst.lane_name), []).append(inst)
        counters, markers = write_group_view(self, stream, lanes, by_lane, flows, lane_kernels or {}, counters,
                                             markers, wanted)
        if by_lane:
            raise ValueError(f"instances on undeclared lanes: {sorted(by_lane)[:5]}")
        for series in counters:
            self._counter(series)
        self._markers(markers)
        stream.write(self.seq.out)
        self.seq.out.clear()

    def lane_slices(self, instances: Sequence[CollectiveInstance], flows: InstanceFlows) -> Row:
        """One lane's slices, encoded on this writer's sequence, with their cross-rank and source
        flows (the common args of a call site's steps and replays are encoded once)."""
        seq = self.seq
        row = Row()
        for inst in instances:
            found = flows.get(id(inst))
            fout, fin = (None, None) if found is None else (None, (found,)) if found.__class__ is int else found
            if inst.source_flow is not None:
                fin = (*(fin or ()), inst.source_flow)
            data = seq.body(inst.collective, "collective", None)
            common, own = inst.common_args, inst.args
            if own.keys().isdisjoint(common):  # then all_args() encodes as common, then own
                data += seq.shared_annotations(common) + seq.annotations(own)
            else:
                data += seq.annotations(inst.all_args())
            row.add(inst.start_ns, inst.end_ns, data + seq.flows(fout, fin) if fout or fin else data)
        return row

    def _counter(self, series: CounterSeries) -> None:
        uuid = self.rank_ids(series.rank)()
        self.seq.descriptor(track_descriptor(uuid, series.track, parent=process_uuid(series.rank),
                                             sibling_order_rank=_AFTER_LANES, counter_unit=series.unit))
        for ts, value in sorted(series.points):
            self.seq.counter(ts, uuid, float(value))

    def _markers(self, markers: Sequence[Marker]) -> None:
        tracks: dict[int, bytes] = {}
        for marker in sorted(markers, key=lambda m: (m.rank, m.ts_ns)):
            track = tracks.get(marker.rank)
            if track is None:
                uuid = self.rank_ids(marker.rank)()
                self.seq.descriptor(track_descriptor(uuid, "commtag markers", parent=process_uuid(marker.rank),
                                                     sibling_order_rank=_AFTER_LANES + 1))
                track = tracks[marker.rank] = track_field(uuid)
            self.seq.instant(marker.ts_ns, track, self.seq.body(marker.name, "commtag", marker.args))
