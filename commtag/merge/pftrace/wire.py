"""Protobuf wire format: what the trace writer encodes by hand, and the one frame reader.

The writer builds its per-event packets from byte fragments (see
:mod:`commtag.merge.pftrace.writer` for why); the fragments' field tags are
named here, computed at import from Perfetto's field numbers, which are
written only here (with the enum values those packets use);
``tests/test_wire.py`` checks each against Perfetto's generated protos. A
trace file is a run of ``Trace.packet`` frames (the tag, the packet's
length, the packet); :func:`iter_frames` reads them back for
:mod:`commtag.merge.pftrace.readback` and :mod:`commtag.merge.pftrace.validate`.
"""

from __future__ import annotations

from typing import BinaryIO, Iterator

from commtag.errors import CommtagError

WIRE_VARINT, WIRE_I64, WIRE_LEN = 0, 1, 2


def _slow_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: The varint of every n below 2**14 (one or two bytes).
SMALL_VARINTS = [_slow_varint(i) for i in range(1 << 14)]
#: 14 bits as two varint bytes, both with the continuation bit set: a longer varint's low part.
LOW14 = [bytes(((i & 0x7F) | 0x80, ((i >> 7) & 0x7F) | 0x80)) for i in range(1 << 14)]
MASK14 = 0x3FFF


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (< 2**64), 14 bits per table lookup."""
    if n < 0x4000:
        return SMALL_VARINTS[n]
    if n < 0x10000000:
        return LOW14[n & MASK14] + SMALL_VARINTS[n >> 14]
    if n < 0x40000000000:
        return LOW14[n & MASK14] + LOW14[(n >> 14) & MASK14] + SMALL_VARINTS[n >> 28]
    if n < 0x100000000000000:
        return LOW14[n & MASK14] + LOW14[(n >> 14) & MASK14] + LOW14[(n >> 28) & MASK14] + SMALL_VARINTS[n >> 42]
    return (LOW14[n & MASK14] + LOW14[(n >> 14) & MASK14] + LOW14[(n >> 28) & MASK14] + LOW14[(n >> 42) & MASK14]
            + SMALL_VARINTS[n >> 56])


def tag(field: int, wire_type: int) -> bytes:
    """A field's encoded key: its number and wire type."""
    return varint(field << 3 | wire_type)


# Perfetto's field numbers (protos/perfetto/trace/...) of the hand-framed event packets, one
# name per field (the cold packets are the generated protos' own: commtag.merge.pftrace.packets).
TRACE_PACKET = tag(1, WIRE_LEN)  # Trace.packet

PACKET_TIMESTAMP = tag(8, WIRE_VARINT)
PACKET_SEQUENCE_ID = tag(10, WIRE_VARINT)  # trusted_packet_sequence_id
PACKET_SEQUENCE_FLAGS = tag(13, WIRE_VARINT)
PACKET_TRACK_EVENT = tag(11, WIRE_LEN)
PACKET_INTERNED_DATA = tag(12, WIRE_LEN)  # its payload: packets.interned_data
PACKET_DEFAULTS = tag(59, WIRE_LEN)  # trace_packet_defaults, its payload: packets.track_defaults

EVENT_TYPE = tag(9, WIRE_VARINT)
EVENT_TRACK_UUID = tag(11, WIRE_VARINT)
EVENT_NAME_IID = tag(10, WIRE_VARINT)
EVENT_CATEGORY_IID = tag(3, WIRE_VARINT)  # repeated category_iids, unpacked
EVENT_DEBUG_ANNOTATION = tag(4, WIRE_LEN)
EVENT_FLOW_ID = tag(47, WIRE_I64)  # repeated fixed64 flow_ids
EVENT_TERMINATING_FLOW_ID = tag(48, WIRE_I64)

ANNOTATION_NAME_IID = tag(1, WIRE_VARINT)
ANNOTATION_BOOL = tag(2, WIRE_VARINT)
ANNOTATION_INT = tag(4, WIRE_VARINT)
ANNOTATION_DOUBLE = tag(5, WIRE_I64)
ANNOTATION_STRING = tag(6, WIRE_LEN)
ANNOTATION_STRING_IID = tag(17, WIRE_VARINT)

# Perfetto's enum values the hand-framed packets use.
TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_INSTANT = 1, 2, 3  # TrackEvent.Type
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2  # TracePacket.SequenceFlags
#: The clock each event sequence counts its timestamps on: ids 64 to 127 are a sequence's own
#: (ClockSnapshot.Clock in protos/perfetto/trace/clock_snapshot.proto). Declared incremental, it
#: makes each packet's timestamp the ns since the sequence's previous timestamped packet.
SEQUENCE_CLOCK = 64
#: A uint64 field's bits: a negative delta goes out as its two's complement (10 bytes), which
#: trace_processor reads back as a signed step (it casts a packet's timestamp to int64).
UINT64 = 0xFFFFFFFFFFFFFFFF


def varint_field(field_tag: bytes, value: int) -> bytes:
    """A varint field of a non-negative value (a negative int32/int64 as its 64-bit two's complement)."""
    return field_tag + varint(value & 0xFFFFFFFFFFFFFFFF)


def length_delimited(field_tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (a string or an embedded message)."""
    return field_tag + varint(len(payload)) + payload


def frame(packet: bytes) -> bytes:
    """One ``Trace.packet`` frame: files are runs of these."""
    return TRACE_PACKET + varint(len(packet)) + packet


def since_origin(ts: int, origin: int) -> int:
    """``ts - origin``: a timestamp as the trace writes it; a ValueError for one before the origin."""
    if ts < origin:
        raise ValueError(f"timestamp {ts} ns is before the trace's origin {origin} ns")
    return ts - origin


class FrameError(CommtagError, ValueError):
    """The bytes are not a run of ``Trace.packet`` frames (the message says where)."""


def iter_frames(stream: BinaryIO, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """The serialized packets of a trace, one frame at a time (memory: one chunk plus one packet).

    Raises :class:`FrameError` at the first byte that does not continue a frame.
    """
    (packet_tag,) = TRACE_PACKET
    buf = bytearray()
    pos = 0
    base = 0  # the file offset of buf[0]
    eof = False

    def fill(need: int) -> None:
        """Read until ``need`` bytes follow ``pos`` or the stream ends."""
        nonlocal buf, pos, base, eof
        if pos:
            del buf[:pos]
            base += pos
            pos = 0
        while len(buf) < need and not eof:
            more = stream.read(max(chunk_size, need - len(buf)))
            if more:
                buf += more
            else:
                eof = True

    while True:
        if len(buf) - pos < 11:  # a tag and the longest varint
            fill(11)
            if pos == len(buf):
                return
        at = base + pos
        if buf[pos] != packet_tag:
            raise FrameError(f"not a Perfetto protobuf trace (byte {at} holds field tag 0x{buf[pos]:02x}, "
                             f"not a packet frame's 0x{packet_tag:02x})")
        p = pos + 1
        size = shift = 0
        while True:
            if p >= len(buf):
                raise FrameError(f"truncated trace (the frame length at byte {at} is cut short)")
            byte = buf[p]
            p += 1
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift > 63:
                raise FrameError(f"not a Perfetto protobuf trace (bad frame length at byte {at})")
        end = p + size
        if end > len(buf):
            head = p - pos
            fill(head + size)
            p, end = head, head + size
            if end > len(buf):
                raise FrameError(f"truncated trace (the packet at byte {at} is cut short: "
                                 f"{len(buf) - p} of {size} bytes)")
        yield bytes(buf[p:end])
        pos = end
