"""A hung job's Flight Recorder dumps drawn as a Perfetto trace: each rank a process, each of its
groups a lane of its calls, and a hang marker on the row of each rank that never entered a call.

A call is a slice from its start to its end; one still in flight is drawn up to its dump's time and
marked ``in flight``; one that ended at a time the dump does not say (torch's gloo dumps) is an
instant at its start, marked so. Nothing is drawn longer or shorter than the dumps say.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from commtag.atomic import write_atomic
from commtag.merge.hangs.diagnose import Diagnosis, call_name, entry_seq
from commtag.merge.errors import MergeInputError
from commtag.merge.hangs.beside import hang_marker, hang_time
from commtag.merge.hangs.dumps import FrDump, FrEntry
from commtag.merge.ids import HEADER_SEQ, ROOT_UUID
from commtag.merge.pftrace.packets import descriptor_packet, header, protos, track_descriptor
from commtag.merge.pftrace.wire import frame
from commtag.vocab import flight_recorder as fr

#: The one packet sequence of the drawn calls (the header has its own).
_SEQ = HEADER_SEQ + 1
#: Track uuids: a rank's process, and its lanes after it (one per group).
_TRACKS_PER_RANK = 1 << 16
#: Where a dump says no time of its own: its latest call's start.
IN_FLIGHT = f"{fr.FR_IN_FLIGHT} (drawn up to the dump's time)"
END_UNKNOWN = "ended, at a time the dump does not say"


def write_fr_trace(dumps: list[FrDump], diagnosis: Diagnosis, output: Path) -> int:
    """Write the trace (whole, or not at all); the number of calls drawn."""
    starts = [e.created_ns for d in dumps for e in d.entries if e.created_ns]
    origin = min(starts, default=0)
    packets = [header(origin, origin)]
    drawn = 0
    for dump in dumps:
        process = _uuid(dump.rank, 0)
        packets.append(descriptor_packet(_SEQ, track_descriptor(
            process, pid=_pid(dump.rank), process_name=f"rank {dump.rank}", parent=ROOT_UUID,
            sibling_order_rank=dump.rank)))
        #: (group, row) -> (track, the end of its last slice): calls that overlap (async) take rows of their own.
        rows: dict[tuple[str, int], list[int]] = {}
        dump_ns = dump.dump_ns or max((e.created_ns for e in dump.entries), default=origin)
        for entry in sorted(dump.entries, key=lambda e: (e.created_ns, e.record_id)):
            end = _end(entry, dump_ns)
            row = 0
            while (entry.group, row) in rows and rows[(entry.group, row)][1] > entry.created_ns:
                row += 1
            if (entry.group, row) not in rows:
                track = _uuid(dump.rank, len(rows) + 1)
                rows[(entry.group, row)] = [track, 0]
                label = f"group {entry.group}" + (f" ({entry.desc})" if entry.desc not in ("", "undefined") else "")
                packets.append(descriptor_packet(_SEQ, track_descriptor(
                    track, label + (f" [{row + 1}]" if row else ""), parent=process, sibling_order_rank=len(rows))))
            rows[(entry.group, row)][1] = end
            packets.extend(_slice(entry, rows[(entry.group, row)][0], origin, end))
            drawn += 1
    for hang in diagnosis.hangs:
        when = hang_time(dumps, hang) or origin
        name, args = hang_marker(hang)
        for rank in hang.missing:
            packets.append(_event("TYPE_INSTANT", max(when - origin, 0), _uuid(rank, 0), name, args))
    write_atomic(output, b"".join(packets))
    return drawn


def _uuid(rank: int, index: int) -> int:
    return ROOT_UUID + 1 + rank * _TRACKS_PER_RANK + index


def _pid(rank: int) -> int:
    return 100_000 + rank


def _end(entry: FrEntry, dump_ns: int) -> int:
    """Where a call's slice ends: its end; in flight, its dump's time; an end not said, its start."""
    if entry.ended_ns is not None:
        return max(entry.ended_ns, entry.created_ns)
    return entry.created_ns if entry.ended else max(dump_ns, entry.created_ns)


def _slice(entry: FrEntry, lane: int, origin: int, end: int) -> list[bytes]:
    name = f"{call_name(entry)} #{entry_seq(entry)}"
    args = {"state": entry.state, "seq": str(entry_seq(entry)), "profiling name": entry.name,
            "input sizes": str(entry.input_sizes), "dtypes": ",".join(map(str, entry.input_dtypes))}
    if entry.error:
        args["error"] = entry.error
    start = max(entry.created_ns - origin, 0)
    if entry.ended and entry.ended_ns is None:
        args["end"] = END_UNKNOWN
        return [_event("TYPE_INSTANT", start, lane, name, args)]
    if not entry.ended:
        args["end"] = IN_FLIGHT
    return [_event("TYPE_SLICE_BEGIN", start, lane, name, args),
            _event("TYPE_SLICE_END", max(end - origin, start), lane, None, {})]


def _event(kind: str, ts: int, track: int, name: str | None, args: dict[str, str]) -> bytes:
    pb = protos()
    event = pb.TrackEvent(type=getattr(pb.TrackEvent, kind), track_uuid=track, name=name,
                          debug_annotations=[pb.DebugAnnotation(name=k, string_value=v) for k, v in args.items()])
    return frame(pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=_SEQ, track_event=event).SerializeToString())


def dumps_without_traces(inputs: list[Path]) -> Optional[Path]:
    """The one input folder when it holds Flight Recorder dumps and no profiler trace (a hung job
    writes none): the merge then draws the dumps. None otherwise."""
    from commtag.merge.hangs.dumps import find_dumps
    from commtag.merge.inputs.load import discoverable

    if len(inputs) != 1 or not Path(inputs[0]).is_dir() or not find_dumps(Path(inputs[0])):
        return None
    for _, _, names in os.walk(inputs[0]):
        if any(discoverable(name) for name in names):
            return None
    return Path(inputs[0])


def dumps_beside_traces(inputs: list[Path]) -> list[FrDump]:
    """The Flight Recorder dumps directly in the input folders of a merge of profiler traces, read
    (DumpError: one that cannot be read); their entries join the profiled calls."""
    from commtag.merge.hangs.dumps import read_dumps

    return [dump for folder in inputs if Path(folder).is_dir() for dump in read_dumps(Path(folder))]


def merge_dumps(folder: Path, output: Optional[Path]) -> tuple[Path, int, Diagnosis]:
    """`commtag merge` of a folder of dumps alone: the trace written, the calls drawn, the diagnosis."""
    from commtag.merge.hangs.diagnose import diagnose
    from commtag.merge.hangs.dumps import read_dumps

    dumps = read_dumps(folder)
    diagnosis = diagnose(dumps)
    target = Path(output) if output is not None else folder / "merged.pftrace"
    try:
        drawn = write_fr_trace(dumps, diagnosis, target)
    except OSError as exc:
        raise MergeInputError(target, f"cannot write: {exc.strerror or exc}") from None
    return target, drawn, diagnosis
