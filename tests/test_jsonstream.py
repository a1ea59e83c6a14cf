"""The streaming reader gives exactly what parsing the whole file gives, whatever the file's layout.

The merge reads every trace through commtag.merge.jsonstream; a wrong cut
would drop, split or duplicate events silently. Small batch and read sizes
force thousands of cuts (and cuts that land inside strings and nested values).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from commtag.merge import jsonstream
from commtag.merge.jsonstream import TraceFormatError, TraceStream
from commtag.merge.pipeline import merge
from pftrace_reader import read

PUBLIC = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "public-traces"
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
    monkeypatch.setattr(jsonstream, "_BATCH", 2048)
    monkeypatch.setattr(jsonstream, "_READ", 3000)


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
