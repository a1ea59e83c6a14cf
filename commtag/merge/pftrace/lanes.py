"""The lanes block of the merged trace: process-group lanes, cross-rank flows, counters, markers.

Written by each merge worker after its ranks' blocks (see
:mod:`commtag.merge.pftrace.writer`), rank by rank, on the packet sequence
of the rank's block (:func:`commtag.merge.ids.sequence_block`): their bytes
do not depend on which other ranks the same worker writes, so any number of
workers writes the trace one process writes. Which members of a collective
get a flow between them, and their ids, is decided here (:func:`group_flows`);
the worker that matched the collective (:mod:`commtag.merge.engine.shards`)
numbers them in one process's order.
"""

from __future__ import annotations

from typing import BinaryIO, Collection, Optional, Sequence

from commtag.merge.ids import (FLOW_CROSS_RANK, LANE_LOCAL, LOCAL_BITS, LocalIds, flow_id, lanes_sequence_id, process_uuid,
                               sequence_block)
from commtag.merge.records import CollectiveInstance, CounterSeries, Marker, RankSummary
from commtag.merge.timeline import Row
from commtag.merge.pftrace.packets import track_descriptor
from commtag.merge.pftrace.sequence import SequenceBlocks, track_field
from commtag.merge.pftrace.views import LaneInstances, groups_of, write_rank_view

#: Groups up to this size get a flow between every pair of members, so that
#: selecting any member shows all others; bigger groups get a star.
FULL_MESH_MAX = 8
#: Sibling order of a rank's counter and marker tracks: after every lane.
_AFTER_LANES = 1 << 20

#: Flows of one instance, by ``id(instance)``: (flow ids it starts, flow ids it terminates), None for
#: none; or one id alone, the only flow it terminates (a big group's members but the first). Held for
#: every instance at once: tuples of each one's ids were most of a 512-rank merge's peak memory.
InstanceFlows = dict[int, "int | tuple[Optional[Sequence[int]], Optional[Sequence[int]]]"]


def flows_of(n: int) -> int:
    """How many cross-rank flows link the ``n`` members of one collective."""
    return n * (n - 1) // 2 if n <= FULL_MESH_MAX else n - 1


def group_flows(n: int, numbered: int) -> list:
    """The flows of each of the ``n`` members of one collective, in the order of their starts,
    numbered after the ``numbered`` flows before them.

    The earlier starting slice of a pair starts the flow (ties: lower rank, which a lanes block
    writes first): trace_processor drops a terminating id it has not seen start. Pairs are
    numbered member by member (first member with each later one, then the second's, ...), so the
    ids a member starts are one run.
    """
    first = flow_id(FLOW_CROSS_RANK, 0, numbered + 1)  # the id of this group's pair number k is first + k
    if n > FULL_MESH_MAX:  # a star from the first member
        return [(range(first, first + n - 1), None)] + [first + j - 1 for j in range(1, n)]
    # Pair (i, j), i < j, is number starts[i] + (j - i - 1), where starts[i] counts the pairs before i's.
    starts = [0] * n
    for i in range(1, n):
        starts[i] = starts[i - 1] + n - i
    return [(range(first + starts[j], first + starts[j] + n - 1 - j) if j < n - 1 else None,
             tuple(first + starts[i] + j - i - 1 for i in range(j)) or None) for j in range(n)]


class LanesWriter:
    """Lanes, cross-rank flows, counters and markers of a merge worker's ranks, written after them.

    ``ranks``: how many the merge has (what its sequences' blocks are, :func:`commtag.merge.ids.sequence_block`).
    """

    def __init__(self, origin: int = 0, ranks: int = 1) -> None:
        self._sequences = SequenceBlocks(sequence_block(ranks), lanes_sequence_id, origin)
        #: The sequence of the rank being written (what :meth:`lane_slices` encodes on).
        self.seq = self._sequences(0)
        self._ids: dict[int, LocalIds] = {}

    def rank_ids(self, rank: int) -> LocalIds:
        """``rank``'s track uuids in the lanes block (the process-group view takes its rows from them too)."""
        ids = self._ids.get(rank)
        if ids is None:
            ids = self._ids[rank] = LocalIds(rank, LANE_LOCAL, 1 << LOCAL_BITS)
        return ids

    def write(self, stream: BinaryIO, lanes: dict[int, list[tuple[str, int]]], by_lane: LaneInstances,
              flows: InstanceFlows, lane_kernels: dict[tuple[int, str], dict],
              counters: Sequence[CounterSeries] = (), markers: Sequence[Marker] = (),
              ranks: Optional[Collection[int]] = None) -> None:
        """Write the lanes with their slices and flows, then counters and markers, of ``ranks``
        (default: every rank), rank by rank in rank order, each on its block's sequence.

        ``lanes`` maps a rank to its ``(lane_name, order)`` rows, the order
        being the lane's position in the one global lane order, so a group's
        lane sits at the same place on every member rank. ``by_lane``: the
        instances of each (rank, lane), given as taken (a merge worker unpacks
        a lane's only when it writes it, :class:`commtag.merge.engine.owned.OwnLanes`,
        filling ``flows`` with their cross-rank flows, numbered by the workers
        that matched them). ``lane_kernels``: (rank, lane name) -> annotations
        of the lane's kernel categories, an instant at its first slice.
        """
        wanted = None if ranks is None else set(ranks)
        counters_of: dict[int, list[CounterSeries]] = {}
        for series in counters:
            counters_of.setdefault(series.rank, []).append(series)
        markers_of: dict[int, list[Marker]] = {}
        for marker in markers:
            markers_of.setdefault(marker.rank, []).append(marker)
        heads = {group.order: group.members[0] for group in groups_of(lanes)}
        for rank in sorted(r for r in {*lanes, *counters_of, *markers_of} if wanted is None or r in wanted):
            self.seq = self._sequences(rank)
            others, own_markers = write_rank_view(self, stream, rank, lanes.get(rank, ()), heads, by_lane, flows,
                                                  lane_kernels, counters_of.get(rank, ()),
                                                  markers_of.get(rank, ()))
            for series in others:
                self._counter(series)
            self._markers(own_markers)
            stream.write(self.seq.out)
            self.seq.out.clear()
        if by_lane:
            raise ValueError(f"instances on undeclared lanes: {sorted(by_lane)[:5]}")

    def lane_slices(self, instances: Sequence[CollectiveInstance], flows: InstanceFlows) -> Row:
        """One lane's slices, encoded on this writer's sequence, with their cross-rank and source
        flows (the common args of a call site's steps and replays are encoded once)."""
        seq = self.seq
        row = Row()
        for inst in instances:
            found = flows.get(id(inst))
            fout, fin = (None, None) if found is None else (None, (found,)) if isinstance(found, int) else found
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


def lanes_used(instances: Sequence[CollectiveInstance]) -> list[tuple[str, str, int]]:
    """The lanes ``instances`` (one rank's) are on: (lane name, pg uid, group size) of the first on each."""
    seen: dict[str, tuple[str, str, int]] = {}
    for inst in instances:
        if inst.lane_name not in seen:
            seen[inst.lane_name] = (inst.lane_name, inst.pg_uid, inst.group_size)
    return list(seen.values())


def lane_layout(summaries: Sequence[RankSummary],
                used_of: dict[int, list[tuple[str, str, int]]]) -> dict[int, list[tuple[str, int]]]:
    """Each rank's lanes, in one global order: a group's lane on every loaded member.

    Larger groups come first (the world group on top), then groups by their
    name as torch numbers them ("1" before "10"), so the order reads like the
    program's group creation. Only groups with at least one collective
    anywhere get lanes; membership comes from the group tables (ranks), or
    from having instances on it (``used_of``: each rank's :func:`lanes_used`).
    """
    used = {lane for rows in used_of.values() for lane, _, _ in rows}
    sort_keys: dict[str, tuple] = {}
    members: dict[str, set[int]] = {}
    loaded = {s.rank for s in summaries}

    def lane(name: str, pg_uid: str, size: int) -> None:
        group_name = pg_uid.rpartition(":")[0] or pg_uid
        numbered = (0, int(group_name), "") if group_name.isdigit() else (1, 0, group_name)
        sort_keys.setdefault(name, (-size, numbered, name))

    for s in summaries:
        for group in s.groups:
            if group.lane_name in used:
                lane(group.lane_name, group.pg_uid, len(group.ranks))
                members.setdefault(group.lane_name, set()).update(r for r in group.ranks if r in loaded)
        for name, pg_uid, size in used_of.get(s.rank, ()):
            lane(name, pg_uid, size)
            members.setdefault(name, set()).add(s.rank)
    order = {name: i for i, name in enumerate(sorted(sort_keys, key=sort_keys.__getitem__))}
    layout: dict[int, list[tuple[str, int]]] = {}
    for name, ranks in members.items():
        for r in ranks:
            layout.setdefault(r, []).append((name, order[name]))
    for rows in layout.values():
        rows.sort(key=lambda row: row[1])
    return layout
