"""The process-group view: one track group per process group, at the top of the trace.

Why: to compare one group's collectives across ranks a reader should not
expand every rank's process. Each group gets a top-level track group named as
its lane (``PG 1 (tp) [0, 1]``), outside every process, world first then in
the lanes' order; inside it one row per member rank, ``rank R``, in rank
order, holding that rank's lane slices for the group with their args and
flows, and that rank's markers of the group (straggler, desync) as instants.
The group's busbw counter sits in it after the members. A straggler shows as
one slice starting late in a column of aligned slices.

This is where the lane slices live: a rank's process holds its CPU threads,
GPU streams and its own profiled-window markers, and its kernels and ops
have flows to their slices here (docs/design.md says why there is no second
copy inside each process).

The view is written rank by rank, each rank's rows on its own sequence
(see :mod:`commtag.merge.pftrace.lanes`); a group's head comes with its
lowest member's rows, which precede every other member's, so a row's parent
always precedes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Iterator, Protocol, Sequence

from commtag.kernels import summary_name
from commtag.merge.ids import group_uuid
from commtag.merge.records import CollectiveInstance, CounterSeries, Marker
from commtag.merge.timeline import Row
from commtag.merge.pftrace.packets import track_descriptor
from commtag.merge.pftrace.writer import emit_rows
from commtag.vocab import ANN_KERNELS, ANN_LANE

#: Sibling order of the group views among the top-level tracks: below every process's (its rank).
GROUP_ORDER_BASE = -(1 << 30)
#: Sibling order of a group's counter tracks: after every member row (ranks are below 2**24).
_AFTER_MEMBERS = 1 << 24
#: The marker key naming the lane a marker belongs to (set by commtag.merge.analysis.analyze).
MARKER_LANE_KEY = ANN_LANE


class LaneInstances(Protocol):
    """Instances by (rank, lane name), each taken once (a dict, or one that makes them when taken)."""

    def pop(self, key: tuple[int, str], default: Sequence[CollectiveInstance], /) -> Sequence[CollectiveInstance]: ...

    def __iter__(self) -> Iterator[tuple[int, str]]: ...

    def __len__(self) -> int: ...


@dataclass(slots=True)
class Group:
    """A process group as the view shows it: its lane name, place, and loaded member ranks."""

    lane_name: str
    order: int
    members: list[int]


def groups_of(layout: dict[int, list[tuple[str, int]]]) -> list[Group]:
    """The groups of a lane layout (rank -> its ``(lane_name, order)`` rows), in lane order."""
    found: dict[int, Group] = {}
    for rank, rows in layout.items():
        for lane_name, order in rows:
            found.setdefault(order, Group(lane_name, order, [])).members.append(rank)
    for group in found.values():
        group.members.sort()
    return [found[order] for order in sorted(found)]


def member_row_name(rank: int) -> str:
    return f"rank {rank}"


def write_rank_view(writer, stream: BinaryIO, rank: int, rows: Sequence[tuple[str, int]], heads: dict[int, int],
                    by_lane: LaneInstances, flows: dict, lane_kernels: dict[tuple[int, str], dict],
                    counters: Sequence[CounterSeries], markers: Sequence[Marker]) -> tuple[list, list]:
    """Write ``rank``'s rows of the group view (``rows``: its lanes, in lane order) with ``writer``'s
    sequence and ids (a :class:`commtag.merge.pftrace.lanes.LanesWriter`), taking their instances out of
    ``by_lane``; a group's head first where ``rank`` is its lowest member (``heads``: lane order ->
    that member), a group's counters of ``rank`` after its row. ``counters`` and ``markers``: the
    rank's. Returns those that belong to none of its groups (the caller writes them in its process)."""
    seq = writer.seq
    lanes = {name for name, _ in rows}
    lane_counters: dict[str, list[CounterSeries]] = {}
    other_counters = []
    for series in counters:
        if series.lane in lanes:
            lane_counters.setdefault(series.lane, []).append(series)
        else:
            other_counters.append(series)
    lane_markers: dict[str, list[Marker]] = {}
    other_markers = []
    for marker in markers:
        lane = marker.args.get(MARKER_LANE_KEY)
        if lane in lanes:
            lane_markers.setdefault(str(lane), []).append(marker)
        else:
            other_markers.append(marker)
    for lane_name, order in rows:
        head = group_uuid(order)
        if heads[order] == rank:
            seq.descriptor(track_descriptor(head, lane_name, explicit_child_order=True,
                                            sibling_order_rank=GROUP_ORDER_BASE + order))
        slices = writer.lane_slices(by_lane.pop((rank, lane_name), ()), flows)
        kernels = lane_kernels.get((rank, lane_name))
        summary = (summary_name(str(kernels[ANN_KERNELS])), kernels) if kernels else None
        instants = Row()
        for marker in sorted(lane_markers.pop(lane_name, ()), key=lambda m: m.ts_ns):
            instants.add(marker.ts_ns, marker.ts_ns, seq.body(marker.name, "commtag", marker.args))
        emit_rows(stream, seq, slices, head, member_row_name(rank), rank, f"g{order}:r{rank}",
                  writer.rank_ids(rank), instants=instants, summary=summary)
        for series in lane_counters.pop(lane_name, ()):
            uuid = writer.rank_ids(rank)()
            seq.descriptor(track_descriptor(uuid, series.track, parent=head, sibling_order_rank=_AFTER_MEMBERS,
                                            counter_unit=series.unit))
            for ts, value in sorted(series.points):
                seq.counter(ts, uuid, float(value))
    return other_counters, other_markers
