"""Hand-encoded Perfetto TrackEvent protobuf: the merged trace's writer.

Why by hand: building protobuf messages costs several microseconds per
packet in Python; concatenating precomputed byte fragments is several times
cheaper, and a merge writes two packets per source event. Field numbers are
Perfetto's (protos/perfetto/trace/...); the rules this writer follows are
those trace_processor applies at import (see the project's reference
perfetto-import-rules.md), and ``commtag validate`` checks them.

Layout of the file: a header (ClockSnapshot, root descriptor ordering the
processes), then per merge worker one block per rank of its chunk, then the
lanes block of those ranks (process-group lanes, cross-rank flows, the
analysis's counters and markers). Blocks only use ids derived from their
rank (flow ids from the matching, which every worker runs alike), so the
workers' parts concatenate.

Ids: a track uuid interleaves the bits of ``rank + 1`` and a per-rank
``local`` (see ``track_uuid``: every event packet names its track, so small
ids matter); rank blocks use locals below ``LANE_LOCAL``, the lanes block
above it. Flow ids carry their kind
in the top bits (see ``flow_id``). A worker's rank blocks are one packet
sequence and its lanes block another, both numbered after the worker's
first rank (``rank_sequence``, ``LanesWriter``); the header has its own.
"""

from __future__ import annotations

import struct
from typing import BinaryIO, Callable, Collection, Iterable, Optional, Sequence

import orjson

from commtag.kernels import ANN_DESCRIBE
from commtag.merge.records import CollectiveInstance, CounterSeries, Marker, match_groups
from commtag.merge.timeline import CPU_GROUP, LANE_GROUP, RankTimeline, Row, Track

# TracePacket: timestamp=8, trusted_packet_sequence_id=10, track_event=11,
# interned_data=12, sequence_flags=13, clock_snapshot=6, track_descriptor=60.
# TrackEvent: category_iids=3, debug_annotations=4, type=9, name_iid=10,
# track_uuid=11, double_counter_value=44, flow_ids=47, terminating_flow_ids=48.
TYPE_SLICE_BEGIN = 1
TYPE_SLICE_END = 2
TYPE_INSTANT = 3
TYPE_COUNTER = 4
SEQ_CLEARED_AND_NEEDS = 3
SEQ_NEEDS = 2
HEADER_SEQ = 1
#: A worker whose chunk starts at rank r writes its rank blocks on sequence RANK_SEQ_BASE + 2r
#: and its lanes on the next.
RANK_SEQ_BASE = 16
LOCAL_BITS = 20
LANE_LOCAL = 1 << (LOCAL_BITS - 1)
PID_BASE = 100_000
ROOT_UUID = 0
BUILTIN_CLOCK_REALTIME = 1
BUILTIN_CLOCK_BOOTTIME = 6
CHILD_ORDERING_EXPLICIT = 3
MERGE_BY_KEY = 3
PROCESS_ORDERING_EXPLICIT = 1

FLOW_LAUNCH = 1
FLOW_SOURCE = 2
FLOW_CROSS_RANK = 3

#: Groups up to this size get a flow between every pair of members, so that
#: selecting any member shows all others; bigger groups get a star.
FULL_MESH_MAX = 8

_INT63 = 1 << 63
#: Longest string value written once and then referenced by id. Rank lists repeat on
#: every lane slice of their group and pass 512 chars at ~120 ranks (6 KB at 1024).
_MAX_INTERNED = 16_384
#: Distinct args blocks a sequence remembers (bounded: memory, not speed, is the limit).
_MAX_BLOCKS = 20_000
_pack_double = struct.Struct("<d").pack


def _slow_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_V = [_slow_varint(i) for i in range(1 << 14)]
#: 14 bits as two varint bytes, both with the continuation bit set.
_L = [bytes(((i & 0x7F) | 0x80, ((i >> 7) & 0x7F) | 0x80)) for i in range(1 << 14)]
_M = 0x3FFF


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (< 2**64), 14 bits per table lookup."""
    if n < 0x4000:
        return _V[n]
    if n < 0x10000000:
        return _L[n & _M] + _V[n >> 14]
    if n < 0x40000000000:
        return _L[n & _M] + _L[(n >> 14) & _M] + _V[n >> 28]
    if n < 0x100000000000000:
        return _L[n & _M] + _L[(n >> 14) & _M] + _L[(n >> 28) & _M] + _V[n >> 42]
    return _L[n & _M] + _L[(n >> 14) & _M] + _L[(n >> 28) & _M] + _L[(n >> 42) & _M] + _V[n >> 56]


_v = varint


def _ts_encoder(origin: int, highs: dict[int, bytes]) -> Callable[[int], bytes]:
    """Varints of nanosecond timestamps relative to ``origin``: the low 28 bits by table, the
    rest cached in ``highs`` (``n >> 28`` -> its varint; :func:`_emit_rows` reads it too).

    A closure, not a callable object: it runs twice per slice, and calling a
    plain function costs less than an object's ``__call__``.
    """
    low, mask = _L, _M

    def encode(ts: int) -> bytes:
        n = ts - origin
        if n < 0:
            raise ValueError(f"timestamp {ts} ns is before the trace's origin {origin} ns")
        high = n >> 28
        if not high:
            return varint(n)
        tail = highs.get(high)
        if tail is None:
            tail = highs[high] = varint(high)
        return low[n & mask] + low[(n >> 14) & mask] + tail

    return encode


def _field_bytes(tag: bytes, payload: bytes) -> bytes:
    return tag + _v(len(payload)) + payload


def _frame(packet: bytes) -> bytes:
    """One ``Trace.packet`` (field 1) frame: files are runs of these."""
    return b"\x0a" + _v(len(packet)) + packet


def flow_id(kind: int, rank: int, counter: int) -> int:
    """A trace-unique flow id: 4 bits kind, 24 bits rank, 36 bits counter."""
    return (kind << 60) | ((rank & 0xFFFFFF) << 36) | (counter & 0xFFFFFFFFF)


def track_uuid(rank: int, local: int) -> int:
    """The bits of ``rank + 1`` and ``local`` interleaved (a Morton code): unique per
    pair, and small where both are: the varint every event packet carries takes 2 bytes
    for the first 127 tracks of ranks 0 to 126 (``(rank + 1) << LOCAL_BITS`` took 4)."""
    if local >= 1 << LOCAL_BITS:
        raise ValueError(f"rank {rank} needs more than {1 << LOCAL_BITS} tracks")
    return _spread(rank + 1) | _spread(local) << 1


def _spread(n: int) -> int:
    """``n``'s bits at the even positions (bits beyond the 20th of ``rank + 1`` stay above
    every local's: the pairing stays one to one)."""
    out = 0
    for i in range(LOCAL_BITS):
        out |= ((n >> i) & 1) << (2 * i)
    return out | (n >> LOCAL_BITS) << (2 * LOCAL_BITS)


def process_uuid(rank: int) -> int:
    return track_uuid(rank, 1)


def synthetic_pid(rank: int) -> int:
    """Every rank its own pid: trace_processor treats a repeated pid as pid reuse."""
    return PID_BASE + rank


def track_descriptor(
    uuid: int,
    name: Optional[str] = None,
    *,
    parent: Optional[int] = None,
    pid: Optional[int] = None,
    process_name: Optional[str] = None,
    labels: Sequence[str] = (),
    child_ordering: Optional[int] = None,
    sibling_order_rank: Optional[int] = None,
    merge_key: Optional[str] = None,
    process_ordering: Optional[int] = None,
    counter_unit: Optional[str] = None,
    description: Optional[str] = None,
) -> bytes:
    """Serialized TrackDescriptor (only the fields this writer uses)."""
    out = bytearray(b"\x08" + varint(uuid))
    if name is not None:
        out += _field_bytes(b"\x12", name.encode())
    if pid is not None:
        proc = bytearray(b"\x08" + varint(pid))
        if process_name is not None:
            proc += _field_bytes(b"\x32", process_name.encode())
        for label in labels:
            proc += _field_bytes(b"\x42", label.encode())
        out += _field_bytes(b"\x1a", bytes(proc))
    if parent is not None:
        out += b"\x28" + varint(parent)
    if counter_unit is not None:
        # CounterDescriptor.unit_name = 6
        out += _field_bytes(b"\x42", _field_bytes(b"\x32", counter_unit.encode()) if counter_unit else b"")
    if child_ordering is not None:
        out += b"\x58" + varint(child_ordering)
    if sibling_order_rank is not None:
        out += b"\x60" + varint(sibling_order_rank & 0xFFFFFFFFFFFFFFFF)
    if description is not None:
        out += _field_bytes(b"\x72", description.encode())
    if merge_key is not None:
        out += b"\x78" + varint(MERGE_BY_KEY)
        out += _field_bytes(b"\x82\x01", merge_key.encode())
    if process_ordering is not None:
        out += b"\x98\x01" + varint(process_ordering)
    return bytes(out)


def header(first_ns: int, origin: int = 0) -> bytes:
    """The clock snapshot and the root.

    Timestamps in the file count ns from ``origin`` (a wall-clock ns shortly
    before the first event): 5-6 byte varints instead of 9. The snapshot maps
    that clock (BOOTTIME, the trace's default) to REALTIME, so the UI and
    :mod:`commtag.merge.readback` show and give wall-clock time.
    """
    first = max(first_ns, origin)
    clock = b"".join(
        _field_bytes(b"\x0a", b"\x08" + varint(cid) + b"\x10" + varint(value))
        for cid, value in ((BUILTIN_CLOCK_BOOTTIME, first - origin), (BUILTIN_CLOCK_REALTIME, first))
    )
    seq = b"\x50" + varint(HEADER_SEQ)
    snapshot = b"\x40" + varint(first - origin) + seq + _field_bytes(b"\x32", clock)
    root = seq + _field_bytes(
        b"\xe2\x03", track_descriptor(ROOT_UUID, process_ordering=PROCESS_ORDERING_EXPLICIT)
    )
    return _frame(snapshot) + _frame(root)


class SequenceWriter:
    """Packets of one sequence: interning tables, flags, slice/instant/counter events."""

    def __init__(self, seq_id: int, origin: int = 0) -> None:
        self.out = bytearray()
        self._seq = b"\x50" + varint(seq_id)
        self._origin = origin
        #: Varints of timestamps' bits above the low 28, by value (see _ts_encoder).
        self._ts_highs: dict[int, bytes] = {}
        self._ts = _ts_encoder(origin, self._ts_highs)
        #: What follows the timestamp in every event packet once the sequence has started.
        self._seq_started = self._seq + b"\x68\x02\x5a"
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
        self._pending = bytearray()
        self._started = False

    # -- packets ---------------------------------------------------------
    def descriptor(self, desc: bytes) -> None:
        """A TrackDescriptor packet; the first packet also clears the sequence's state."""
        body = self._seq + self._flags_first() + _field_bytes(b"\xe2\x03", desc)
        self.out += _frame(body)

    def _flags_first(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return b"\x68" + varint(SEQ_CLEARED_AND_NEEDS)

    def _event(self, ts: int, event: bytes, out: bytearray) -> None:
        n = len(event)
        size = _V[n] if n < 0x4000 else _v(n)
        if self._started and not self._pending:
            # The common case, as few copies of the event's bytes as possible.
            head = b"\x40" + self._ts(ts) + self._seq_started + size
            out += b"\x0a" + _v(len(head) + n) + head
            out += event
            return
        body = b"\x40" + self._ts(ts) + self._seq
        if self._pending:
            body += b"\x62" + _v(len(self._pending)) + self._pending
            self._pending.clear()
        if self._started:
            body += b"\x68\x02\x5a" + size + event
        else:
            body += self._flags_first() + b"\x5a" + size + event
        out += b"\x0a"
        out += _v(len(body))
        out += body

    def body(self, name: str, cat: Optional[str], args: Optional[dict]) -> bytes:
        """A TrackEvent's name, category and debug annotations, to be written later by
        :func:`_emit_rows` (slices) or :meth:`instant` (interned strings go out with the next packet written)."""
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
        return b"\xf9\x02" + le, b"\x81\x03" + le

    def shared_annotations(self, args: dict) -> bytes:
        """:meth:`annotations` of a dict that many events carry (a call site's common args),
        encoded once per sequence. The dict must not change; it is held, so its id stays its own."""
        found = self._shared.get(id(args))
        if found is None:
            found = self._shared[id(args)] = (self.annotations(args), args)
        return found[0]

    def instant(self, ts: int, track: bytes, body: bytes, out: Optional[bytearray] = None) -> None:
        self._event(ts, b"\x48\x03" + track + body, self.out if out is None else out)

    def end_tail(self, track: bytes) -> bytes:
        """Everything after the timestamp of an END on ``track`` (no interning, no flags)."""
        return self._seq + b"\x5a" + _v(len(track) + 2) + b"\x48\x02" + track

    def end(self, ts: int, tail: bytes, out: Optional[bytearray] = None) -> None:
        ts_b = self._ts(ts)
        (self.out if out is None else out).extend(b"\x0a" + _V[len(ts_b) + len(tail) + 1] + b"\x40" + ts_b + tail)

    def counter(self, ts: int, track: bytes, value: float) -> None:
        ev = b"\x48\x04" + track + b"\xe1\x02" + struct.pack("<d", value)
        body = b"\x40" + self._ts(ts) + self._seq + b"\x5a" + _v(len(ev)) + ev
        self.out += _frame(body)

    # -- interning -------------------------------------------------------
    def _intern(self, table: dict, field: bytes, text: str) -> int:
        """The next iid of ``table`` (the caller stores it), added to the next packet's InternedData."""
        iid = len(table) + 1
        self._pending += _field_bytes(field, b"\x08" + _v(iid) + _field_bytes(b"\x12", text.encode()))
        return iid

    def _name(self, name: str) -> bytes:
        part = self._names.get(name)
        if part is None:
            part = self._names[name] = b"\x50" + _v(self._intern(self._names, b"\x12", name))
        return part

    def _cat(self, cat: str) -> bytes:
        part = self._cats.get(cat)
        if part is None:
            part = self._cats[cat] = b"\x18" + _v(self._intern(self._cats, b"\x0a", cat))
        return part

    def _key(self, key: str) -> int:
        iid = self._keys.get(key)
        if iid is None:
            iid = self._keys[key] = self._intern(self._keys, b"\x1a", key)
        return iid

    def _string(self, text: str) -> bytes:
        iid = self._strings.get(text)
        if iid is None:
            iid = self._strings[text] = self._intern(self._strings, b"\xea\x01", text)
        return b"\x88\x01" + _v(iid)

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
                    val = _V[value]
                elif value < 0x10000000:
                    val = _L[value & 0x3FFF] + _V[value >> 14]
                else:
                    val = varint(value)
                parts.append(heads[len(val)] + val)
                continue
            if cls is float:
                head = float_keys.get(key)
                if head is None:
                    kb = b"\x08" + _v(self._key(key))
                    head = float_keys[key] = b"\x22" + _v(len(kb) + 9) + kb + b"\x29"
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
        head = b"\x08" + _v(self._key(key)) + b"\x20"
        return tuple(b"\x22" + _v(len(head) + n) + head for n in range(10))

    def _annotation(self, key: str, value: object) -> bytes:
        body = b"\x08" + _v(self._key(key))
        cls = value.__class__
        if cls is bool:
            body += b"\x10\x01" if value else b"\x10\x00"
        elif cls is int:
            if 0 <= value < _INT63:
                body += b"\x20" + varint(value)
            elif -_INT63 <= value < 0:
                body += b"\x20" + varint(value + (1 << 64))
            else:
                body += self._string(str(value))
        elif cls is float:
            body += b"\x29" + struct.pack("<d", value)
        elif cls is str:
            body += self._string(value) if len(value) <= _MAX_INTERNED else _field_bytes(b"\x32", value.encode())
        elif value is None:
            body += self._string("null")
        else:
            text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
            body += self._string(text) if len(text) <= _MAX_INTERNED else _field_bytes(b"\x32", text.encode())
        return b"\x22" + _v(len(body)) + body


class _LocalIds:
    """Per-rank track uuids in creation order."""

    def __init__(self, rank: int, first: int, limit: int) -> None:
        self.rank = rank
        self.next = first
        self.limit = limit

    def __call__(self) -> int:
        if self.next >= self.limit:
            raise ValueError(f"rank {self.rank} needs more tracks than its block has ids for")
        uuid = track_uuid(self.rank, self.next)
        self.next += 1
        return uuid


def _emit_rows(stream: BinaryIO, seq: SequenceWriter, slices: Row, parent: int, name: str, order: int,
               merge_key: str, ids: _LocalIds, instants: Optional[Row] = None,
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
    # BEGIN and END packets (SequenceWriter._event and .end), inlined for the common case (a started sequence with no
    # interned data waiting): this loop runs twice per slice of the whole merge. So is the timestamp's varint
    # (seq._ts) where its high bits are cached: 28 low bits by table and the cached rest.
    ts_bytes, after_ts = seq._ts, seq._seq_started
    origin, highs, low, mask = seq._origin, seq._ts_highs, _L, _M
    for i in order_:
        start, stop = starts[i], ends[i]
        k = 0
        for stack in stacks:
            while stack and stack[-1] <= start:
                n = stack.pop() - origin
                tail = highs.get(n >> 28) if n >= 0x10000000 else None
                ts_b = low[n & mask] + low[(n >> 14) & mask] + tail if tail is not None else ts_bytes(n + origin)
                body += b"\x0a" + _V[len(ts_b) + len(tails[k]) + 1] + b"\x40" + ts_b + tails[k]
            if not stack or stop <= stack[-1]:
                break
            k += 1
        else:
            uuid = ids()
            uuids.append(uuid)
            track = b"\x58" + varint(uuid)
            tracks.append(track)
            tails.append(seq.end_tail(track))
            stacks.append([])
        stacks[k].append(stop)
        more = extra.get(i)
        event = b"\x48\x01" + tracks[k] + data[offsets[i]:offsets[i + 1]]
        if more:
            event += more
        if seq._pending or not seq._started:
            seq._event(start, event, body)
            continue
        n = start - origin
        tail = highs.get(n >> 28) if n >= 0x10000000 else None
        ts_b = low[n & mask] + low[(n >> 14) & mask] + tail if tail is not None else ts_bytes(start)
        n = len(event)
        head = b"\x40" + ts_b + after_ts + (_V[n] if n < 0x4000 else varint(n))
        size = len(head) + n
        body += b"\x0a" + (_V[size] if size < 0x4000 else varint(size)) + head
        body += event
    for k, stack in enumerate(stacks):
        while stack:
            seq.end(stack.pop(), tails[k], body)
    if not tracks:  # a row with only instants, or an empty lane: still one track
        uuid = ids()
        uuids.append(uuid)
        tracks.append(b"\x58" + varint(uuid))
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
    """The sequence rank blocks are written on, one per merge worker, named after the first rank
    it writes; its :meth:`SequenceWriter.body` encodes each rank's events while they are read
    (see commtag.merge.convert). One sequence for all of a worker's ranks: their interning
    tables and encoded-args caches carry over from rank to rank, as ranks mostly repeat each
    other's names and args."""
    return SequenceWriter(RANK_SEQ_BASE + 2 * first_rank, origin)


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
    ids = _LocalIds(rank, 2, LANE_LOCAL)
    groups: dict[str, int] = {}
    for track in sorted(timeline.tracks, key=lambda t: (t.group, t.order, t.name)):
        parent = groups.get(track.group)
        if parent is None:
            parent = groups[track.group] = ids()
            seq.descriptor(track_descriptor(parent, track.group, parent=proc,
                                            child_ordering=CHILD_ORDERING_EXPLICIT))
        key = f"r{rank}:{track.group}:{track.name}"
        _emit_rows(stream, seq, track.slices, parent, track.name, track.order, key, ids, track.instants,
                   track.summary)
    stream.write(seq.out)
    seq.out.clear()


# -- the lanes block ------------------------------------------------------

class LanesWriter:
    """Lanes, cross-rank flows, counters and markers of a merge worker's ranks, written after them.

    ``first_rank``: the first rank of the worker's chunk, which names its sequence.
    """

    def __init__(self, origin: int = 0, first_rank: int = 0) -> None:
        self.seq = SequenceWriter(RANK_SEQ_BASE + 2 * first_rank + 1, origin)
        self._ids: dict[int, _LocalIds] = {}
        self._groups: dict[int, int] = {}
        self._cross = 0

    def _rank_ids(self, rank: int) -> _LocalIds:
        ids = self._ids.get(rank)
        if ids is None:
            ids = self._ids[rank] = _LocalIds(rank, LANE_LOCAL, 1 << LOCAL_BITS)
        return ids

    def _lane_group(self, rank: int) -> int:
        uuid = self._groups.get(rank)
        if uuid is None:
            uuid = self._groups[rank] = self._rank_ids(rank)()
            self.seq.descriptor(track_descriptor(uuid, LANE_GROUP, parent=process_uuid(rank),
                                                 child_ordering=CHILD_ORDERING_EXPLICIT))
        return uuid

    def write(self, stream: BinaryIO, lanes: dict[int, list[tuple[str, int]]],
              instances: Sequence[CollectiveInstance], counters: Sequence[CounterSeries] = (),
              markers: Sequence[Marker] = (), lane_kernels: Optional[dict[tuple[int, str], dict]] = None,
              ranks: Optional[Collection[int]] = None) -> None:
        """Write the lanes with their slices and flows, then counters and markers, of ``ranks``
        (default: every rank).

        ``lanes`` maps a rank to its ``(lane_name, order)`` rows, the order
        being the lane's position in the one global lane order, so a group's
        lane sits at the same place on every member rank. ``instances``:
        every rank's, as the cross-rank flows are numbered over all of them
        (so workers writing different ranks agree on them); each goes to the
        lane named by its ``lane_name``. ``lane_kernels``: (rank, lane name)
        -> annotations of the lane's kernel categories, an instant at its first slice.
        """
        flows = self._cross_rank_flows(instances)
        wanted = None if ranks is None else set(ranks)
        by_lane: dict[tuple[int, str], list[CollectiveInstance]] = {}
        for inst in instances:
            if wanted is None or inst.rank in wanted:
                by_lane.setdefault((inst.rank, inst.lane_name), []).append(inst)
        for rank in sorted(lanes if wanted is None else wanted.intersection(lanes)):
            parent = self._lane_group(rank)
            for lane_name, order in lanes[rank]:
                # Encoded one lane at a time: all lanes' slices at once grew with the rank count.
                slices = self._slices(by_lane.pop((rank, lane_name), ()), flows)
                kernels = (lane_kernels or {}).get((rank, lane_name))
                summary = (f"commtag kernels: {kernels[ANN_DESCRIBE]}", kernels) if kernels else None
                _emit_rows(stream, self.seq, slices, parent, lane_name, order,
                           f"r{rank}:lane:{lane_name}", self._rank_ids(rank), summary=summary)
        if by_lane:
            raise ValueError(f"instances on undeclared lanes: {sorted(by_lane)[:5]}")
        for series in counters:
            if wanted is None or series.rank in wanted:
                self._counter(series)
        self._markers([m for m in markers if wanted is None or m.rank in wanted])
        stream.write(self.seq.out)
        self.seq.out.clear()

    def _slices(self, instances: Sequence[CollectiveInstance], flows: dict[int, tuple]) -> Row:
        """One lane's slices, encoded, with their cross-rank and source flows (the common
        args of a call site's steps and replays are encoded once)."""
        seq = self.seq
        row = Row()
        for inst in instances:
            fout, fin = flows.get(id(inst), (None, None))
            if inst.source_flow is not None:
                fin = (fin or ()) + (inst.source_flow,)
            data = seq.body(inst.collective, "collective", None)
            common, own = inst.common_args, inst.args
            if own.keys().isdisjoint(common):  # then all_args() encodes as common, then own
                data += seq.shared_annotations(common) + seq.annotations(own)
            else:
                data += seq.annotations(inst.all_args())
            row.add(inst.start_ns, inst.end_ns, data + seq.flows(fout, fin) if fout or fin else data)
        return row

    def _cross_rank_flows(self, instances: Sequence[CollectiveInstance]) -> dict[int, tuple]:
        """Flows linking the members of each matched instance.

        Members are what :func:`~commtag.merge.records.match_groups` (the
        analysis's rule too) calls one collective. The earlier starting slice
        of a pair starts the flow (ties: lower rank, which this block writes
        first): trace_processor drops a terminating id it has not seen start.
        """
        flows: dict[int, tuple[list, list]] = {}
        for members in match_groups(instances):
            if len(members) < 2 or len({m.rank for m in members}) != len(members):
                continue
            members.sort(key=lambda m: (m.start_ns, m.rank))
            pairs = (
                [(i, j) for i in range(len(members)) for j in range(i + 1, len(members))]
                if len(members) <= FULL_MESH_MAX
                else [(0, j) for j in range(1, len(members))]
            )
            for i, j in pairs:
                self._cross += 1
                fid = flow_id(FLOW_CROSS_RANK, 0, self._cross)
                flows.setdefault(id(members[i]), ([], []))[0].append(fid)
                flows.setdefault(id(members[j]), ([], []))[1].append(fid)
        return {key: (tuple(a) or None, tuple(b) or None) for key, (a, b) in flows.items()}

    def _counter(self, series: CounterSeries) -> None:
        uuid = self._rank_ids(series.rank)()
        self.seq.descriptor(track_descriptor(uuid, series.track, parent=self._lane_group(series.rank),
                                             sibling_order_rank=1 << 20, counter_unit=series.unit))
        track = b"\x58" + varint(uuid)
        for ts, value in sorted(series.points):
            self.seq.counter(ts, track, float(value))

    def _markers(self, markers: Sequence[Marker]) -> None:
        tracks: dict[int, bytes] = {}
        for marker in sorted(markers, key=lambda m: (m.rank, m.ts_ns)):
            track = tracks.get(marker.rank)
            if track is None:
                uuid = self._rank_ids(marker.rank)()
                self.seq.descriptor(track_descriptor(uuid, "commtag markers", parent=self._lane_group(marker.rank),
                                                     sibling_order_rank=(1 << 20) + 1))
                track = tracks[marker.rank] = b"\x58" + varint(uuid)
            self.seq.instant(marker.ts_ns, track, self.seq.body(marker.name, "commtag", marker.args))


__all__ = [
    "CPU_GROUP", "LANE_GROUP", "FULL_MESH_MAX", "LanesWriter", "SequenceWriter", "Track",
    "flow_id", "header", "process_uuid", "rank_sequence", "synthetic_pid", "track_descriptor",
    "varint", "write_rank",
]
