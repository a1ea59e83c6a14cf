"""A strict checker of a .pftrace against trace_processor's import rules.

trace_processor rarely fails loudly: a packet without a sequence id, an
interned id defined too late, a track whose parent is missing or a flow that
ends before it starts are dropped or mis-attributed in silence. This module
reads a trace packet by packet with Perfetto's own protos and reports each
such case (rules: docs/perfetto.md).

What cannot be seen in a file: slice ENDs carry no name, so two crossing
slices on one track read back as two properly nested ones. Crossing is
reported when an END does carry a name (as naive writers emit) that is not
the innermost open slice's; commtag's writer avoids crossings by
construction (backing tracks, tested on its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.errors import CommtagError
from commtag.merge.inputs.jsonstream import GZIP_ERRORS, open_decompressed
from commtag.merge.pftrace.defaults import SequenceDefaults
from commtag.merge.pftrace.readback import EMPTY, JSON, sniff
from commtag.merge.pftrace.wire import FrameError, iter_frames

MAX_DEPTH = 512
_CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
_END = pb.TrackEvent.TYPE_SLICE_END
_MERGE_BY_KEY = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY
_MERGE_NONE = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE


class TraceReadError(CommtagError):
    """The file cannot be read as a Perfetto trace at all."""


@dataclass(frozen=True, slots=True)
class Violation:
    #: Index of the packet in the file (0-based), or -1 for whole-trace findings.
    packet: int
    code: str
    message: str

    def __str__(self) -> str:
        where = f"packet {self.packet}" if self.packet >= 0 else "trace"
        return f"{where}: {self.code}: {self.message}"


class _Checker:
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.seq_cleared: set[int] = set()
        self.tables: dict[int, dict[str, dict[int, str]]] = {}
        self.tracks: dict[int, bytes] = {}
        self.descs: dict[int, tuple[int, pb.TrackDescriptor]] = {}
        self.pids: dict[int, int] = {}
        self.slices: dict[int, list[tuple[int, int, int, Optional[str]]]] = {}
        self.flows: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
        self.events_on: list[tuple[int, int]] = []
        self.defaults = SequenceDefaults()
        #: The current packet's timestamp on the trace's clock.
        self.ts = 0

    def add(self, packet: int, code: str, message: str) -> None:
        self.violations.append(Violation(packet, code, message))

    def packet(self, idx: int, p: pb.TracePacket) -> None:
        has_seq = p.HasField("trusted_packet_sequence_id")
        seq = p.trusted_packet_sequence_id
        self.ts = self.defaults.see(p)
        if p.sequence_flags & _CLEARED or p.incremental_state_cleared:
            self.seq_cleared.add(seq)
            self.tables[seq] = {"names": {}, "cats": {}, "keys": {}, "strings": {}}
        if p.HasField("interned_data"):
            if seq not in self.seq_cleared:
                self.add(idx, "interned-before-clear",
                         f"sequence {seq} defines interned data before a packet with SEQ_INCREMENTAL_STATE_CLEARED")
            else:
                t = self.tables[seq]
                d = p.interned_data
                t["names"].update((e.iid, e.name) for e in d.event_names)
                t["cats"].update((e.iid, e.name) for e in d.event_categories)
                t["keys"].update((e.iid, e.name) for e in d.debug_annotation_names)
                t["strings"].update((e.iid, e.str.decode("utf-8", "replace")) for e in d.debug_annotation_string_values)
        if p.HasField("track_descriptor"):
            self.descriptor(idx, p.track_descriptor)
        if p.HasField("track_event"):
            self.event(idx, p, has_seq, seq)

    def descriptor(self, idx: int, d: pb.TrackDescriptor) -> None:
        blob = d.SerializeToString(deterministic=True)
        prior = self.tracks.get(d.uuid)
        if prior is not None:
            if prior != blob:
                self.add(idx, "duplicate-uuid", f"track uuid {d.uuid} described twice with different fields")
            return
        self.tracks[d.uuid] = blob
        self.descs[d.uuid] = (idx, d)
        if d.uuid == 0 and (d.HasField("process") or d.HasField("thread") or d.HasField("parent_uuid")):
            self.add(idx, "root-uuid", "uuid 0 is the trace-global root; it cannot be a process, thread or child")
        if d.HasField("process"):
            pid = d.process.pid
            if not d.process.HasField("pid") or pid == 0:
                self.add(idx, "bad-pid", f"process track {d.uuid} has no pid or pid 0")
            elif pid in self.pids:
                self.add(idx, "duplicate-pid",
                         f"pid {pid} is used by process tracks {self.pids[pid]} and {d.uuid} (read as pid reuse)")
            else:
                self.pids[pid] = d.uuid

    def _resolve(self, idx: int, seq: int, table: str, iid: int, what: str) -> Optional[str]:
        value = self.tables.get(seq, {}).get(table, {}).get(iid)
        if value is None:
            self.add(idx, "undefined-iid", f"{what} iid {iid} is not defined on sequence {seq} before its use")
        return value

    def event(self, idx: int, p: pb.TracePacket, has_seq: bool, seq: int) -> None:
        ev = p.track_event
        if not p.HasField("timestamp"):
            self.add(idx, "no-timestamp", "TrackEvent packet without timestamp (dropped)")
        if not has_seq or seq < 1:
            self.add(idx, "no-sequence-id", "TrackEvent packet without trusted_packet_sequence_id >= 1 (dropped)")
        interned = ev.HasField("name_iid") or bool(ev.category_iids) or any(
            a.HasField("name_iid") or a.HasField("string_value_iid") for a in ev.debug_annotations
        )
        if interned and seq not in self.seq_cleared:
            # Only a cleared sequence has interned data; SEQ_NEEDS_INCREMENTAL_STATE only makes
            # trace_processor skip the packet while the sequence's state is invalid (docs/perfetto.md).
            self.add(idx, "missing-sequence-flags",
                     f"uses interned ids but sequence {seq} never had SEQ_INCREMENTAL_STATE_CLEARED before it")
        name = ev.name if ev.HasField("name") else None
        if ev.HasField("name_iid"):
            name = self._resolve(idx, seq, "names", ev.name_iid, "event name")
        for cat in ev.category_iids:
            self._resolve(idx, seq, "cats", cat, "category")
        for a in ev.debug_annotations:
            if a.HasField("name_iid"):
                self._resolve(idx, seq, "keys", a.name_iid, "debug annotation name")
            if a.HasField("string_value_iid"):
                self._resolve(idx, seq, "strings", a.string_value_iid, "debug annotation string")
        track = self.defaults.track(p)
        if track is None:
            self.add(idx, "no-track", "TrackEvent without track_uuid and no default track on its sequence "
                                      "(lands on trace_processor's default track)")
            return
        self.events_on.append((idx, track))
        ts = self.ts
        if ev.type in (_BEGIN, _END):
            if ev.type == _END and (name is not None or ev.category_iids or ev.categories):
                self.add(idx, "named-end", "SLICE_END carries a name/category (an END closes the innermost slice)")
            self.slices.setdefault(track, []).append((ts, idx, ev.type, name))
        if ev.flow_ids or ev.terminating_flow_ids:
            self.flows.append((ts, idx, tuple(ev.flow_ids), tuple(ev.terminating_flow_ids)))

    def finish(self) -> None:
        for idx, uuid in self.events_on:
            if uuid not in self.tracks:
                self.add(idx, "unknown-track", f"event on track {uuid}, which no TrackDescriptor describes")
        siblings: dict[tuple[int, str], list[pb.TrackDescriptor]] = {}
        for uuid, (idx, d) in self.descs.items():
            if d.HasField("parent_uuid") and d.parent_uuid not in self.tracks:
                self.add(idx, "missing-parent", f"track {uuid}'s parent {d.parent_uuid} is not described (its events are lost)")
            if d.HasField("name") and not d.HasField("process") and not d.HasField("thread"):
                siblings.setdefault((d.parent_uuid, d.name), []).append(d)
        for (parent, name), group in siblings.items():
            if len(group) < 2 or all(d.sibling_merge_behavior == _MERGE_NONE for d in group):
                continue
            keys = {(d.sibling_merge_behavior, d.sibling_merge_key) for d in group}
            if len(keys) != 1 or next(iter(keys))[0] != _MERGE_BY_KEY:
                self.add(-1, "sibling-merge",
                         f"{len(group)} tracks named {name!r} under {parent} would be merged into one row "
                         "(use distinct names, SIBLING_MERGE_BEHAVIOR_NONE, or one sibling_merge_key)")
        self._nesting()
        self._flows()

    def _nesting(self) -> None:
        for uuid, events in self.slices.items():
            events.sort(key=lambda e: (e[0], e[1]))
            stack: list[tuple[int, Optional[str]]] = []
            for ts, idx, kind, name in events:
                if kind == _BEGIN:
                    stack.append((idx, name))
                    if len(stack) > MAX_DEPTH:
                        self.add(idx, "too-deep", f"track {uuid} nests deeper than {MAX_DEPTH}")
                elif not stack:
                    self.add(idx, "end-without-begin", f"SLICE_END at {ts} on track {uuid} with no open slice")
                else:
                    _, open_name = stack.pop()
                    if name is not None and open_name is not None and name != open_name:
                        self.add(idx, "crossing-slices",
                                 f"END of {name!r} at {ts} on track {uuid} closes {open_name!r}: the slices cross")
            for idx, name in stack:
                self.add(idx, "unclosed-slice", f"slice {name!r} on track {uuid} never ends (dur -1)")

    def _flows(self) -> None:
        self.flows.sort(key=lambda f: (f[0], f[1]))
        active: dict[int, int] = {}
        seen: dict[int, int] = {}
        later_starts = {fid for _, _, starts, _ in self.flows for fid in starts}
        for ts, idx, starts, ends in self.flows:
            for fid in ends:
                if fid in active:
                    del active[fid]
                    seen.pop(fid, None)
                elif fid in later_starts:
                    self.add(idx, "flow-terminated-before-start",
                             f"flow {fid} is terminated at {ts} before any slice starts it (dropped)")
                else:
                    self.add(idx, "flow-never-started", f"flow {fid} is terminated but never started (dropped)")
            for fid in starts:
                if fid in active:
                    seen[fid] = seen.get(fid, 0) + 1
                else:
                    active[fid] = idx
                    seen[fid] = 0
        for fid, idx in active.items():
            if not seen.get(fid):
                self.add(idx, "dangling-flow", f"flow {fid} starts but no other slice continues or ends it")


def validate_file(path: Path | str) -> list[Violation]:
    """Every import-rule violation in a .pftrace, gzipped or not (empty: it loads as written).

    Raises :class:`TraceReadError`, naming the file, on a file that is no Perfetto trace at all
    (empty, a JSON trace, not framed as one).
    """
    checker = _Checker()
    try:
        kind, gzipped = sniff(Path(path))
        if kind == EMPTY:
            raise TraceReadError(f"{path}: {'gzipped ' if gzipped else ''}empty file, not a .pftrace")
        if kind == JSON:
            raise TraceReadError(f"{path}: this is a {'gzipped ' if gzipped else ''}JSON file (a profiler trace?), not a "
                                 ".pftrace: `commtag merge` turns profiler traces into one")
        with open_decompressed(Path(path)) as stream:
            for idx, raw in enumerate(iter_frames(stream)):
                try:
                    packet = pb.TracePacket.FromString(raw)
                except DecodeError as exc:
                    raise TraceReadError(f"{path}: packet {idx} does not parse as a TracePacket ({exc})") from None
                checker.packet(idx, packet)
    except FrameError as exc:
        raise TraceReadError(f"{path}: {exc}") from None
    except GZIP_ERRORS as exc:
        raise TraceReadError(f"{path}: corrupt gzip stream ({exc})") from None
    except OSError as exc:
        raise TraceReadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    checker.finish()
    return checker.violations
