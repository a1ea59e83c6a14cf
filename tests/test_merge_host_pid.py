"""A host process whose OS pid is a device's number (pid 1 in a container, GPU 1) stays a process.

Kineto writes a device's events with pid = the device index and tid = the stream,
and the host's with the OS pid and tids. In a container the training process is
often pid 1 (or 0 in some sandboxes), the very number of a GPU. The inputs here are
public traces (tests/data/public) with their host
pid rewritten to the device's number, the main thread's tid with it (Kineto's main
thread has tid = pid) and, for the second case, another host thread's tid set to a
stream id so that a thread and a stream share both numbers. The merged trace must
hold the very rows the unchanged trace merges into: threads under the rank's CPU
threads, streams under the GPU, the process named after the one GPU.
"""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import orjson
import pytest

from merging import merge
from pftrace_reader import read
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES

#: Rank 1 of 8 (DLRM on V100s): GPU 1 (pid 1, streams 7, 22, 24, 84); host pid 59812, threads 59812 and 59977.
DLRM_RANK1 = PUBLIC_TRACES / "param-dlrm-8rank" / "worker1_step_12.1694128201556.pt.trace.json.gz"
#: Rank 0 of 2 (A100, NCCL): GPU 0 (pid 0); host pid 2910249, threads 2910249 and 2919752.
A100_RANK0 = PUBLIC_TRACES / "eager-nccl-metadata" / "hta_a100_nccl_data.json.gz"


def _load(path: Path) -> dict:
    return orjson.loads(gzip.decompress(path.read_bytes()))


def _host_renumbered(trace: dict, tids: dict[int, int]) -> dict:
    """The trace as it would be with the host's ids ``tids`` (old -> new; the old pid is a key):
    host events are those on the process Kineto labels "CPU"; thread names follow their tid."""
    host = next(e["pid"] for e in trace["traceEvents"]
                if e.get("name") == "process_labels" and e["args"]["labels"] == "CPU")
    events = []
    for e in trace["traceEvents"]:
        if e.get("pid") == host:
            e = {**e, "pid": tids[host]}
            if e.get("tid") in tids:
                e["tid"] = tids[e["tid"]]
            if e.get("name") == "thread_name":
                old = next(old for old, new in tids.items() if new == e["tid"])
                e["args"] = {"name": e["args"]["name"].replace(f"thread {old} ", f"thread {e['tid']} ")}
        events.append(e)
    return {**trace, "traceEvents": events}


def _rows(out: Path) -> tuple[str, Counter]:
    """The merged rank's process name, and its slices per (group, row)."""
    parsed = read(out)
    rows = Counter(tuple(parsed.name_path(s.track)[1:]) for s in parsed.slices
                   if not s.instant and parsed.name_path(s.track)[0].startswith("rank "))
    names = {parsed.name_path(s.track)[0] for s in parsed.slices if parsed.name_path(s.track)[0].startswith("rank ")}
    assert len(names) == 1
    return names.pop(), rows


def _merged(tmp_path: Path, name: str, trace: dict) -> Path:
    src = tmp_path / name
    src.mkdir()
    (src / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
    out = tmp_path / f"{name}.pftrace"
    merge([src], out, progress=False)
    assert validate_file(out) == []
    return out


@pytest.mark.parametrize("source, tids, device", [
    (DLRM_RANK1, {59812: 1, 59977: 7}, "GPU 1"),  # the process is pid 1; a thread has tid 7, as stream 7
    (A100_RANK0, {2910249: 0, 2919752: 7}, "GPU 0"),  # the process is pid 0, as GPU 0
], ids=["pid1-gpu1", "pid0-gpu0"])
def test_a_host_process_numbered_as_its_gpu_keeps_its_threads(tmp_path: Path, source: Path, tids: dict,
                                                              device: str) -> None:
    original = _load(source)
    name, expected = _rows(_merged(tmp_path, "original", original))
    moved_name, rows = _rows(_merged(tmp_path, "moved", _host_renumbered(original, tids)))
    assert name.endswith(f" · {device}") and moved_name == name  # one GPU, not the process as a second one
    # The same rows, threads renamed as Kineto would name them: "thread 59812 (python3)" -> "thread 1 (python3)".
    renamed = Counter()
    for (group, *row), n in expected.items():
        if group == "CPU threads":
            for old, new in tids.items():
                row = [r.replace(f"thread {old} ", f"thread {new} ") for r in row]
        renamed[(group, *row)] += n
    assert rows == renamed
    cpu = {row[0] for (group, *row) in rows if group == "CPU threads"}
    streams = {row[0] for (group, *row) in rows if group == device}
    assert cpu and streams and all(r.startswith("thread ") for r in cpu) and all(r.startswith("stream ") for r in streams)
    assert not any(r.startswith("pid ") for r in cpu)  # the host process is the rank's, not a stray one


def test_device_events_of_a_category_not_known_stay_on_their_gpus_stream(tmp_path: Path) -> None:
    """A GPU's events of a category commtag does not know (a newer Kineto's) are on their stream
    still: the pid is labelled a GPU and not the host, and the row joins the kernels' of that stream."""
    original = _load(DLRM_RANK1)
    _, expected = _rows(_merged(tmp_path, "original", original))
    events, renamed = [], 0
    for e in original["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and e.get("tid") == 7 and renamed < 20:
            e, renamed = {**e, "cat": "a_newer_device_category"}, renamed + 1
        events.append(e)
    assert renamed == 20
    _, rows = _rows(_merged(tmp_path, "unknown", {**original, "traceEvents": events}))
    assert rows == expected and rows[("GPU 1", "stream 7")] > renamed
