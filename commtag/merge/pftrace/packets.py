"""The merged trace's cold packets, through Perfetto's generated protos: the header, track
descriptors, counter values and interned data.

A merge writes a few hundred of these (and about one counter value per
analysed collective) against millions of slice packets, which
:mod:`commtag.merge.pftrace.writer` frames by hand where that measurably pays.
Here each packet is the generated message, serialized, so what a field means
is read from Perfetto's own names. Only the ``Trace.packet`` frame around it
is :func:`commtag.merge.pftrace.wire.frame`'s, and interned data goes out inside the
hand-framed event packet that first needs it.

Loading the generated module costs a process about 0.05 to 0.14 s and 9 to
11 MB, so it is loaded at the first cold packet (:func:`protos`), not when
this module is imported: ``commtag --help`` and ``commtag summary`` of a
trace directory never pay it; a process that writes a part of the trace
(the merge, and each -j/torchrun worker for its ranks' tracks) pays it once,
after its first rank is read. On the 8-rank, 1 M-event scale set that is
about 0.1 s of a 13 s merge (the counters' 11,000 packets: 0.06 s here
against 0.03 s framed by hand), with the same peak RSS, and byte for byte the
same trace.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from commtag.merge.ids import HEADER_SEQ, ROOT_UUID
from commtag.merge.pftrace.wire import SEQUENCE_CLOCK, UINT64, frame

if TYPE_CHECKING:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackDescriptor


@functools.cache
def protos() -> ModuleType:
    """Perfetto's generated ``perfetto_trace_pb2``, loaded at its first use."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    return perfetto_trace_pb2


def track_descriptor(
    uuid: int,
    name: Optional[str] = None,
    *,
    parent: Optional[int] = None,
    pid: Optional[int] = None,
    process_name: Optional[str] = None,
    labels: Sequence[str] = (),
    explicit_child_order: bool = False,
    sibling_order_rank: Optional[int] = None,
    merge_key: Optional[str] = None,
    counter_unit: Optional[str] = None,
    explicit_process_order: bool = False,
) -> TrackDescriptor:
    """A TrackDescriptor with the fields the merge uses: ``pid`` makes it a process's track;
    ``counter_unit`` a counter track (``""``: one without a unit); ``merge_key`` merges it with
    its siblings of that key into one row; ``explicit_child_order`` orders its children by their
    ``sibling_order_rank``; ``explicit_process_order`` (the root) orders the processes so."""
    pb = protos()
    desc = pb.TrackDescriptor(uuid=uuid, name=name, parent_uuid=parent, sibling_order_rank=sibling_order_rank)
    if pid is not None:
        desc.process.pid = pid
        if process_name is not None:
            desc.process.process_name = process_name
        desc.process.process_labels.extend(labels)
    if counter_unit is not None:
        desc.counter.SetInParent()
        if counter_unit:
            desc.counter.unit_name = counter_unit
    if explicit_child_order:
        desc.child_ordering = pb.TrackDescriptor.EXPLICIT
    if merge_key is not None:
        desc.sibling_merge_behavior = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY
        desc.sibling_merge_key = merge_key
    if explicit_process_order:
        desc.process_ordering = pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
    return desc


def descriptor_packet(seq_id: int, desc: TrackDescriptor) -> bytes:
    """One framed TracePacket holding ``desc`` on sequence ``seq_id`` (a sequence's first packet is
    :func:`sequence_start`: descriptors carry no flags)."""
    return frame(protos().TracePacket(trusted_packet_sequence_id=seq_id, track_descriptor=desc).SerializeToString())


def counter_packet(seq_id: int, step: int, uuid: int, value: float) -> bytes:
    """One framed TracePacket holding a counter's ``value`` on track ``uuid``, ``step`` ns after the
    sequence's previous timestamped packet (see :func:`sequence_start`)."""
    pb = protos()
    return frame(pb.TracePacket(timestamp=step & UINT64, trusted_packet_sequence_id=seq_id, track_event=pb.TrackEvent(
        type=pb.TrackEvent.TYPE_COUNTER, track_uuid=uuid, double_counter_value=value)).SerializeToString())


def header(first_ns: int, origin: int = 0) -> bytes:
    """The clock snapshot and the root, framed: what a merged trace starts with.

    Timestamps in the file count ns from ``origin`` (a wall-clock ns shortly
    before the first event; each event sequence steps from it on a clock of
    its own, :func:`sequence_start`). The snapshot maps that clock (BOOTTIME,
    the trace's default) to REALTIME, so the UI and
    :mod:`commtag.merge.pftrace.readback` show and give wall-clock time. The root
    orders the processes by their ``sibling_order_rank`` (their rank).
    """
    pb = protos()
    first = max(first_ns, origin)
    clocks = [pb.ClockSnapshot.Clock(clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=first - origin),
              pb.ClockSnapshot.Clock(clock_id=pb.BUILTIN_CLOCK_REALTIME, timestamp=first)]
    snapshot = pb.TracePacket(clock_snapshot=pb.ClockSnapshot(clocks=clocks), timestamp=first - origin,
                              trusted_packet_sequence_id=HEADER_SEQ)
    return (frame(snapshot.SerializeToString())
            + descriptor_packet(HEADER_SEQ, track_descriptor(ROOT_UUID, explicit_process_order=True)))


def sequence_start(seq_id: int) -> bytes:
    """The framed first packet of an event sequence: it clears the sequence's state, and declares
    the sequence's incremental clock (0 there is BOOTTIME 0, the trace's origin, see :func:`header`)
    the clock of its packets' timestamps; so each timestamp is the ns since the sequence's
    previous timestamped packet (the first: since the origin), 2-4 bytes where one counted from
    the origin took 5."""
    pb = protos()
    clocks = [pb.ClockSnapshot.Clock(clock_id=SEQUENCE_CLOCK, timestamp=0, is_incremental=True),
              pb.ClockSnapshot.Clock(clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=0)]
    return frame(pb.TracePacket(
        trusted_packet_sequence_id=seq_id, sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        | pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE, trace_packet_defaults=pb.TracePacketDefaults(
            timestamp_clock_id=SEQUENCE_CLOCK), clock_snapshot=pb.ClockSnapshot(clocks=clocks)).SerializeToString())


def track_defaults(uuid: int) -> bytes:
    """A serialized TracePacketDefaults whose events default to track ``uuid`` (and whose timestamps
    stay on the sequence's clock, :func:`sequence_start`): trace_processor puts a TrackEvent without
    a ``track_uuid`` there (a later defaults message replaces the whole message, a cleared sequence
    forgets it, interned data stays)."""
    pb = protos()
    return pb.TracePacketDefaults(timestamp_clock_id=SEQUENCE_CLOCK,
                                  track_event_defaults=pb.TrackEventDefaults(track_uuid=uuid)).SerializeToString()


def interned_data(categories: Iterable[tuple[int, str]], names: Iterable[tuple[int, str]],
                  keys: Iterable[tuple[int, str]], strings: Iterable[tuple[int, str]]) -> bytes:
    """A serialized InternedData of (iid, text) entries: event categories, event names, debug
    annotation names and debug annotation string values."""
    pb = protos()
    return pb.InternedData(
        event_categories=[pb.EventCategory(iid=iid, name=text) for iid, text in categories],
        event_names=[pb.EventName(iid=iid, name=text) for iid, text in names],
        debug_annotation_names=[pb.DebugAnnotationName(iid=iid, name=text) for iid, text in keys],
        debug_annotation_string_values=[pb.InternedString(iid=iid, str=text.encode()) for iid, text in strings],
    ).SerializeToString()
