"""The writer keeps every slice exactly, overlapping ones included, and its output validates."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from commtag.merge import ids
from commtag.merge.pftrace import wire, writer
from commtag.merge.timeline import RankTimeline, Row, Track
from commtag.merge.pftrace.validate import validate_file
from pftrace_reader import read

T0 = 1_700_000_000_000_000_000

intervals = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(intervals)
def test_any_overlap_is_kept_on_backing_tracks(tmp_path_factory, spans) -> None:
    seq = writer.rank_sequence(3)
    row = Row()
    for i, (a, d) in enumerate(spans):
        row.add(T0 + a * 10, T0 + (a + d) * 10, seq.body(f"s{i}", "cat", {"i": i}))
    timeline = RankTimeline(rank=3, process_name="rank 3", tracks=[Track("stream 7", "GPU 0", 0, row)])
    buf = io.BytesIO()
    buf.write(writer.header(T0))
    writer.write_rank(buf, timeline, seq)
    path = Path(tmp_path_factory.mktemp("w")) / "t.pftrace"
    path.write_bytes(buf.getvalue())
    assert validate_file(path) == []
    parsed = read(path)
    got = sorted((s.ts, s.end, s.name, s.args["i"]) for s in parsed.slices)
    assert got == sorted((T0 + a * 10, T0 + (a + d) * 10, f"s{i}", i) for i, (a, d) in enumerate(spans))
    rows = {parsed.tracks[s.track].name for s in parsed.slices}
    assert rows == {"stream 7"}
    keys = {parsed.tracks[s.track].sibling_merge_key for s in parsed.slices}
    assert len(keys) == 1


def test_varint_matches_protobuf() -> None:
    for n in (0, 1, 127, 128, 16383, 16384, 2**21, 2**28 - 1, 2**28, 2**42 + 5, 2**56 + 3, T0, 2**64 - 1):
        out = bytearray()
        while True:
            b = n & 0x7F
            n >>= 7
            out.append(b | (0x80 if n else 0))
            if not n:
                break
        value = sum((b & 0x7F) << (7 * i) for i, b in enumerate(out))
        assert wire.varint(value) == bytes(out)


def test_a_long_repeated_value_is_written_once(tmp_path: Path) -> None:
    # A 1024-rank group's rank list (~6 KB) repeats on every slice of its lane: the file
    # must hold it once and every slice must still read it back whole.
    ranks = f"[{', '.join(map(str, range(1024)))}]"
    seq = writer.rank_sequence(0)
    row = Row()
    for i in range(50):
        row.add(T0 + i * 10, T0 + i * 10 + 5, seq.body("allreduce", "collective", {"Process Group Ranks": ranks, "Seq": i}))
    buf = io.BytesIO()
    buf.write(writer.header(T0))
    writer.write_rank(buf, RankTimeline(rank=0, process_name="rank 0", tracks=[Track("lane", "Comm lanes", 0, row)]), seq)
    path = tmp_path / "t.pftrace"
    path.write_bytes(buf.getvalue())
    assert buf.getvalue().count(ranks.encode()) == 1
    assert validate_file(path) == []
    parsed = read(path)
    assert sorted((s.args["Seq"], s.args["Process Group Ranks"]) for s in parsed.slices) == [(i, ranks) for i in range(50)]


def test_track_uuids_are_unique_and_short() -> None:
    ranks = [*range(130), 1000, (1 << 24) - 1]
    locals_ = [*range(130), ids.LANE_LOCAL, ids.LANE_LOCAL + 1, (1 << ids.LOCAL_BITS) - 1]
    uuids = {ids.track_uuid(r, n) for r in ranks for n in locals_}
    assert len(uuids) == len(ranks) * len(locals_) and 0 not in uuids
    # every event packet names its track: the common ones must stay 2-byte varints
    assert max(len(wire.varint(ids.track_uuid(r, n))) for r in range(127) for n in range(127)) == 2


def test_link_only_args_are_left_to_flows_and_the_rest_is_written(tmp_path: Path) -> None:
    import orjson

    from commtag.vocab import LINK_ARGS
    from merging import merge

    links = {key: 7 for key in LINK_ARGS}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0,
         "args": {**links, "Input Dims": [[2, 2]], "Sequence number": 3}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "s": "t", "pid": 1, "tid": 1, "ts": 12.0,
         "args": {**links, "Bytes": -512}},
    ]
    src = tmp_path / "rank0.trace.json"
    src.write_bytes(orjson.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}))
    merge([src], tmp_path / "out.pftrace")
    written = {s.name: s.args for s in read(tmp_path / "out.pftrace").slices if s.name in ("aten::mm", "[memory]")}
    assert written == {"aten::mm": {"Input Dims": "[[2,2]]", "Sequence number": 3}, "[memory]": {"Bytes": -512}}
