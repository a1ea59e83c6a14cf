"""Traces written by torch 1.8-1.10's Kineto (2021): string pids and tids, capitalised categories.

Two kinds of input: real traces of that era from pytorch/kineto (the public traces'
finders/, docs/found-traces.md says where each comes from), and the public 8-rank DLRM set
rewritten the way that Kineto wrote its events, which must merge into the very
trace the original does.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from merging import merge
from commtag.merge.pftrace.readback import read_trace
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES

TORCH19 = PUBLIC_TRACES / "finders" / "kineto_torch19_resnet50_worker0.pt.trace.json.gz"
METRICS = PUBLIC_TRACES / "finders" / "kineto_torch18_gpu_metrics_input.json"
DLRM = PUBLIC_TRACES / "param-dlrm-8rank"

#: Today's category -> the one 2021 Kineto wrote (libkineto output_json.cpp before its late-2021 refactor).
OLD_NAMES = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy",
             "gpu_memset": "Memset", "ac2g": "async"}


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


@pytest.mark.slow  # it runs `python -m commtag summary` on the merged file
@pytest.mark.parametrize("trace", [METRICS, TORCH19], ids=lambda p: p.name)
def test_real_2021_traces_are_placed_on_their_threads_and_streams(tmp_path: Path, trace: Path) -> None:
    src = tmp_path / f"rank0.{trace.name}"
    src.symlink_to(trace)
    out = tmp_path / "old.pftrace"
    merge([src], out, json_dir=tmp_path / "json", progress=False)
    assert validate_file(out) == []
    events = _load(trace)["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X"]
    assert {type(e["tid"]) for e in complete} == {str}  # the era's format, as found
    parsed = read_trace(out)
    rows = Counter(tuple(parsed.name_path(s.track)[1:]) for s in parsed.slices if not s.instant)
    cpu = next(e for e in events if e.get("name") == "process_labels" and e["args"]["labels"] == "CPU")["pid"]
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    expected = Counter()
    for e in complete:
        if e["cat"] in ("Kernel", "Memcpy", "Memset"):
            assert e["pid"] == 0 and e["tid"] == "stream 7"
            expected[("GPU 0", "stream 7")] += 1
        elif e["pid"] == cpu:  # Operator, Runtime: the thread Kineto named in a thread_name event
            expected[("CPU threads", thread_names[(cpu, e["tid"])])] += 1
        else:
            assert e["cat"] == "Trace"  # the profiler's own span
            expected[(e["pid"], e["tid"])] += 1
    assert rows == expected
    # the old roles hold: each kernel, memcpy and memset is linked to the runtime call that launched it
    launched = {e["args"]["correlation"] for e in complete if e["cat"] == "Runtime"}
    device = [s for s in parsed.slices if parsed.name_path(s.track)[1:] == ["GPU 0", "stream 7"] and not s.instant]
    flows_out = {f for s in parsed.slices if parsed.name_path(s.track)[1] == "CPU threads" for f in s.flows_out}
    linked = [s for s in device if set(s.flows_in) & flows_out]
    work = [e for e in complete if e["cat"] in ("Kernel", "Memcpy", "Memset") and e["args"]["correlation"] in launched]
    assert len(linked) == len(work) > 0
    # and the stream gets its kernel-category breakdown, as a modern one does
    summary = subprocess.run([sys.executable, "-m", "commtag", "summary", str(src)], capture_output=True, text=True,
                             timeout=120)
    assert "rank 0 stream 7: " in summary.stdout + summary.stderr
    # --json writes the events under today's category names
    annotated = _load(tmp_path / "json" / src.name)["traceEvents"]
    assert Counter(e.get("cat") for e in annotated if e.get("ph") == "X") == Counter(
        {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
         "Memset": "gpu_memset"}.get(e.get("cat"), e.get("cat")) for e in complete)


def _as_2021(trace: dict) -> dict:
    """The trace as torch 1.9's Kineto wrote it: pids and tids of events as strings, GPU rows
    as "stream N", capitalised categories, launch flows of category "async"."""
    gpu = {e["pid"] for e in trace["traceEvents"]
           if e.get("name") == "process_labels" and str(e["args"]["labels"]).startswith("GPU")}
    events = []
    for e in trace["traceEvents"]:
        e = dict(e)
        if e.get("cat") in OLD_NAMES:
            e["cat"] = OLD_NAMES[e["cat"]]
        if e.get("ph") in ("X", "i", "M") and isinstance(e.get("pid"), int):
            on_gpu = e["pid"] in gpu and e.get("name") not in ("process_name", "process_labels", "process_sort_index")
            e["tid"] = f"stream {e['tid']}" if on_gpu else str(e["tid"])
            e["pid"] = str(e["pid"])
        events.append(e)
    return {**trace, "traceEvents": events}


@pytest.mark.slow
def test_a_2021_format_set_merges_into_the_same_trace(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    for path in sorted(DLRM.iterdir()):
        if path.name.endswith(".json.gz"):
            (old / path.name).write_bytes(gzip.compress(orjson.dumps(_as_2021(_load(path))), compresslevel=1))
    kernels = [e for e in _load(next(old.iterdir()))["traceEvents"] if e.get("cat") == "Kernel"]
    assert kernels and all(e["tid"].startswith("stream ") for e in kernels)

    modern, legacy = tmp_path / "modern.pftrace", tmp_path / "legacy.pftrace"
    new_result = merge(DLRM, modern, progress=False)
    old_result = merge(old, legacy, progress=False)
    assert validate_file(legacy) == []
    # every rank, every NCCL kernel found and linked across the 8 ranks, as from the original
    assert old_result.ranks == list(range(8))
    assert len(old_result.instances) == len(new_result.instances) == 64
    one, two = read_trace(modern), read_trace(legacy)
    assert two.tracks == one.tracks
    assert len(two.slices) == len(one.slices) > 19_000
    assert two.slices == one.slices

    def report(path: Path) -> dict:
        done = subprocess.run([sys.executable, "-m", "commtag", "summary", str(path), "--format", "json"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    assert report(old) == report(DLRM)
