"""The validator catches each planted import-rule violation, and passes a clean trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.merge.pftrace.readback import read_trace
from commtag.merge.pftrace.validate import TraceReadError, validate_file

B, E = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END


def _trace(tweak=None) -> pb.Trace:
    """Process 10 with child track 11, names a/b interned, slice a [0,20) holding b [5,10)."""
    t = pb.Trace()
    p = t.packet.add(trusted_packet_sequence_id=1, sequence_flags=3)
    p.track_descriptor.uuid = 10
    p.track_descriptor.process.pid = 100
    p = t.packet.add(trusted_packet_sequence_id=1)
    p.track_descriptor.uuid = 11
    p.track_descriptor.parent_uuid = 10
    p.track_descriptor.name = "row"
    p = t.packet.add(trusted_packet_sequence_id=1, sequence_flags=2, timestamp=0)
    p.interned_data.event_names.add(iid=1, name="a")
    p.interned_data.event_names.add(iid=2, name="b")
    p.track_event.type, p.track_event.track_uuid, p.track_event.name_iid = B, 11, 1
    for ts, kind, name in ((5, B, 2), (10, E, None), (20, E, None)):
        p = t.packet.add(trusted_packet_sequence_id=1, sequence_flags=2, timestamp=ts)
        p.track_event.type, p.track_event.track_uuid = kind, 11
        if name:
            p.track_event.name_iid = name
    if tweak:
        tweak(t)
    return t


def _codes(tmp_path: Path, trace: pb.Trace) -> list[str]:
    path = tmp_path / "t.pftrace"
    path.write_bytes(trace.SerializeToString())
    return [v.code for v in validate_file(path)]


def test_clean_trace_passes(tmp_path: Path) -> None:
    assert _codes(tmp_path, _trace()) == []


def _crossing(t: pb.Trace) -> None:
    # a [0,10) and b [5,15) on one track, written with named ENDs the way a naive writer would
    t.packet[4].timestamp, t.packet[5].timestamp = 10, 15
    t.packet[4].track_event.name_iid = 1
    t.packet[5].track_event.name_iid = 2


def _duplicate_uuid(t: pb.Trace) -> None:
    p = t.packet.add(trusted_packet_sequence_id=1)
    p.track_descriptor.uuid = 11
    p.track_descriptor.parent_uuid = 10
    p.track_descriptor.name = "another row"


def _no_flags(t: pb.Trace) -> None:
    t.packet[0].ClearField("sequence_flags")
    for p in t.packet:
        p.ClearField("sequence_flags")


def _undefined_iid(t: pb.Trace) -> None:
    t.packet[3].track_event.name_iid = 99


def _flow_ends_first(t: pb.Trace) -> None:
    t.packet[2].track_event.terminating_flow_ids.append(7)  # a, at 0
    t.packet[3].track_event.flow_ids.append(7)  # b, at 5


@pytest.mark.parametrize("tweak, code", [
    (_crossing, "crossing-slices"),
    (_duplicate_uuid, "duplicate-uuid"),
    (_no_flags, "missing-sequence-flags"),
    (_undefined_iid, "undefined-iid"),
    (_flow_ends_first, "flow-terminated-before-start"),
])
def test_planted_violation_is_caught(tmp_path: Path, tweak, code: str) -> None:
    assert code in _codes(tmp_path, _trace(tweak))


def test_more_rules(tmp_path: Path) -> None:
    def orphan(t):
        t.packet[1].track_descriptor.parent_uuid = 12345

    def same_pid(t):
        p = t.packet.add(trusted_packet_sequence_id=1)
        p.track_descriptor.uuid = 20
        p.track_descriptor.process.pid = 100

    def unclosed(t):
        del t.packet[-1]

    def no_seq(t):
        t.packet[3].ClearField("trusted_packet_sequence_id")

    assert "missing-parent" in _codes(tmp_path, _trace(orphan))
    assert "duplicate-pid" in _codes(tmp_path, _trace(same_pid))
    assert "unclosed-slice" in _codes(tmp_path, _trace(unclosed))
    assert "no-sequence-id" in _codes(tmp_path, _trace(no_seq))


@pytest.mark.slow
def test_cli_lists_violations_and_exits_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pftrace"
    bad.write_bytes(_trace(_undefined_iid).SerializeToString())
    proc = subprocess.run([sys.executable, "-m", "commtag", "validate", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1 and "undefined-iid" in proc.stdout and "iid 99" in proc.stdout
    good = tmp_path / "good.pftrace"
    good.write_bytes(_trace().SerializeToString())
    ok = subprocess.run([sys.executable, "-m", "commtag", "validate", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "OK" in ok.stdout
    junk = tmp_path / "junk.pftrace"
    junk.write_bytes(b"\x12\x05hello")
    with pytest.raises(TraceReadError):
        validate_file(junk)
    assert subprocess.run([sys.executable, "-m", "commtag", "validate", str(junk)]).returncode == 2


def _on_default_track(t: pb.Trace) -> None:
    """The slices name no track: the packet that opens them makes 11 the sequence's default."""
    t.packet[2].trace_packet_defaults.track_event_defaults.track_uuid = 11
    for p in t.packet[2:]:
        p.track_event.ClearField("track_uuid")


def test_events_without_a_track_are_on_their_sequences_default_track(tmp_path: Path) -> None:
    assert _codes(tmp_path, _trace(_on_default_track)) == []
    path = tmp_path / "t.pftrace"
    parsed = read_trace(path)
    assert [(s.track, s.name, s.ts, s.end, s.depth) for s in parsed.slices] == [(11, "a", 0, 20, 0), (11, "b", 5, 10, 1)]

    def cleared_before_the_ends(t: pb.Trace) -> None:
        _on_default_track(t)
        t.packet[4].sequence_flags = 3  # a clear forgets the defaults: the ENDs have no track

    assert _codes(tmp_path, _trace(cleared_before_the_ends)).count("no-track") == 2

    def replaced(t: pb.Trace) -> None:
        _on_default_track(t)
        t.packet[3].trace_packet_defaults.track_event_defaults.track_uuid = 12  # b and the ENDs go to 12

    assert "unknown-track" in _codes(tmp_path, _trace(replaced))


def test_timestamps_on_a_sequences_incremental_clock_are_steps(tmp_path: Path) -> None:
    """The same slices with each timestamp the step from the previous one on an incremental clock
    of the sequence's own, declared by a first packet (the ENDs written last: 10 back from 20)."""
    def on_steps(t: pb.Trace) -> None:
        first = pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=3)
        first.trace_packet_defaults.timestamp_clock_id = 64
        first.clock_snapshot.clocks.add(clock_id=64, timestamp=100, is_incremental=True)
        first.clock_snapshot.clocks.add(clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=100)
        t.packet[0].ClearField("sequence_flags")
        packets = [first, *t.packet[:4], t.packet[5], t.packet[4]]  # a [0,20): b begins at 5, a ends, b ends
        for p, step in zip(packets[3:], (-100, 5, 15, -10)):
            p.timestamp = step & (2**64 - 1)
        del t.packet[:]
        t.packet.extend(packets)

    assert _codes(tmp_path, _trace(on_steps)) == []
    parsed = read_trace(tmp_path / "t.pftrace")
    assert [(s.track, s.name, s.ts, s.end, s.depth) for s in parsed.slices] == [(11, "a", 0, 20, 0), (11, "b", 5, 10, 1)]
