"""Read a merged .pftrace back: its collective lane slices, or the whole timeline.

So that ``commtag summary merged.pftrace`` needs only the file users share: the
lane slices carry the eager keys and the ``"commtag ..."`` keys (among them
``"commtag rank"``, written by :func:`commtag.merge.analysis.hook.annotate`), which
is all the analysis needs to rebuild its :class:`CollectiveInstance` records.
:func:`read_instances` reads the file frame by frame, so memory stays bounded
by one packet plus the lane slices, not the whole trace.

:func:`read_trace` resolves everything the UI would show (tracks, nested
slices, instants, flows) the way trace_processor imports it; trace_processor is
not available offline, so the tests and the README's timeline picture
(``launch/render_timeline.py``) read merged files through it.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

import orjson
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.errors import CommtagError
from commtag.kernels import Breakdown, KernelTables
from commtag.identity import UNATTRIBUTED_UID
from commtag.merge.inputs.jsonstream import GZIP_ERRORS, GZIP_MAGIC, open_decompressed
from commtag.merge.ids import PID_BASE, process_uuid
from commtag.merge.records import (
    ALIGNMENT_MARKER,
    ALL_TIME,
    WINDOW_MARKER,
    WORLD_MARKER,
    CollectiveInstance,
    Coverage,
    ranks_of,
)
from commtag.merge.pftrace.defaults import SequenceDefaults
from commtag.merge.pftrace.wire import TRACE_PACKET, FrameError, iter_frames
from commtag.merge.steps import StepSpan, decode
from commtag.vocab import (
    ANN_ALIGNMENT, ANN_KERNELS_ID, ANN_KERNELS_SCOPE, ANN_MARKER, ANN_PG_UID, ANN_RANK, ANN_REPLAY, ANN_SOURCE,
    ANN_WINDOW_NS, ANN_WINDOW_RANK, ANN_WINDOW_SELECTION, ANN_WINDOW_STEPS, ANN_WORLD_SIZE, COLLECTIVE_NAME_KEY, SEQ_KEY,
)

_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
_END = pb.TrackEvent.TYPE_SLICE_END
_INSTANT = pb.TrackEvent.TYPE_INSTANT
_CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_BOOTTIME = 6
_REALTIME = 1


def _wall_clock_shift(packet: pb.TracePacket) -> Optional[int]:
    """REALTIME minus BOOTTIME from a packet's clock snapshot (the caller checks it has one):
    what turns the file's timestamps (which count from an origin, see
    commtag.merge.pftrace.writer.header) into wall-clock ns."""
    clocks = {c.clock_id: c.timestamp for c in packet.clock_snapshot.clocks}
    if _BOOTTIME in clocks and _REALTIME in clocks:
        return clocks[_REALTIME] - clocks[_BOOTTIME]
    return None


class ReadbackError(CommtagError, ValueError):
    """The file is not a Perfetto trace commtag can read lane slices from."""


_JSON_OBJECT = re.compile(rb'\s*\{\s*["}]')
#: What :func:`sniff` calls a file, by its first bytes (decompressed when gzipped).
EMPTY, JSON, PFTRACE, UNKNOWN = "empty", "JSON", "pftrace", "unknown"


def sniff(path: Path) -> tuple[str, bool]:
    """What the file holds, and whether it is gzipped: ``(EMPTY|JSON|PFTRACE|UNKNOWN, gzipped)``.

    A Perfetto trace starts with its first packet's frame (tag 0x0a); a
    profiler trace is a JSON object (``{`` and a key, after any whitespace). The Perfetto UI opens gzipped traces, so
    a gzipped .pftrace is one too. Raises OSError when the file cannot be read.
    """
    with open(path, "rb") as stream:
        head = stream.read(4096)
    gzipped = head[:2] == GZIP_MAGIC
    if gzipped:
        try:
            head = zlib.decompressobj(wbits=47).decompress(head, 64)
        except zlib.error:
            return UNKNOWN, True
    if not head:
        return EMPTY, gzipped
    # JSON first: a newline is also the byte of a packet's frame tag.
    if _JSON_OBJECT.match(head):
        return JSON, gzipped
    if head[:1] == TRACE_PACKET:
        return PFTRACE, gzipped
    return UNKNOWN, gzipped


def read_instances(path: Path) -> list[CollectiveInstance]:
    """Every collective lane slice of a merged trace, as analysis records."""
    return read_merged(path)[0]


def read_merged(path: Path) -> tuple[list[CollectiveInstance], KernelTables, Coverage]:
    """The collective lane slices, the kernel-category breakdowns and the coverage of a merged trace.

    The breakdowns are the annotations the merge wrote on graph launch slices
    and on the instants that open each GPU stream and lane row
    (:meth:`commtag.kernels.Breakdown.annotations`); one pass reads both. The
    ranks are those with a process as the merge describes one (its uuid and
    pid derived from the rank): what tells a merge without collectives from
    a trace commtag did not write. Their windows, the ProfilerSteps in them and
    the world size come from the window instants the analysis wrote (a rank
    without them is taken as profiled all the time). A gzipped trace is read as well.
    """
    try:
        with open_decompressed(path) as stream:
            return _read_merged(stream, path)
    except GZIP_ERRORS as exc:
        raise ReadbackError(f"{path}: corrupt gzip stream ({exc})") from None


def _read_merged(stream: BinaryIO, path: Path) -> tuple[list[CollectiveInstance], KernelTables, Coverage]:
    kernels: KernelTables = {}
    ranks: set[int] = set()
    windows: dict[int, list[tuple[int, int]]] = {}
    steps: dict[int, list[StepSpan]] = {}
    world_size: Optional[int] = None
    alignment: Optional[dict] = None
    selection = ""
    names: dict[int, dict[int, str]] = {}
    keys: dict[int, dict[int, str]] = {}
    strings: dict[int, dict[int, str]] = {}
    open_slices: dict[int, list[Optional[tuple[int, dict[str, object]]]]] = {}
    out: list[CollectiveInstance] = []
    wall = 0
    defaults = SequenceDefaults()
    for packet in _packets(stream, path):
        ts = defaults.see(packet)
        kind = packet.WhichOneof("data")  # one call for what three HasField asked
        shift = _wall_clock_shift(packet) if kind == "clock_snapshot" else None
        if shift is not None:
            wall = shift
        if kind == "track_descriptor" and packet.track_descriptor.HasField("process"):
            rank = packet.track_descriptor.process.pid - PID_BASE
            if rank >= 0 and packet.track_descriptor.uuid == process_uuid(rank):
                ranks.add(rank)
        seq = packet.trusted_packet_sequence_id
        if packet.sequence_flags & _CLEARED or seq not in names:
            names[seq], keys[seq], strings[seq] = {}, {}, {}
        if packet.HasField("interned_data"):
            interned = packet.interned_data
            names[seq].update((e.iid, e.name) for e in interned.event_names)
            keys[seq].update((e.iid, e.name) for e in interned.debug_annotation_names)
            strings[seq].update((e.iid, e.str.decode("utf-8", "replace")) for e in interned.debug_annotation_string_values)
        if kind != "track_event":
            continue
        event = packet.track_event
        stack = open_slices.setdefault(defaults.track(packet) or 0, [])
        if event.type == _BEGIN:
            args = _annotations(event.debug_annotations, keys[seq], strings[seq])
            stack.append((ts + wall, args) if ANN_PG_UID in args else None)
            if ANN_KERNELS_SCOPE in args:
                _kernel_breakdown(kernels, args)
        elif event.type == _END and stack:
            begun = stack.pop()
            if begun is not None:
                instance = _instance(begun[0], ts + wall, begun[1])
                if instance is not None:
                    out.append(instance)
        elif event.type == _INSTANT and event.debug_annotations:
            args = _annotations(event.debug_annotations, keys[seq], strings[seq])
            if ANN_KERNELS_SCOPE in args:
                _kernel_breakdown(kernels, args)
            if args.get(ANN_MARKER) == WINDOW_MARKER:
                rank, length = args.get(ANN_WINDOW_RANK), args.get(ANN_WINDOW_NS)
                if isinstance(rank, int) and isinstance(length, int):
                    start = ts + wall
                    windows.setdefault(rank, []).append((start, start + length))
                    steps.setdefault(rank, []).extend(decode(args.get(ANN_WINDOW_STEPS), start) or ())
                    world_size = world_size or _int_or_none(args.get(ANN_WORLD_SIZE))
                    selection = selection or str(args.get(ANN_WINDOW_SELECTION) or "")
            elif args.get(ANN_MARKER) == WORLD_MARKER:
                world_size = world_size or _int_or_none(args.get(ANN_WORLD_SIZE))
            elif args.get(ANN_MARKER) == ALIGNMENT_MARKER:
                alignment = _alignment(args.get(ANN_ALIGNMENT)) or alignment
    # A file with window instants has them for every rank whose trace showed its collectives; one
    # written before they existed says nothing of when its ranks were profiled.
    unknown = [] if windows else [ALL_TIME]
    for rank in ranks | {i.rank for i in out}:
        windows.setdefault(rank, list(unknown))
    for instance in out:  # an NCCL kernel without metadata: the merge took its group as the world
        if world_size and instance.pg_uid.startswith(UNATTRIBUTED_UID + ":"):
            instance.group_size = world_size
    hosts = {r: str(c["clock"]) for c in alignment["clocks"] for r in c["ranks"]} \
        if alignment is not None and alignment.get("unit") == "host" else {}
    return out, kernels, Coverage({r: sorted(w) for r, w in windows.items()}, world_size,
                                  {r: sorted(s, key=lambda step: (step[1], step[0])) for r, s in steps.items() if s},
                                  hosts=hosts, alignment=alignment, selection=selection)


def _alignment(text: object) -> Optional[dict]:
    """The alignment entry a merged trace carries (commtag.merge.analysis.align.alignment_entry); None
    where it is not one (a trace from before it, or damaged: then the summary says nothing of its clocks)."""
    try:
        entry = orjson.loads(text) if isinstance(text, str) else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("clocks"), list):
        return None
    if not all(isinstance(c, dict) and isinstance(c.get("ranks"), list) for c in entry["clocks"]):
        return None
    return entry


def _int_or_none(value: object) -> Optional[int]:
    return value if isinstance(value, int) and value > 0 else None


def _kernel_breakdown(tables: KernelTables, args: dict[str, object]) -> None:
    """File one annotated breakdown under its scope, rank and id (malformed ones are skipped)."""
    rank, ident = args.get(ANN_RANK), args.get(ANN_KERNELS_ID)
    if isinstance(rank, int) and ident is not None:
        tables.setdefault(str(args[ANN_KERNELS_SCOPE]), {})[(rank, ident)] = Breakdown.from_annotations(args)


@dataclass
class Slice:
    """One slice (or instant, ``ts == end``) with its resolved name, args and flow ids."""

    track: int
    ts: int
    end: int
    name: str
    args: dict[str, object]
    flows_out: list[int] = field(default_factory=list)
    flows_in: list[int] = field(default_factory=list)
    depth: int = 0  # nesting level on its track, the row the UI draws it on
    instant: bool = False  # an instant event (a zero-length slice has ``ts == end`` too)


@dataclass
class ParsedTrace:
    """Track descriptors by uuid, and every slice in timestamp order."""

    tracks: dict[int, pb.TrackDescriptor]
    slices: list[Slice]
    packets: int

    def name_path(self, uuid: int) -> list[str]:
        """Track names from the process down to ``uuid``."""
        names = []
        while uuid in self.tracks:
            desc = self.tracks[uuid]
            names.append(desc.process.process_name if desc.HasField("process") else desc.name)
            if not desc.HasField("parent_uuid"):
                break
            uuid = desc.parent_uuid
        return names[::-1]

    def process_of(self, uuid: int) -> Optional[pb.TrackDescriptor]:
        """The process descriptor ``uuid`` sits under, if any."""
        while uuid in self.tracks:
            desc = self.tracks[uuid]
            if desc.HasField("process"):
                return desc
            if not desc.HasField("parent_uuid"):
                return None
            uuid = desc.parent_uuid
        return None

    def processes(self) -> list[pb.TrackDescriptor]:
        return [d for d in self.tracks.values() if d.HasField("process")]


def read_trace(path: Path) -> ParsedTrace:
    """Every track and slice of a trace, strictly: a dangling interned id or END is a ReadbackError.

    Interned names are resolved per sequence, BEGIN/END are paired per track in
    timestamp order (ties in file order, as trace_processor sorts them). An
    event naming one debug annotation twice is an error too (the UI would show both).
    """
    tables: dict[int, tuple[dict[int, str], dict[int, str], dict[int, str]]] = {}
    tracks: dict[int, pb.TrackDescriptor] = {}
    events: list[tuple[int, int, pb.TrackEvent, int, int]] = []
    packets = 0
    wall = 0
    defaults = SequenceDefaults()
    with open_decompressed(path) as stream:
        for packets, packet in enumerate(_packets(stream, path), 1):
            ts = defaults.see(packet)
            shift = _wall_clock_shift(packet) if packet.HasField("clock_snapshot") else None
            if shift is not None:
                wall = shift
            seq = packet.trusted_packet_sequence_id
            if packet.sequence_flags & _CLEARED:
                tables[seq] = ({}, {}, {})
            if packet.HasField("interned_data"):
                if seq not in tables:
                    raise ReadbackError(f"{path}: packet {packets} interns data before its sequence was cleared")
                names, keys, strings = tables[seq]
                interned = packet.interned_data
                names.update((e.iid, e.name) for e in interned.event_names)
                keys.update((e.iid, e.name) for e in interned.debug_annotation_names)
                strings.update((e.iid, e.str.decode("utf-8", "replace")) for e in interned.debug_annotation_string_values)
            if packet.HasField("track_descriptor"):
                tracks[packet.track_descriptor.uuid] = packet.track_descriptor
            if packet.HasField("track_event"):
                events.append((ts + wall, packets, packet.track_event, seq, defaults.track(packet) or 0))
    events.sort(key=lambda e: (e[0], e[1]))
    stacks: dict[int, list[Slice]] = {}
    slices: list[Slice] = []
    for ts, index, event, seq, track in events:
        names, keys, strings = tables.get(seq, ({}, {}, {}))
        stack = stacks.setdefault(track, [])
        if event.type == _END:
            if not stack:
                raise ReadbackError(f"{path}: packet {index} ends a slice on track {track} that never began")
            stack.pop().end = ts
            continue
        if event.type not in (_BEGIN, pb.TrackEvent.TYPE_INSTANT):
            continue
        try:
            name = names[event.name_iid] if event.HasField("name_iid") else event.name
            args = {(keys[a.name_iid] if a.HasField("name_iid") else a.name): _strict_value(a, strings)
                    for a in event.debug_annotations}
        except KeyError as exc:
            raise ReadbackError(f"{path}: packet {index} uses interned id {exc} its sequence never defined") from None
        if len(args) != len(event.debug_annotations):
            raise ReadbackError(f"{path}: packet {index} names a debug annotation twice")
        item = Slice(track, ts, ts, name, args, list(event.flow_ids), list(event.terminating_flow_ids),
                     depth=len(stack), instant=event.type != _BEGIN)
        slices.append(item)
        if event.type == _BEGIN:
            stack.append(item)
    return ParsedTrace(tracks, slices, packets)


def _strict_value(item: pb.DebugAnnotation, strings: dict[int, str]) -> object:
    kind = item.WhichOneof("value")
    if kind == "string_value_iid":
        return strings[item.string_value_iid]
    return getattr(item, kind) if kind else None


def _packets(stream: BinaryIO, path: Path) -> Iterator[pb.TracePacket]:
    """The TracePackets of a serialized Trace, one frame at a time."""
    try:
        for data in iter_frames(stream):
            packet = pb.TracePacket()
            try:
                packet.ParseFromString(data)
            except Exception as exc:  # protobuf's DecodeError and friends
                raise ReadbackError(f"{path}: corrupt packet ({exc})") from exc
            yield packet
    except FrameError as exc:
        raise ReadbackError(f"{path}: {exc}") from None


def _annotations(items, keys: dict[int, str], strings: dict[int, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        name = item.name or keys.get(item.name_iid, "")
        if name:
            out[name] = _value(item, strings)
    return out


def _value(item, strings: dict[int, str]) -> object:
    kind = item.WhichOneof("value")
    if kind == "string_value_iid":
        return strings.get(item.string_value_iid, "")
    if kind is None:
        return None
    return getattr(item, kind)


def _instance(start_ns: int, end_ns: int, args: dict[str, object]) -> Optional[CollectiveInstance]:
    """A record from one lane slice's annotations; None when keys the analysis needs are absent."""
    try:
        replay = args.get(ANN_REPLAY)
        replay = None if replay in (None, "null") else replay
        if COLLECTIVE_NAME_KEY not in args:
            return None
        return CollectiveInstance.from_args(
            args, rank=int(args[ANN_RANK]), seq=int(args[SEQ_KEY]),  # type: ignore[call-overload]
            replay=int(replay) if replay is not None else None,  # type: ignore[call-overload]
            group_ranks=ranks_of(args), start_ns=start_ns, end_ns=end_ns,
            source=str(args.get(ANN_SOURCE, "trace")), own=args)
    except (KeyError, TypeError, ValueError):
        return None
