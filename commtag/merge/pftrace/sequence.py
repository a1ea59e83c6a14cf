"""One packet sequence of the merged trace: its interned names and args, and the slices it frames.

:class:`SequenceWriter` frames TrackEvent packets by hand (the hot path:
see :mod:`commtag.merge.pftrace.wire`) and interns what repeats; the rank
blocks and lanes that use it are :mod:`commtag.merge.pftrace.writer` and
:mod:`commtag.merge.pftrace.lanes`.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Callable, Iterable, Optional

import orjson

from commtag.merge.pftrace.packets import (counter_packet, descriptor_packet, interned_data, sequence_start,
                                           track_defaults)
from commtag.merge.pftrace.wire import (
    ANNOTATION_BOOL,
    ANNOTATION_DOUBLE,
    ANNOTATION_INT,
    ANNOTATION_NAME_IID,
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
    PACKET_DEFAULTS,
    PACKET_INTERNED_DATA,
    PACKET_SEQUENCE_ID,
    PACKET_TIMESTAMP,
    PACKET_TRACK_EVENT,
    SMALL_VARINTS,
    TRACE_PACKET,
    TYPE_INSTANT,
    TYPE_SLICE_BEGIN,
    TYPE_SLICE_END,
    UINT64,
    length_delimited,
    since_origin,
    varint,
    varint_field,
)

if TYPE_CHECKING:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackDescriptor


_INT63 = 1 << 63
_pack_double = struct.Struct("<d").pack
#: The kinds of interned entries, by their place in SequenceWriter._interned.
_CATEGORIES, _NAMES, _KEYS, _STRINGS = range(4)
#: The fields that open a TrackEvent of each type.
BEGIN = varint_field(EVENT_TYPE, TYPE_SLICE_BEGIN)


END = varint_field(EVENT_TYPE, TYPE_SLICE_END)


INSTANT = varint_field(EVENT_TYPE, TYPE_INSTANT)


#: Distinct args blocks a sequence remembers (bounded: memory, not speed, is the limit).
_MAX_BLOCKS = 20_000
#: Events of one name whose args missed the blocks in a row before a sequence stops looking them up
#: there (a memory instant's addresses and totals, a copy's bandwidth: never the same twice).
_MAX_MISSES = 64


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
        #: No timestamp is before this: the sequence's clock starts there (packets.sequence_start).
        self.origin = origin
        #: The timestamp of the sequence's last timestamped packet: the next one is written as the
        #: ns after it (see :meth:`timestamp`).
        self.last = origin
        self._seq_id = seq_id
        self._seq = PACKET_SEQUENCE_ID + varint(seq_id)
        #: What follows the timestamp in a plain event packet, up to the event's length.
        self.after_timestamp = self._seq + PACKET_TRACK_EVENT
        #: The same with the event's length, by that length (below 128).
        self.after_lengths = [self.after_timestamp + SMALL_VARINTS[n] for n in range(0x80)]
        #: True when the next event packet may be plain: the sequence has started and no
        #: interned data waits to go out with it (else write it with :meth:`event`).
        self.plain = False
        self._started = False
        #: Interned (iid, text) entries to go out with the next event packet: categories, names,
        #: annotation names, string values (the arguments of packets.interned_data).
        self._interned: tuple[list[tuple[int, str]], ...] = ([], [], [], [])
        #: Bytes of interned data written so far (what a sequence shared by more ranks writes once).
        self.interned_bytes = 0
        #: The TracePacketDefaults field to go out with the next event packet (see :meth:`default_track`).
        self._defaults = b""
        self._float_keys: dict[str, bytes] = {}
        self._names: dict[str, bytes] = {}
        self._cats: dict[str, bytes] = {}
        self._keys: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        self._ann_cache: dict[tuple, bytes] = {}
        self._int_keys: dict[str, tuple[bytes, ...]] = {}
        #: Encoded annotations by the args' JSON: most events repeat an earlier event's args.
        self._blocks: dict[bytes, bytes] = {}
        #: Event name -> its events' args that missed the blocks in a row; the names that stopped looking.
        self._missed: dict[str, int] = {}
        self._unrepeated: set[str] = set()
        #: id(args) -> (encoded, args) of shared_annotations.
        self._shared: dict[int, tuple[bytes, dict]] = {}

    # -- packets ---------------------------------------------------------
    def _start(self, out: bytearray) -> None:
        """The sequence's first packet (:func:`commtag.merge.pftrace.packets.sequence_start`). The
        packets after it carry no flags: trace_processor resolves interned ids and defaults on every
        packet of a sequence, and reads SEQ_NEEDS_INCREMENTAL_STATE only to skip a packet after a
        loss of data, which a written file has not (ProtoTraceReader::ParsePacket)."""
        out += sequence_start(self._seq_id)
        self._started = True

    def timestamp(self, ts: int) -> bytes:
        """The varint of ``ts`` on the sequence's clock: the ns since its previous timestamped packet
        (a step back, at a row's start, as a 10-byte two's complement); ``ts`` becomes the previous.
        A ValueError for a timestamp before the origin."""
        if ts < self.origin:
            since_origin(ts, self.origin)  # raises
        step = ts - self.last
        self.last = ts
        return varint(step & UINT64)

    def descriptor(self, desc: TrackDescriptor) -> None:
        """A TrackDescriptor packet (:func:`commtag.merge.pftrace.packets.track_descriptor`), after
        the sequence's first packet."""
        if not self._started:
            self._start(self.out)
            self.plain = not any(self._interned) and not self._defaults
        self.out += descriptor_packet(self._seq_id, desc)

    def event(self, ts: int, event: bytes, out: bytearray) -> None:
        """An event packet of TrackEvent bytes ``event``, with the interned data it needs."""
        n = len(event)
        size = SMALL_VARINTS[n] if n < 0x4000 else varint(n)
        if self.plain:
            # The common case, as few copies of the event's bytes as possible.
            head = PACKET_TIMESTAMP + self.timestamp(ts) + self.after_timestamp + size
            out += TRACE_PACKET + varint(len(head) + n) + head
            out += event
            return
        if not self._started:
            self._start(out)
        body = PACKET_TIMESTAMP + self.timestamp(ts) + self._seq
        if any(self._interned):
            interned = length_delimited(PACKET_INTERNED_DATA, interned_data(*self._interned))
            self.interned_bytes += len(interned)
            body += interned
            for entries in self._interned:
                entries.clear()
        if self._defaults:
            body += self._defaults
            self._defaults = b""
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
            if name in self._unrepeated:
                return data + self.annotations(args)
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
                missed = self._missed[name] = self._missed.get(name, 0) + 1
                if missed >= _MAX_MISSES:
                    self._unrepeated.add(name)
            else:
                self._missed[name] = 0
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

    def instant(self, ts: int, track: bytes, body: bytes | bytearray, out: Optional[bytearray] = None) -> None:
        """An instant on ``track`` (:func:`track_field`) with ``body`` (:meth:`body`)."""
        self.event(ts, INSTANT + track + body, self.out if out is None else out)

    def default_track(self, uuid: int) -> bytes:
        """Make ``uuid`` the sequence's default track from the next event packet on (which carries
        the TracePacketDefaults), and return the track field of events on it: none, 3 bytes fewer
        per event. Valid until the next call: a row's packets are written together
        (:func:`commtag.merge.pftrace.writer.emit_rows`), so each row makes its main track the default."""
        self._defaults = length_delimited(PACKET_DEFAULTS, track_defaults(uuid))
        self.plain = False
        return b""

    def end_tail(self, track: bytes) -> bytes:
        """Everything after the timestamp of an END on ``track`` (no interning, no flags)."""
        return self._seq + PACKET_TRACK_EVENT + varint(len(END) + len(track)) + END + track

    def end(self, ts: int, tail: bytes, out: Optional[bytearray] = None) -> None:
        """An END packet: ``tail`` is :meth:`end_tail`'s."""
        ts_b = self.timestamp(ts)
        (self.out if out is None else out).extend(
            TRACE_PACKET + varint(len(PACKET_TIMESTAMP) + len(ts_b) + len(tail)) + PACKET_TIMESTAMP + ts_b + tail)

    def counter(self, ts: int, uuid: int, value: float) -> None:
        """A counter value on counter track ``uuid``."""
        if not self._started:
            self._start(self.out)
        if ts < self.origin:
            since_origin(ts, self.origin)  # raises
        self.out += counter_packet(self._seq_id, ts - self.last, uuid, value)
        self.last = ts

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
        """A string value's reference: every string, however long, is written once per sequence and
        then referenced by id. Rank lists repeat on every lane slice of their group (110 KB at 16,384
        ranks), a group's description on each of its slices: one of 1.1 MB written on each made a
        few hundred slices a 637 MB file."""
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
        if value.__class__ is bool:
            body += ANNOTATION_BOOL + varint(int(value))
        elif value.__class__ is int:
            if 0 <= value < _INT63:
                body += ANNOTATION_INT + varint(value)
            elif -_INT63 <= value < 0:
                body += ANNOTATION_INT + varint(value + (1 << 64))
            else:
                body += self._string(str(value))
        elif value.__class__ is float:
            body += ANNOTATION_DOUBLE + _pack_double(value)
        elif value.__class__ is str:
            body += self._string(value)
        elif value is None:
            body += self._string("null")
        else:
            body += self._string(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode())
        return length_delimited(EVENT_DEBUG_ANNOTATION, body)


class SequenceBlocks:
    """The sequence each rank is written on: the ranks of one block (rank // ``block``,
    :func:`commtag.merge.ids.sequence_block`) share one, started (``sequence_id``) at the first of
    them this writer writes, its interning afresh; so no two writers start one id."""

    def __init__(self, block: int, sequence_id: Callable[[int, int], int], origin: int = 0) -> None:
        self._block = block
        self._sequence_id = sequence_id
        self._origin = origin
        self._current: Optional[tuple[int, SequenceWriter]] = None

    def __call__(self, rank: int) -> SequenceWriter:
        key = rank // self._block
        if self._current is None or self._current[0] != key:
            self._current = (key, SequenceWriter(self._sequence_id(rank, self._block), self._origin))
        return self._current[1]
