"""The merged trace's writer: a header, then each rank's process, groups and rows.

Usage (what :mod:`commtag.merge.engine.pipeline` does, one worker writing ranks 0 and 1)::

    with open("merged.pftrace", "wb") as out:
        out.write(header(first_ns, origin))
        sequences = rank_sequences(2, origin)  # each encodes its ranks' events while they are read
        for timeline in (rank0, rank1):       # RankTimeline, from commtag.merge.rank.convert
            write_rank(out, timeline, sequences(timeline.rank))
        LanesWriter(origin, 2).write(out, lanes, instances, counters, markers)  # commtag.merge.pftrace.lanes

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
those trace_processor applies at import (see docs/perfetto.md), and ``commtag validate`` checks them.

Layout of the file: a header (ClockSnapshot, root descriptor ordering the
processes), then one block per rank in rank order, then the lanes of each
rank in rank order (process-group lanes, cross-rank flows, the analysis's
counters and markers). Rank blocks and lanes go on packet sequences of
blocks of consecutive ranks that merge workers take whole, so the file is
the same bytes whichever worker wrote which block (worker 0 puts the
workers' rank blocks first, then their lanes: :mod:`commtag.merge.engine.output`).
Ids come from :mod:`commtag.merge.ids`.
"""

from __future__ import annotations

from typing import BinaryIO, Optional

from commtag.merge.ids import LANE_LOCAL, LocalIds, process_uuid, rank_sequence_id, sequence_block, synthetic_pid
from commtag.merge.pftrace.packets import track_descriptor
from commtag.merge.pftrace.packets import header as header  # the writer's API: a trace starts with it
from commtag.merge.timeline import RankTimeline, Row
from commtag.merge.pftrace.wire import (
    LOW14,
    MASK14,
    PACKET_TIMESTAMP,
    SMALL_VARINTS,
    TRACE_PACKET,
    varint,
)
from commtag.merge.pftrace.sequence import BEGIN, SequenceBlocks, SequenceWriter, track_field

#: An event packet's frame tag, its size (below 128) and the timestamp's tag: the bytes before its timestamp.
PACKET_HEADS = [TRACE_PACKET + SMALL_VARINTS[size] + PACKET_TIMESTAMP for size in range(0x80)]


def emit_rows(stream: BinaryIO, seq: SequenceWriter, slices: Row, parent: int, name: str, order: int,
              merge_key: str, ids: LocalIds, instants: Optional[Row] = None,
              summary: Optional[tuple[str, dict]] = None) -> None:
    """Write the slices of one source row on as few backing tracks as proper nesting allows.

    Each backing track gets the slices that nest properly on it; a slice that
    would cross one goes to the next. All backing tracks share parent, name
    and sibling_merge_key, so the UI shows them as one row with the
    overlapping slices stacked, and no timestamp changes. The first backing track is the
    sequence's default track while the row is written (:meth:`SequenceWriter.default_track`):
    its events name no track. ``summary`` (name,
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
    # per slice of the whole merge. So is the timestamp (SequenceWriter.timestamp) where it steps forward by
    # less than 2**28 ns: its varint by table, ``last`` held here and handed back to ``seq`` around the
    # calls that write a timestamp themselves. Packets are appended field by field: no temporary bytes per packet.
    stamp, after_ts = seq.timestamp, seq.after_timestamp
    last, low, mask, small = seq.last, LOW14, MASK14, SMALL_VARINTS
    packet_tag, ts_tag = TRACE_PACKET, PACKET_TIMESTAMP
    fixed = len(ts_tag) + len(after_ts)
    heads, after_lengths = PACKET_HEADS, seq.after_lengths
    view = memoryview(data)
    for i in order_:
        start, stop = starts[i], ends[i]
        k = 0
        for stack in stacks:
            while stack and stack[-1] <= start:
                stop_k = stack.pop()
                n = stop_k - last
                if 0 <= n < 0x10000000:  # then stop_k >= last >= the origin
                    ts_b = small[n] if n < 0x4000 else low[n & mask] + small[n >> 14]
                else:
                    seq.last = last
                    ts_b = stamp(stop_k)
                last = stop_k
                body += end_heads[k][len(ts_b)]
                body += ts_b
                body += tails[k]
            if not stack or stop <= stack[-1]:
                break
            k += 1
        else:
            uuid = ids()
            uuids.append(uuid)
            track = track_field(uuid) if tracks else seq.default_track(uuid)  # the first: the row's default
            tracks.append(track)
            tails.append(seq.end_tail(track))
            end_heads.append(tuple(packet_tag + varint(len(ts_tag) + size + len(tails[-1])) + ts_tag
                                   for size in range(11)))
            begins.append(BEGIN + track)
            stacks.append([])
        stacks[k].append(stop)
        event = begins[k] + view[offsets[i]:offsets[i + 1]]  # a view's slice: no copy before the event's
        if extra:
            more = extra.get(i)
            if more:
                event += more
        if not seq.plain:
            seq.last = last
            seq.event(start, event, body)
            last = seq.last
            continue
        n = start - last
        if 0 <= n < 0x10000000:
            ts_b = small[n] if n < 0x4000 else low[n & mask] + small[n >> 14]
        else:
            seq.last = last
            ts_b = stamp(start)
        last = start
        n = len(event)
        if n < 0x80:  # the packet's head and the bytes from its timestamp to its event, by table
            size = fixed + len(ts_b) + 1 + n
            body += heads[size] if size < 0x80 else packet_tag + small[size] + ts_tag
            body += ts_b
            body += after_lengths[n]
        else:
            length = small[n] if n < 0x4000 else varint(n)
            size = fixed + len(ts_b) + len(length) + n
            body += packet_tag
            body += small[size] if size < 0x4000 else varint(size)
            body += ts_tag
            body += ts_b
            body += after_ts
            body += length
        body += event
    seq.last = last
    view.release()
    for k, stack in enumerate(stacks):
        while stack:
            seq.end(stack.pop(), tails[k], body)
    if not tracks:  # a row with only instants, or an empty lane: still one track
        uuid = ids()
        uuids.append(uuid)
        tracks.append(seq.default_track(uuid) if instants is not None and len(instants) else track_field(uuid))
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


def rank_sequence(rank: int, origin: int = 0) -> SequenceWriter:
    """A sequence for rank blocks started at ``rank``; its :meth:`SequenceWriter.body` encodes a
    rank's events while they are read (see commtag.merge.rank.convert)."""
    return SequenceWriter(rank_sequence_id(rank), origin)


def rank_sequences(ranks: int, origin: int = 0) -> SequenceBlocks:
    """The sequence each rank's block goes on in a merge of ``ranks`` ranks: one per block of
    consecutive ranks (:func:`commtag.merge.ids.sequence_block`), whose interning tables and
    encoded-args caches carry over from rank to rank, as ranks mostly repeat each other's names and args."""
    return SequenceBlocks(sequence_block(ranks), rank_sequence_id, origin)


def write_rank(stream: BinaryIO, timeline: RankTimeline, seq: Optional[SequenceWriter] = None) -> None:
    """Write one rank's process, groups and rows (slices already encoded by ``seq``, which may go
    on to the next rank of its block)."""
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
