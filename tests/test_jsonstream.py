"""The streaming reader gives exactly what parsing the whole file gives, whatever the file's layout.

The merge reads every trace through commtag.merge.inputs.jsonstream; a wrong cut
would drop, split or duplicate events silently. Small batch and read sizes
force thousands of cuts (and cuts that land inside strings and nested values).
"""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import orjson
import pytest

from commtag.merge.inputs import jsonstream
from commtag.merge.inputs.jsonstream import TraceFormatError, TraceStream
from merging import merge
from commtag.testing import PUBLIC_TRACES as PUBLIC
from pftrace_reader import read

FILES = sorted(p for p in PUBLIC.rglob("*") if p.name.endswith((".json", ".json.gz")))


def _whole(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _streamed(path: Path) -> tuple[dict, list]:
    stream = TraceStream(path)
    events = [e for batch in stream.batches() for e in batch]
    return stream.header, events


@pytest.fixture
def tiny_windows(monkeypatch):
    """Batches of ~2 KB read 3 KB at a time: every trace is cut thousands of times."""
    monkeypatch.setattr(jsonstream, "BATCH_BYTES", 2048)
    monkeypatch.setattr(jsonstream, "READ_BYTES", 3000)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_public_traces_stream_exactly(path: Path, tiny_windows) -> None:
    whole = _whole(path)
    header, events = _streamed(path)
    assert events == whole["traceEvents"]
    assert header == {k: v for k, v in whole.items() if k != "traceEvents"}


def _write(tmp_path: Path, text: bytes) -> Path:
    path = tmp_path / "rank0.step1.pt.trace.json.gz"
    path.write_bytes(gzip.compress(text))
    return path


def _awkward_trace(base: int) -> bytes:
    """Cut marks inside strings and nested values, keys after the events, indented like Kineto."""
    events = []
    for i in range(400):
        events.append({
            "ph": "X", "cat": "cpu_op", "name": "op}, {\"ph\": \"X\"" if i % 7 == 0 else f"op{i}",
            "pid": 1, "tid": 1, "ts": 10.0 + i, "dur": 0.5,
            "args": {"nested": [{"a": i}, {"b": [{"c": "}, {"}]}], "Input Dims": [[1, 2], [3]]},
        })
    body = orjson.dumps({"schemaVersion": 1, "traceEvents": events}, option=orjson.OPT_INDENT_2)
    # The base time and distributedInfo after the events, as some exporters write them.
    tail = orjson.dumps({"baseTimeNanoseconds": base, "distributedInfo": {"rank": 0, "world_size": 1}})
    return body[:-2].rstrip() + b",\n" + tail[1:]


def test_cuts_in_strings_nested_values_and_keys_after_the_events(tmp_path: Path, tiny_windows) -> None:
    path = _write(tmp_path, _awkward_trace(1_700_000_000_000_000_000))
    header, events = _streamed(path)
    whole = _whole(path)
    assert events == whole["traceEvents"] and len(events) == 400
    assert header["baseTimeNanoseconds"] == 1_700_000_000_000_000_000


def test_a_base_time_after_the_events_still_gives_absolute_times(tmp_path: Path, tiny_windows) -> None:
    base = 1_700_000_000_000_000_000
    path = _write(tmp_path, _awkward_trace(base))
    out = tmp_path / "merged.pftrace"
    merge([path], out)
    parsed = read(out)
    ops = [s for s in parsed.slices if s.name.startswith("op")]
    assert len(ops) == 400
    assert sorted(s.ts for s in ops) == [base + (10_000 + i * 1000) for i in range(400)]


@pytest.mark.parametrize("damage, words", [
    (lambda t: t[: len(t) * 2 // 3], "not valid JSON"),
    (lambda t: t.replace(b'"dur": 0.5', b'"dur": NaN', 1), "not valid JSON"),
    (lambda t: t.replace(b'"traceEvents"', b'"otherEvents"', 1), "no traceEvents list"),
    (lambda t: t + b" trailing", "not valid JSON"),
])
def test_broken_text_is_refused_with_a_reason(tmp_path: Path, tiny_windows, damage, words) -> None:
    path = _write(tmp_path, damage(_awkward_trace(1)))
    with pytest.raises(TraceFormatError, match=words):
        _streamed(path)


def _gapped_trace(gap: bytes, name: str = "op") -> bytes:
    """A small pretty-printed trace whose second and third events are ``gap`` apart."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"{name}{i}", "pid": 1, "tid": 1, "ts": 10.0 + i, "dur": 0.5,
               "args": {"External id": i}} for i in range(6)]
    text = [orjson.dumps(e, option=orjson.OPT_INDENT_2) for e in events]
    body = b",\n".join(text[:2]) + b",\n" + gap + b",\n".join(text[2:])
    return b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + body + b'\n  ],\n' + gap + b'  "baseTimeNanoseconds": 5\n}\n'


def _peak_bytes(path: Path) -> tuple[int, list]:
    tracemalloc.start()
    try:
        _, events = _streamed(path)
        return tracemalloc.get_traced_memory()[1], events
    finally:
        tracemalloc.stop()


#: 32 MB of indentation: held whole, the reader's window alone would pass 32 MB.
_BIG_GAP = 32 << 20


@pytest.mark.parametrize("gap", [
    (b" " * 1023 + b"\n") * (_BIG_GAP // 1024),  # a pretty-printer's blank lines
    b" " * _BIG_GAP,  # spaces alone: squeezed only outside strings
], ids=["blank lines", "spaces"])
def test_a_long_whitespace_run_between_events_is_read_in_bounded_memory(tmp_path: Path, gap: bytes) -> None:
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(gzip.compress(_gapped_trace(gap), compresslevel=1))
    peak, events = _peak_bytes(path)
    assert [e["name"] for e in events] == [f"op{i}" for i in range(6)]
    # a few read windows (1 MB each), not the whole gap copied at each read
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MB for a {_BIG_GAP >> 20} MB gap"


def test_spaces_inside_a_string_are_kept_while_gaps_around_it_are_squeezed(tmp_path: Path, monkeypatch) -> None:
    """A run of spaces inside a string is data; line breaks and spaces between tokens are not.
    Reads shorter than a squeezed run make every run span several reads."""
    monkeypatch.setattr(jsonstream, "READ_BYTES", 50_000)
    inside = '"quoted" \\' + " " * 200_000  # escapes, then more spaces than any run the reader squeezes
    gap = b"\n" + b" " * 150_000 + b"\n"
    path = _write(tmp_path, _gapped_trace(gap, name=f"op{inside}").replace(b'"pid"', gap + b'"pid"'))
    header, events = _streamed(path)
    assert events == _whole(path)["traceEvents"]
    assert [e["name"] for e in events] == [f"op{inside}{i}" for i in range(6)]
    assert header == {"schemaVersion": 1, "baseTimeNanoseconds": 5}


def test_gzip_is_inflated_by_isa_l_when_it_is_installed(tmp_path: Path) -> None:
    """The merge's largest cost after parsing is inflating the traces: ISA-L does it ~3x faster
    than zlib (docs/benchmarks.md, "Where the time goes"), giving the same events."""
    igzip = pytest.importorskip("isal.igzip")
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(gzip.compress(_awkward_trace(1)))
    with jsonstream.open_decompressed(path) as stream:
        assert isinstance(stream, igzip.IGzipFile)
    assert _streamed(path)[1] == _whole(path)["traceEvents"]


def test_a_corrupt_deflate_block_is_refused_with_a_reason(tmp_path: Path) -> None:
    """A damaged compressed block (not a cut file) is one clear error, whichever inflater reads it."""
    packed = bytearray(gzip.compress(_awkward_trace(1), compresslevel=9))
    packed[12] ^= 0xFF  # the first block's header, just after gzip's 10-byte one: no valid block
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(TraceFormatError, match="corrupt gzip"):
        _streamed(path)
