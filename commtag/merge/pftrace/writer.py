"""The merged trace's writer: a header, then each rank's process, groups and rows.

Usage (what :mod:`commtag.merge.engine.pipeline` does, one worker writing ranks 0 and 1)::

    with open("merged.pftrace", "wb") as out:
        out.write(header(first_ns, origin))
        seq = rank_sequence(0, origin)        # encodes each rank's events while they are read
        for timeline in (rank0, rank1):       # RankTimeline, from commtag.merge.rank.convert
            write_rank(out, timeline, seq)
        LanesWriter(origin, 0).write(out, lanes, instances, counters, markers)  # commtag.merge.pftrace.lanes

(``header`` is :func:`commtag.merge.pftrace.packets.header`, re-exported here.)

Two kinds of packets, two ways of writing them:

* the per-event packets (slice BEGIN and END, instants: two or three per
  source event, millions per merge) are framed here by hand from
  precomputed byte fragments (:mod:`commtag.merge.pftrace.wire`): 12 us per slice
  written here, nesting on backing tracks included, against 20 us for one
  generated TracePacket per BEGIN and per END without it (1.7x; 100,000
  slices, 200 names, 4 annotations each; 2-core machine);
  ``tests/test_wire.py`` checks each such packet, byte for byte, against the
  generated protos' encoding;
* the cold ones (header, track descriptors, counter values, interned data: a
  few hundred packets and one counter value per analysed collective) are
  Perfetto's generated messages (:mod:`commtag.merge.pftrace.packets`), whose module
  is loaded at the first of them.

A marker is an instant like any other (its name, category and args go
through the one annotation encoder of :class:`SequenceWriter`); its track is
a cold descriptor. The rules this writer follows are
those trace_processor applies at import (see the project's reference
perfetto-import-rules.md), and ``commtag validate`` checks them.

Layout of the file: a header (ClockSnapshot, root descriptor ordering the
processes), then per merge worker one block per rank of its chunk, then the
lanes block of those ranks (process-group lanes, cross-rank flows, the
analysis's counters and markers). Ids come from :mod:`commtag.merge.ids`.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, BinaryIO, Iterable, Optional

import orjson

from commtag.merge.ids import LANE_LOCAL, LocalIds, process_uuid, rank_sequence_id, synthetic_pid
from commtag.merge.pftrace.packets import counter_packet, descriptor_packet, interned_data, track_descriptor
from commtag.merge.pftrace.packets import header as header  # the writer's API: a trace starts with it
from commtag.merge.timeline import RankTimeline, Row
from commtag.merge.pftrace.wire import (
    ANNOTATION_BOOL,
    ANNOTATION_DOUBLE,
    ANNOTATION_INT,
    ANNOTATION_NAME_IID,
    ANNOTATION_STRING,
    ANNOTATION_STRING_IID,
    EVENT_CATEGORY_IID,
    EVENT_DEBUG_ANNOTATION,
    EVENT_FLOW_ID,
    EVENT_NAME_IID,
    EVENT_TERMINATING_FLOW_ID,
    EVENT_TRACK_UUID,
    EVENT_TYPE,
    LOW14,
    MASK14,
    PACKET_INTERNED_DATA,
    PACKET_SEQUENCE_FLAGS,
    PACKET_SEQUENCE_ID,
    PACKET_TIMESTAMP,
    PACKET_TRACK_EVENT,
    SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE,
    SMALL_VARINTS,
    TRACE_PACKET,
    TYPE_INSTANT,
    TYPE_SLICE_BEGIN,
    TYPE_SLICE_END,
    length_delimited,
    since_origin,
    timestamp_encoder,
    varint,
    varint_field,
)

if TYPE_CHECKING:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackDescriptor

#: The fields that open a TrackEvent of each type.
BEGIN = varint_field(EVENT_TYPE, TYPE_SLICE_BEGIN)
END = varint_field(EVENT_TYPE, TYPE_SLICE_END)
INSTANT = varint_field(EVENT_TYPE, TYPE_INSTANT)
#: The sequence flags of a sequence's first packet, and of every event packet after it.
_FIRST = varint_field(PACKET_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE)
_NEEDS = varint_field(PACKET_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE)

_INT63 = 1 << 63
#: Longest string value written once and then referenced by id. Rank lists repeat on
#: every lane slice of their group and pass 512 chars at ~120 ranks (6 KB at 1024).
_MAX_INTERNED = 16_384
#: Distinct args blocks a sequence remembers (bounded: memory, not speed, is the limit).
_MAX_BLOCKS = 20_000
_pack_double = struct.Struct("<d").pack
#: The kinds of interned entries, by their place in SequenceWriter._interned.
_CATEGORIES, _NAMES, _KEYS, _STRINGS = range(4)


def track_field(uuid: int) -> bytes:
    """The TrackEvent field that puts an event on track ``uuid``."""
    return EVENT_TRACK_UUID + varint(uuid)


class SequenceWriter:
    """Packets of one sequence: interning tables, flags, slice/instant/counter events.

    The per-event packets are framed by hand; :func:`emit_rows`, the loop that
    writes every slice, builds the common packet itself from the public
    attributes below (read there, never rebound outside this class).
    """

    def __init__(self, seq_id: int, origin: int = 0) -> None:
        self.out = bytearray()
        #: Timestamps are written relative to this.
        self.origin = origin
        #: Varints of timestamps' bits above the low 28, by value (see wire.timestamp_encoder).
        self.timestamp_highs: dict[int, bytes] = {}
        #: A timestamp's varint, relative to ``origin``.
        self.encode_timestamp = timestamp_encoder(origin, self.timestamp_highs)
        self._seq_id = seq_id
        self._seq = PACKET_SEQUENCE_ID + varint(seq_id)
        #: What follows the timestamp in a plain event packet, up to the event's length.
        self.after_timestamp = self._seq + _NEEDS + PACKET_TRACK_EVENT
        #: True when the next event packet may be plain: the sequence has started and no
        #: interned data waits to go out with it (else write it with :meth:`event`).
        self.plain = False
        self._started = False
        #: Interned (iid, text) entries to go out with the next event packet: categories, names,
        #: annotation names, string values (the arguments of packets.interned_data).
        self._interned: tuple[list[tuple[int, str]], ...] = ([], [], [], [])
        self._float_keys: dict[str, bytes] = {}
        self._names: dict[str, bytes] = {}
        self._cats: dict[str, bytes] = {}
        self._keys: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        self._ann_cache: dict[tuple, bytes] = {}
        self._int_keys: dict[str, tuple[bytes, ...]] = {}
        #: Encoded annotations by the args' JSON: most events repeat an earlier event's args.
        self._blocks: dict[bytes, bytes] = {}
        #: id(args) -> (encoded, args) of shared_annotations.
        self._shared: dict[int, tuple[bytes, dict]] = {}

    # -- packets ---------------------------------------------------------
    def descriptor(self, desc: TrackDescriptor) -> None:
        """A TrackDescriptor packet (:func:`commtag.merge.pftrace.packets.track_descriptor`); the first
        packet also clears the sequence's state."""
        flags = None
        if not self._started:
            flags = SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE
            self._started = True
            self.plain = not any(self._interned)
        self.out += descriptor_packet(self._seq_id, flags, desc)

    def event(self, ts: int, event: bytes, out: bytearray) -> None:
        """An event packet of TrackEvent bytes ``event``, with the interned data it needs."""
        n = len(event)
        size = SMALL_VARINTS[n] if n < 0x4000 else varint(n)
        if self.plain:
            # The common case, as few copies of the event's bytes as possible.
            head = PACKET_TIMESTAMP + self.encode_timestamp(ts) + self.after_timestamp + size
            out += TRACE_PACKET + varint(len(head) + n) + head
            out += event
            return
        body = PACKET_TIMESTAMP + self.encode_timestamp(ts) + self._seq
        if any(self._interned):
            body += length_delimited(PACKET_INTERNED_DATA, interned_data(*self._interned))
            for entries in self._interned:
                entries.clear()
        if self._started:
            body += _NEEDS
        else:
            body += _FIRST
            self._started = True
        body += PACKET_TRACK_EVENT + size + event
        self.plain = True
        out += TRACE_PACKET
        out += varint(len(body))
        out += body

    def body(self, name: str, cat: Optional[str], args: Optional[dict]) -> bytes:
        """A TrackEvent's name, category and debug annotations, to be written later by
        :func:`emit_rows` (slices) or :meth:`instant` (interned strings go out with the next packet written)."""
        data = self._names.get(name) or self._name(name)
        if cat:
            data += self._cats.get(cat) or self._cat(cat)
        if args:
            try:
                key = orjson.dumps(args)
            except TypeError:  # a value JSON cannot hold as such (an int beyond 64 bits)
                return data + self.annotations(args)
            block = self._blocks.get(key)
            if block is None:
                block = self.annotations(args)
                if len(self._blocks) < _MAX_BLOCKS:
                    # A copy: orjson's own bytes carry kilobytes of spare capacity.
                    self._blocks[bytes(memoryview(key))] = block
            data += block
        return data

    @staticmethod
    def flows(flows_out: Optional[Iterable[int]], flows_in: Optional[Iterable[int]]) -> bytes:
        """Payload bytes that start (continue) ``flows_out`` and terminate ``flows_in``; appended
        to a :meth:`body` (fields may come in any order)."""
        flow_fields = SequenceWriter.flow_fields
        return b"".join([flow_fields(fid)[0] for fid in flows_out or ()] + [flow_fields(fid)[1] for fid in flows_in or ()])

    @staticmethod
    def flow_fields(fid: int) -> tuple[bytes, bytes]:
        """The payload bytes that start flow ``fid`` and those that terminate it."""
        le = fid.to_bytes(8, "little")
        return EVENT_FLOW_ID + le, EVENT_TERMINATING_FLOW_ID + le

    def shared_annotations(self, args: dict) -> bytes:
        """:meth:`annotations` of a dict that many events carry (a call site's common args),
        encoded once per sequence. The dict must not change; it is held, so its id stays its own."""
        found = self._shared.get(id(args))
        if found is None:
            found = self._shared[id(args)] = (self.annotations(args), args)
        return found[0]

    def instant(self, ts: int, track: bytes, body: bytes, out: Optional[bytearray] = None) -> None:
        """An instant on ``track`` (:func:`track_field`) with ``body`` (:meth:`body`)."""
        self.event(ts, INSTANT + track + body, self.out if out is None else out)

    def end_tail(self, track: bytes) -> bytes:
        """Everything after the timestamp of an END on ``track`` (no interning, no flags)."""
        return self._seq + PACKET_TRACK_EVENT + varint(len(END) + len(track)) + END + track

    def end(self, ts: int, tail: bytes, out: Optional[bytearray] = None) -> None:
        """An END packet: ``tail`` is :meth:`end_tail`'s."""
        ts_b = self.encode_timestamp(ts)
        (self.out if out is None else out).extend(
            TRACE_PACKET + varint(len(PACKET_TIMESTAMP) + len(ts_b) + len(tail)) + PACKET_TIMESTAMP + ts_b + tail)

    def counter(self, ts: int, uuid: int, value: float) -> None:
        """A counter value on counter track ``uuid``."""
        self.out += counter_packet(self._seq_id, since_origin(ts, self.origin), uuid, value)

    # -- interning -------------------------------------------------------
    def _intern(self, table: dict, kind: int, text: str) -> int:
        """The next iid of ``table`` (the caller stores it), its entry added to the next event
        packet's InternedData (``kind``: the entry's place in ``_interned``)."""
        iid = len(table) + 1
        self._interned[kind].append((iid, text))
        self.plain = False
        return iid

    def _name(self, name: str) -> bytes:
        part = self._names.get(name)
        if part is None:
            part = self._names[name] = varint_field(EVENT_NAME_IID, self._intern(self._names, _NAMES, name))
        return part

    def _cat(self, cat: str) -> bytes:
        part = self._cats.get(cat)
        if part is None:
            part = self._cats[cat] = varint_field(EVENT_CATEGORY_IID, self._intern(self._cats, _CATEGORIES, cat))
        return part

    def _key(self, key: str) -> int:
        iid = self._keys.get(key)
        if iid is None:
            iid = self._keys[key] = self._intern(self._keys, _KEYS, key)
        return iid

    def _string(self, text: str) -> bytes:
        iid = self._strings.get(text)
        if iid is None:
            iid = self._strings[text] = self._intern(self._strings, _STRINGS, text)
        return varint_field(ANNOTATION_STRING_IID, iid)

    def annotations(self, args: dict) -> bytes:
        """Payload bytes of debug annotations of ``args`` (a repeated field: appending adds more):
        per key, the bytes before the value are made once.

        Non-negative ints and floats (most Kineto args: ids, sizes,
        occupancy) are the key's prefix plus the value; other values are
        cached whole by (key, value).
        """
        cache = self._ann_cache
        int_keys = self._int_keys
        float_keys = self._float_keys
        parts = []
        for key, value in args.items():
            cls = value.__class__
            if cls is int and 0 <= value < _INT63:
                heads = int_keys.get(key)
                if heads is None:
                    heads = int_keys[key] = self._int_heads(key)
                if value < 0x4000:
                    val = SMALL_VARINTS[value]
                elif value < 0x10000000:
                    val = LOW14[value & MASK14] + SMALL_VARINTS[value >> 14]
                else:
                    val = varint(value)
                parts.append(heads[len(val)] + val)
                continue
            if cls is float:
                head = float_keys.get(key)
                if head is None:
                    kb = ANNOTATION_NAME_IID + varint(self._key(key))
                    head = float_keys[key] = (EVENT_DEBUG_ANNOTATION + varint(len(kb) + len(ANNOTATION_DOUBLE) + 8)
                                              + kb + ANNOTATION_DOUBLE)
                parts.append(head + _pack_double(value))
                continue
            if cls is list or cls is dict:
                value = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
                cls = str
            if cls is str or cls is bool or cls is int:
                ck = (key, value, cls)
                enc = cache.get(ck)
                if enc is None:
                    enc = self._annotation(key, value)
                    if len(cache) < 200_000:
                        cache[ck] = enc
                parts.append(enc)
            else:
                parts.append(self._annotation(key, value))
        return b"".join(parts)

    def _int_heads(self, key: str) -> tuple[bytes, ...]:
        """An int annotation's bytes before its value, by the value's varint length (1 to 9)."""
        head = ANNOTATION_NAME_IID + varint(self._key(key)) + ANNOTATION_INT
        return tuple(EVENT_DEBUG_ANNOTATION + varint(len(head) + n) + head for n in range(10))

    def _annotation(self, key: str, value: object) -> bytes:
        body = ANNOTATION_NAME_IID + varint(self._key(key))
        cls = value.__class__
        if cls is bool:
            body += ANNOTATION_BOOL + varint(int(value))
        elif cls is int:
            if 0 <= value < _INT63:
                body += ANNOTATION_INT + varint(value)
            elif -_INT63 <= value < 0:
                body += ANNOTATION_INT + varint(value + (1 << 64))
            else:
                body += self._string(str(value))
        elif cls is float:
            body += ANNOTATION_DOUBLE + _pack_double(value)
        elif cls is str:
            body += self._string(value) if len(value) <= _MAX_INTERNED else length_delimited(ANNOTATION_STRING, value.encode())
        elif value is None:
            body += self._string("null")
        else:
            text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
            body += self._string(text) if len(text) <= _MAX_INTERNED else length_delimited(ANNOTATION_STRING, text.encode())
        return length_delimited(EVENT_DEBUG_ANNOTATION, body)


def emit_rows(stream: BinaryIO, seq: SequenceWriter, slices: Row, parent: int, name: str, order: int,
              merge_key: str, ids: LocalIds, instants: Optional[Row] = None,
              summary: Optional[tuple[str, dict]] = None) -> None:
    """Write the slices of one source row on as few backing tracks as proper nesting allows.

    Each backing track gets the slices that nest properly on it; a slice that
    would cross one goes to the next. All backing tracks share parent, name
    and sibling_merge_key, so the UI shows them as one row with the
    overlapping slices stacked, and no timestamp changes. ``summary`` (name,
    args): an instant at the row's first slice that describes the whole row
    (its kernel categories), clickable where the row starts.
    """
    order_ = slices.in_start_order()
    starts, ends, offsets, data, extra = slices.starts, slices.ends, slices.offsets, slices.data, slices.extra
    body = bytearray()
    stacks: list[list[int]] = []
    tails: list[bytes] = []
    tracks: list[bytes] = []
    uuids: list[int] = []
    #: Per backing track: a BEGIN's first fields, and an END packet's bytes before its timestamp by the
    #: timestamp's varint length (the packet's size depends only on that).
    begins: list[bytes] = []
    end_heads: list[tuple[bytes, ...]] = []
    # BEGIN and END packets (SequenceWriter.event and .end), inlined for the plain case: this loop runs twice
    # per slice of the whole merge. So is the timestamp's varint where its high bits are cached: 28 low bits
    # by table and the cached rest. Packets are appended field by field: no temporary bytes per packet.
    ts_bytes, after_ts = seq.encode_timestamp, seq.after_timestamp
    origin, highs, low, mask, small = seq.origin, seq.timestamp_highs, LOW14, MASK14, SMALL_VARINTS
    packet_tag, ts_tag = TRACE_PACKET, PACKET_TIMESTAMP
    fixed = len(ts_tag) + len(after_ts)
    for i in order_:
        start, stop = starts[i], ends[i]
        k = 0
        for stack in stacks:
            while stack and stack[-1] <= start:
                n = stack.pop() - origin
                tail = highs.get(n >> 28) if n >= 0x10000000 else None
                ts_b = low[n & mask] + low[(n >> 14) & mask] + tail if tail is not None else ts_bytes(n + origin)
                body += end_heads[k][len(ts_b)]
                body += ts_b
                body += tails[k]
            if not stack or stop <= stack[-1]:
                break
            k += 1
        else:
            uuid = ids()
            uuids.append(uuid)
            track = track_field(uuid)
            tracks.append(track)
            tails.append(seq.end_tail(track))
            end_heads.append(tuple(packet_tag + varint(len(ts_tag) + size + len(tails[-1])) + ts_tag
                                   for size in range(11)))
            begins.append(BEGIN + track)
            stacks.append([])
        stacks[k].append(stop)
        more = extra.get(i)
        event = begins[k] + data[offsets[i]:offsets[i + 1]]
        if more:
            event += more
        if not seq.plain:
            seq.event(start, event, body)
            continue
        n = start - origin
        tail = highs.get(n >> 28) if n >= 0x10000000 else None
        ts_b = low[n & mask] + low[(n >> 14) & mask] + tail if tail is not None else ts_bytes(start)
        n = len(event)
        length = small[n] if n < 0x4000 else varint(n)
        size = fixed + len(ts_b) + len(length) + n
        body += packet_tag
        body += small[size] if size < 0x4000 else varint(size)
        body += ts_tag
        body += ts_b
        body += after_ts
        body += length
        body += event
    for k, stack in enumerate(stacks):
        while stack:
            seq.end(stack.pop(), tails[k], body)
    if not tracks:  # a row with only instants, or an empty lane: still one track
        uuid = ids()
        uuids.append(uuid)
        tracks.append(track_field(uuid))
    if instants is not None:
        instant, payload = seq.instant, instants.payload
        for i, ts in enumerate(instants.starts):
            instant(ts, tracks[0], payload(i), body)
    if summary is not None and order_:
        seq.instant(starts[order_[0]], tracks[0], seq.body(summary[0], "commtag", summary[1]), body)
    for uuid in uuids:
        seq.descriptor(track_descriptor(
            uuid, name, parent=parent, sibling_order_rank=order,
            merge_key=merge_key if len(uuids) > 1 else None,
        ))
    # The sequence's packets so far (descriptors last), then the row's: written, not
    # appended to seq.out, which would copy the row's packets (megabytes) once more.
    stream.write(seq.out)
    seq.out.clear()
    stream.write(body)


def rank_sequence(first_rank: int, origin: int = 0) -> SequenceWriter:
    """The sequence rank blocks are written on, one per segment of ranks, named after its first
    rank; its :meth:`SequenceWriter.body` encodes each rank's events while they are read
    (see commtag.merge.rank.convert). One sequence for all of a segment's ranks: their interning
    tables and encoded-args caches carry over from rank to rank, as ranks mostly repeat each
    other's names and args."""
    return SequenceWriter(rank_sequence_id(first_rank), origin)


def write_rank(stream: BinaryIO, timeline: RankTimeline, seq: Optional[SequenceWriter] = None) -> None:
    """Write one rank's process, groups and rows (slices already encoded by ``seq``, which may go
    on to the worker's next rank)."""
    rank = timeline.rank
    seq = seq or rank_sequence(rank)
    proc = process_uuid(rank)
    seq.descriptor(track_descriptor(
        proc, timeline.process_name, pid=synthetic_pid(rank), process_name=timeline.process_name,
        labels=timeline.labels, sibling_order_rank=rank,
    ))
    ids = LocalIds(rank, 2, LANE_LOCAL)
    groups: dict[str, int] = {}
    for track in sorted(timeline.tracks, key=lambda t: (t.group, t.order, t.name)):
        parent = groups.get(track.group)
        if parent is None:
            parent = groups[track.group] = ids()
            seq.descriptor(track_descriptor(parent, track.group, parent=proc, explicit_child_order=True))
        key = f"r{rank}:{track.group}:{track.name}"
        emit_rows(stream, seq, track.slices, parent, track.name, track.order, key, ids, track.instants,
                  track.summary)
    stream.write(seq.out)
    seq.out.clear()
