"""What a merged .pftrace holds, counted as trace_processor imports it: slices, counter samples,
flows and args (debug annotations).

trace_processor's import time grows with these (perfetto#1323: 48 M counter samples took
246 s), so the benchmarks report them; one streaming pass, nothing kept but the counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.merge.inputs.jsonstream import open_decompressed
from commtag.merge.pftrace.wire import iter_frames


@dataclass(slots=True)
class TraceCounts:
    """Counts of one merged trace."""

    packets: int = 0
    slices: int = 0
    instants: int = 0
    counter_samples: int = 0
    #: Distinct flow ids (one arrow each, however many events carry it).
    flows: int = 0
    #: Debug annotations on every event: what trace_processor's args table holds of them.
    args: int = 0
    #: Counter track name -> its samples.
    counter_tracks: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict[str, object]:
        return {
            "packets": self.packets, "slices": self.slices, "instants": self.instants,
            "counter_samples": self.counter_samples, "counter_tracks": len(self.counter_tracks),
            "max_samples_per_counter_track": max(self.counter_tracks.values(), default=0),
            "flows": self.flows, "args": self.args,
        }


def count(path: Path) -> TraceCounts:
    """One pass over ``path`` (gzipped or not)."""
    out = TraceCounts()
    names: dict[int, str] = {}
    per_track: Counter = Counter()
    flows: set[int] = set()
    packet = pb.TracePacket()
    with open_decompressed(Path(path)) as stream:
        for data in iter_frames(stream):
            packet.Clear()
            packet.ParseFromString(data)
            out.packets += 1
            if packet.HasField("track_descriptor"):
                names[packet.track_descriptor.uuid] = packet.track_descriptor.name
            if not packet.HasField("track_event"):
                continue
            event = packet.track_event
            if event.type == pb.TrackEvent.TYPE_COUNTER:
                out.counter_samples += 1
                per_track[event.track_uuid] += 1
            elif event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                out.slices += 1
            elif event.type == pb.TrackEvent.TYPE_INSTANT:
                out.instants += 1
            out.args += len(event.debug_annotations)
            flows.update(event.flow_ids)
            flows.update(event.terminating_flow_ids)
    out.flows = len(flows)
    out.counter_tracks = Counter({names.get(uuid, str(uuid)): n for uuid, n in per_track.items()})
    return out


def main(argv: list[str]) -> int:
    """``python -m commtag.merge.pftrace.tracecounts MERGED.pftrace ...``: one JSON line of counts per file."""
    import orjson

    for path in argv:
        print(orjson.dumps({"path": path, **count(Path(path)).to_dict()}).decode())
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
