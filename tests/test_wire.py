"""The hand-framed writer against Perfetto's generated protos, byte for byte, and the one frame reader.

The cold packets (descriptors, the header, counters, interned data) are the
generated messages themselves (commtag.merge.pftrace.packets); framed, they must equal
the generated protos' ``SerializeToString`` of a Trace. Event packets put the
event's type and track before the payload encoded while the trace was read,
so their fields are not in that order (protobuf allows any order); there the
expected bytes are the generated protos' encoding of each field alone, in the
writer's order.
"""

from __future__ import annotations

import io

import pytest
from google.protobuf.descriptor import FieldDescriptor
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.merge.pftrace import wire
from commtag.merge.ids import LocalIds
from commtag.merge.timeline import Row
from commtag.merge.pftrace.packets import track_descriptor
from commtag.merge.pftrace.sequence import SequenceWriter, track_field
from commtag.merge.pftrace.writer import emit_rows, header

T0 = 1_700_000_000_000_000_000
SEQ = 16

_LEN = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE)
_I64 = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64)

TAGS = [
    ("TRACE_PACKET", pb.Trace, "packet"),
    ("PACKET_TIMESTAMP", pb.TracePacket, "timestamp"),
    ("PACKET_SEQUENCE_ID", pb.TracePacket, "trusted_packet_sequence_id"),
    ("PACKET_SEQUENCE_FLAGS", pb.TracePacket, "sequence_flags"),
    ("PACKET_TRACK_EVENT", pb.TracePacket, "track_event"),
    ("PACKET_INTERNED_DATA", pb.TracePacket, "interned_data"),
    ("PACKET_DEFAULTS", pb.TracePacket, "trace_packet_defaults"),
    ("EVENT_TYPE", pb.TrackEvent, "type"),
    ("EVENT_TRACK_UUID", pb.TrackEvent, "track_uuid"),
    ("EVENT_NAME_IID", pb.TrackEvent, "name_iid"),
    ("EVENT_CATEGORY_IID", pb.TrackEvent, "category_iids"),
    ("EVENT_DEBUG_ANNOTATION", pb.TrackEvent, "debug_annotations"),
    ("EVENT_FLOW_ID", pb.TrackEvent, "flow_ids"),
    ("EVENT_TERMINATING_FLOW_ID", pb.TrackEvent, "terminating_flow_ids"),
    ("ANNOTATION_NAME_IID", pb.DebugAnnotation, "name_iid"),
    ("ANNOTATION_BOOL", pb.DebugAnnotation, "bool_value"),
    ("ANNOTATION_INT", pb.DebugAnnotation, "int_value"),
    ("ANNOTATION_DOUBLE", pb.DebugAnnotation, "double_value"),
    ("ANNOTATION_STRING", pb.DebugAnnotation, "string_value"),
    ("ANNOTATION_STRING_IID", pb.DebugAnnotation, "string_value_iid"),
]


@pytest.mark.parametrize(("name", "message", "field"), TAGS, ids=[f"{n}={m.__name__}.{f}" for n, m, f in TAGS])
def test_each_named_tag_is_perfettos_field(name: str, message: type, field: str) -> None:
    desc = message.DESCRIPTOR.fields_by_name[field]
    wire_type = 2 if desc.type in _LEN else 1 if desc.type in _I64 else 0
    assert getattr(wire, name) == wire.varint(desc.number << 3 | wire_type)


def test_each_enum_value_is_perfettos() -> None:
    assert (wire.TYPE_SLICE_BEGIN, wire.TYPE_SLICE_END, wire.TYPE_INSTANT) == (
        pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_INSTANT)
    assert wire.SEQ_INCREMENTAL_STATE_CLEARED == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert wire.SEQ_NEEDS_INCREMENTAL_STATE == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE


# -- expected bytes, from the generated protos --------------------------------

def fields(message: type, *parts: tuple[str, object]) -> bytes:
    """Each ``(field, value)`` encoded alone by the generated protos, in this order."""
    out = b""
    for name, value in parts:
        repeated = message.DESCRIPTOR.fields_by_name[name].is_repeated
        out += message(**{name: [value] if repeated else value}).SerializeToString()
    return out


def embedded(message: type, name: str, payload: bytes, inner: type) -> bytes:
    """Field ``name`` holding ``payload`` (an ``inner`` message in the writer's field order): the
    field's key and length as the generated protos encode them, then ``payload``."""
    value = inner.FromString(payload)
    repeated = message.DESCRIPTOR.fields_by_name[name].is_repeated
    whole = message(**{name: [value] if repeated else value}).SerializeToString()
    assert len(value.SerializeToString()) == len(payload)  # the same fields, only their order may differ
    return whole[:len(whole) - len(payload)] + payload


def framed(packet: bytes) -> bytes:
    return embedded(pb.Trace, "packet", packet, pb.TracePacket)


def canonical(packet: pb.TracePacket) -> bytes:
    return pb.Trace(packet=[packet]).SerializeToString()


def sequence_start() -> bytes:
    """A sequence's first packet: it clears the sequence and puts its timestamps on an incremental
    clock of its own (0 there is BOOTTIME 0, the origin)."""
    return canonical(pb.TracePacket(
        trusted_packet_sequence_id=SEQ, sequence_flags=3,
        trace_packet_defaults=pb.TracePacketDefaults(timestamp_clock_id=64),
        clock_snapshot=pb.ClockSnapshot(clocks=[pb.ClockSnapshot.Clock(clock_id=64, timestamp=0, is_incremental=True),
                                                pb.ClockSnapshot.Clock(clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=0)])))


def event_packet(step: int, event: bytes, interned: pb.InternedData | None = None,
                 default_track: int | None = None) -> bytes:
    """An event packet ``step`` ns after the sequence's previous timestamped packet (a step back as
    its 64-bit two's complement)."""
    out = fields(pb.TracePacket, ("timestamp", step & wire.UINT64), ("trusted_packet_sequence_id", SEQ))
    if interned is not None:
        out += fields(pb.TracePacket, ("interned_data", interned))
    if default_track is not None:
        out += fields(pb.TracePacket, ("trace_packet_defaults", pb.TracePacketDefaults(
            timestamp_clock_id=64, track_event_defaults=pb.TrackEventDefaults(track_uuid=default_track))))
    return framed(out + embedded(pb.TracePacket, "track_event", event, pb.TrackEvent))


ARGS = {"id": 7, "big": 2**40, "neg": -3, "f": 0.5, "b": True, "s": "x", "none": None, "dims": [[2, 2]],
        "huge": 2**70, "long": "y" * 1_100_000}  # over 1 MiB: interned as every string is


def annotations() -> list[pb.DebugAnnotation]:
    """What ARGS encode as: keys interned 1..10 in order, strings "x", "null", "[[2,2]]", 2**70, the long one as 1..5."""
    ann = pb.DebugAnnotation
    return [ann(name_iid=1, int_value=7), ann(name_iid=2, int_value=2**40), ann(name_iid=3, int_value=-3),
            ann(name_iid=4, double_value=0.5), ann(name_iid=5, bool_value=True), ann(name_iid=6, string_value_iid=1),
            ann(name_iid=7, string_value_iid=2), ann(name_iid=8, string_value_iid=3),
            ann(name_iid=9, string_value_iid=4), ann(name_iid=10, string_value_iid=5)]


def interned_args() -> pb.InternedData:
    return pb.InternedData(
        event_categories=[pb.EventCategory(iid=1, name="cpu_op")],
        event_names=[pb.EventName(iid=1, name="aten::mm")],
        debug_annotation_names=[pb.DebugAnnotationName(iid=i, name=k) for i, k in enumerate(ARGS, 1)],
        debug_annotation_string_values=[pb.InternedString(iid=i, str=s.encode())
                                        for i, s in enumerate(("x", "null", "[[2,2]]", str(2**70), "y" * 1_100_000), 1)],
    )


def body_fields(*flows: tuple[str, int]) -> list[tuple[str, object]]:
    return [("name_iid", 1), ("category_iids", 1), *(("debug_annotations", a) for a in annotations()), *flows]


# -- each packet kind -----------------------------------------------------------

def test_descriptors_are_the_generated_messages_and_frame_as_they_encode() -> None:
    process = track_descriptor(3, "rank 0", pid=100_000, process_name="rank 0", labels=["a", "b"], sibling_order_rank=0)
    assert process == pb.TrackDescriptor(uuid=3, name="rank 0", sibling_order_rank=0, process=pb.ProcessDescriptor(
        pid=100_000, process_name="rank 0", process_labels=["a", "b"]))
    group = track_descriptor(5, "GPU 0", parent=3, explicit_child_order=True)
    assert group == pb.TrackDescriptor(uuid=5, name="GPU 0", parent_uuid=3, child_ordering=pb.TrackDescriptor.EXPLICIT)
    row = track_descriptor(9, "stream 7", parent=5, sibling_order_rank=-2, merge_key="r0:GPU 0:stream 7")
    assert row == pb.TrackDescriptor(
        uuid=9, name="stream 7", parent_uuid=5, sibling_order_rank=-2, sibling_merge_key="r0:GPU 0:stream 7",
        sibling_merge_behavior=pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY)
    with_unit = track_descriptor(11, "busbw", parent=5, sibling_order_rank=1 << 20, counter_unit="GB/s")
    assert with_unit == pb.TrackDescriptor(uuid=11, name="busbw", parent_uuid=5, sibling_order_rank=1 << 20,
                                           counter=pb.CounterDescriptor(unit_name="GB/s"))
    no_unit = track_descriptor(12, "skew", counter_unit="")
    assert no_unit.HasField("counter") and no_unit.SerializeToString() == b"\x08\x0c\x12\x04skewB\x00"

    seq = SequenceWriter(SEQ, T0)
    seq.descriptor(process)
    seq.descriptor(group)
    assert bytes(seq.out) == sequence_start() + canonical(pb.TracePacket(
        trusted_packet_sequence_id=SEQ, track_descriptor=process,
    )) + canonical(pb.TracePacket(trusted_packet_sequence_id=SEQ, track_descriptor=group))


def test_the_header_equals_the_generated_encoding() -> None:
    snapshot = pb.TracePacket(timestamp=500, trusted_packet_sequence_id=1, clock_snapshot=pb.ClockSnapshot(clocks=[
        pb.ClockSnapshot.Clock(clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=500),
        pb.ClockSnapshot.Clock(clock_id=pb.BUILTIN_CLOCK_REALTIME, timestamp=T0 + 500),
    ]))
    root = pb.TracePacket(trusted_packet_sequence_id=1, track_descriptor=pb.TrackDescriptor(
        uuid=0, process_ordering=pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT))
    assert header(T0 + 500, T0) == canonical(snapshot) + canonical(root)


def test_a_counter_equals_the_generated_encoding() -> None:
    """Counter values at the sequence's clock's steps: forward, then back."""
    seq = SequenceWriter(SEQ, T0)
    seq.counter(T0 + 2**30, 11, 12.5)
    seq.counter(T0 + 5, 11, 1.0)
    assert bytes(seq.out) == sequence_start() + b"".join(canonical(pb.TracePacket(
        timestamp=step, trusted_packet_sequence_id=SEQ, track_event=pb.TrackEvent(
            type=pb.TrackEvent.TYPE_COUNTER, track_uuid=11, double_counter_value=value)))
        for step, value in ((2**30, 12.5), ((5 - 2**30) & wire.UINT64, 1.0)))
    with pytest.raises(ValueError, match="before the trace's origin"):
        seq.counter(T0 - 1, 11, 0.0)


def test_an_event_packet_that_starts_its_sequence_carries_the_interned_data() -> None:
    seq = SequenceWriter(SEQ, T0)
    body = seq.body("aten::mm", "cpu_op", ARGS)
    out = bytearray()
    seq.instant(T0 + 40, track_field(9), body, out)
    event = fields(pb.TrackEvent, ("type", pb.TrackEvent.TYPE_INSTANT), ("track_uuid", 9), *body_fields())
    assert bytes(out) == sequence_start() + event_packet(40, event, interned_args())


def test_slice_begin_and_end_packets_equal_the_generated_encoding() -> None:
    """The hot loop's packets: BEGIN with interned data, plain BEGINs, ENDs, a row's instant (no
    sequence flags after the sequence's first packet, each timestamp the step from the previous
    one); the
    row's first backing track is the sequence's default (its events name no track), an
    overlapping slice's backing track is named on each of its events."""
    seq = SequenceWriter(SEQ, T0)
    seq.descriptor(track_descriptor(3, "rank 0", pid=100_000))
    body = seq.body("aten::mm", "cpu_op", ARGS)
    flow_out, flow_in = 0x3 << 60 | 5, 0x2 << 60 | 9
    slices, instants = Row(), Row()
    slices.add(T0 + 10, T0 + 50, body + seq.flows([flow_out], [flow_in]))
    slices.add(T0 + 30, T0 + 60, body)  # crosses the first: a second backing track
    slices.add(T0 + 2**29, T0 + 2**29 + 3, body)
    instants.add(T0 + 20, T0 + 20, body)
    stream = io.BytesIO()
    emit_rows(stream, seq, slices, 3, "thread 1", 0, "r0:CPU:thread 1", LocalIds(0, 2, 100), instants)
    frames = list(wire.iter_frames(io.BytesIO(stream.getvalue())))
    ids = LocalIds(0, 2, 100)
    uuid, second = ids(), ids()
    begin = [("type", pb.TrackEvent.TYPE_SLICE_BEGIN)]
    end = fields(pb.TrackEvent, ("type", pb.TrackEvent.TYPE_SLICE_END))
    end_second = fields(pb.TrackEvent, ("type", pb.TrackEvent.TYPE_SLICE_END), ("track_uuid", second))

    def end_packet(step: int, event: bytes) -> bytes:
        return framed(fields(pb.TracePacket, ("timestamp", step & wire.UINT64), ("trusted_packet_sequence_id", SEQ))
                      + embedded(pb.TracePacket, "track_event", event, pb.TrackEvent))

    def backing(track: int) -> bytes:
        return canonical(pb.TracePacket(trusted_packet_sequence_id=SEQ, track_descriptor=pb.TrackDescriptor(
            uuid=track, name="thread 1", parent_uuid=3, sibling_order_rank=0,
            sibling_merge_behavior=pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY,
            sibling_merge_key="r0:CPU:thread 1")))

    expected = [  # timestamps: 10, 30, 50, 2**29, 2**29 + 3, 60, 20
        sequence_start(),
        canonical(pb.TracePacket(trusted_packet_sequence_id=SEQ, track_descriptor=pb.TrackDescriptor(
            uuid=3, name="rank 0", process=pb.ProcessDescriptor(pid=100_000)))),
        backing(uuid), backing(second),
        event_packet(10, fields(pb.TrackEvent, *begin, *body_fields(
            ("flow_ids", flow_out), ("terminating_flow_ids", flow_in))), interned_args(), default_track=uuid),
        event_packet(20, fields(pb.TrackEvent, *begin, ("track_uuid", second), *body_fields())),
        end_packet(20, end),
        event_packet(2**29 - 50, fields(pb.TrackEvent, *begin, *body_fields())),  # beyond 28 bits: no table
        end_packet(3, end),
        end_packet(60 - (2**29 + 3), end_second),  # a step back
        event_packet(-40, fields(pb.TrackEvent, ("type", pb.TrackEvent.TYPE_INSTANT), *body_fields())),
    ]
    assert [wire.frame(f) for f in frames] == expected


# -- the frame reader -----------------------------------------------------------

def test_iter_frames_reads_back_what_frame_wrote_across_chunks() -> None:
    packets = [b"", b"a", b"b" * 300, b"c" * 5000, bytes(range(256)) * 70]
    data = b"".join(wire.frame(p) for p in packets)
    for chunk in (1, 7, 64, 1 << 20):
        assert list(wire.iter_frames(io.BytesIO(data), chunk_size=chunk)) == packets


@pytest.mark.parametrize(("data", "message"), [
    (wire.frame(b"abc") + b"\x12\x01x", "not a Perfetto protobuf trace (byte 5 holds field tag 0x12"),
    (wire.frame(b"abc") + b"\x0a", "truncated trace (the frame length at byte 5 is cut short)"),
    (wire.frame(b"abc") + b"\x0a\x80", "truncated trace (the frame length at byte 5 is cut short)"),
    (wire.frame(b"abc") + b"\x0a\x05ab", "truncated trace (the packet at byte 5 is cut short: 2 of 5 bytes)"),
    (b"\x0a" + b"\xff" * 10 + b"\x01", "not a Perfetto protobuf trace (bad frame length at byte 0)"),
])
def test_iter_frames_names_where_the_frames_break(data: bytes, message: str) -> None:
    with pytest.raises(wire.FrameError) as caught:
        list(wire.iter_frames(io.BytesIO(data), chunk_size=4))
    assert str(caught.value).startswith(message)


def test_readback_and_validate_read_a_cut_trace_with_the_one_frame_reader(tmp_path) -> None:
    from commtag.merge.pftrace.readback import ReadbackError, read_merged
    from commtag.merge.pftrace.validate import TraceReadError, validate_file

    whole = header(T0 + 500, T0) + wire.frame(b"\x08\x01" * 40)
    path = tmp_path / "cut.pftrace"
    path.write_bytes(whole[:-30])
    with pytest.raises(TraceReadError) as by_validate:
        validate_file(path)
    with pytest.raises(ReadbackError) as by_readback:
        read_merged(path)
    said = f"truncated trace (the packet at byte {len(header(T0 + 500, T0))} is cut short: 50 of 80 bytes)"
    assert str(by_validate.value) == f"{path}: {said}"
    assert str(by_readback.value) == f"{path}: {said}"


def test_a_16384_rank_list_on_many_slices_is_written_once() -> None:
    """A group's rank list is an arg of every lane slice of the group: interned, it is written
    once per sequence however long (16,384 ranks: 110 KB), not on every slice."""
    ranks = str(list(range(16_384)))
    seq = SequenceWriter(SEQ, T0)
    out = bytearray()
    for k in range(4):
        seq.instant(T0 + k, track_field(9), seq.body("all_reduce", "commtag", {"ranks matched": ranks, "seq": k}), out)
    assert bytes(out).count(ranks.encode()) == 1
    assert len(ranks) < len(out) < len(ranks) + 1000
