"""Read a merged .pftrace back into plain objects, for the merge tests.

Parses with Perfetto's own protos (trace_processor is not available offline)
and resolves interned names per sequence, slice BEGIN/END pairs per track,
debug annotations and flows, the way trace_processor would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


@dataclass
class Slice:
    track: int
    ts: int
    end: int
    name: str
    args: dict[str, object]
    flows_out: list[int] = field(default_factory=list)
    flows_in: list[int] = field(default_factory=list)


@dataclass
class Parsed:
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


def _value(a: pb.DebugAnnotation, strings: dict[int, str]) -> object:
    kind = a.WhichOneof("value")
    if kind == "string_value_iid":
        return strings[a.string_value_iid]
    return getattr(a, kind) if kind else None


def read(path: Path) -> Parsed:
    trace = pb.Trace.FromString(Path(path).read_bytes())
    tables: dict[int, tuple[dict, dict, dict]] = {}
    tracks: dict[int, pb.TrackDescriptor] = {}
    events: list[tuple[int, int, pb.TrackEvent, int]] = []
    for idx, p in enumerate(trace.packet):
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & 1:
            tables[seq] = ({}, {}, {})
        if p.HasField("interned_data"):
            names, keys, strings = tables[seq]
            names.update((e.iid, e.name) for e in p.interned_data.event_names)
            keys.update((e.iid, e.name) for e in p.interned_data.debug_annotation_names)
            strings.update((e.iid, e.str.decode()) for e in p.interned_data.debug_annotation_string_values)
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("track_event"):
            events.append((p.timestamp, idx, p.track_event, seq))
    events.sort(key=lambda e: (e[0], e[1]))
    stacks: dict[int, list[Slice]] = {}
    slices = []
    for ts, _, ev, seq in events:
        names, keys, strings = tables.get(seq, ({}, {}, {}))
        if ev.type == pb.TrackEvent.TYPE_SLICE_END:
            stacks[ev.track_uuid].pop().end = ts
            continue
        if ev.type not in (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_INSTANT):
            continue
        args = {(keys[a.name_iid] if a.HasField("name_iid") else a.name): _value(a, strings) for a in ev.debug_annotations}
        name = names[ev.name_iid] if ev.HasField("name_iid") else ev.name
        s = Slice(ev.track_uuid, ts, ts, name, args, list(ev.flow_ids), list(ev.terminating_flow_ids))
        slices.append(s)
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks.setdefault(ev.track_uuid, []).append(s)
    return Parsed(tracks, slices, len(trace.packet))
