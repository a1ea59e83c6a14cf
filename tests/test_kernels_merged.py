"""Kernel categories in the merged trace: graph launch slices, GPU stream rows and lanes of real
public traces carry the breakdown commtag.kernels computes from the input events, and
``commtag summary`` reads the same back from the .pftrace as from the directory."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from commtag.kernels import Breakdown, categorize
from merging import merge
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES as PUBLIC
from kernel_reference import by_graph_launch, by_stream, kernels_from_events
from pftrace_reader import read

SCOPE = "commtag kernels scope"


def _input(relpath: str) -> Path:
    path = PUBLIC / relpath
    return path


def _events(path: Path) -> list[dict]:
    return orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    """Merge a public trace (each once per module) alone in its directory; the parsed
    output, checked by commtag validate, and the input directory and output file."""
    done: dict[str, tuple] = {}

    def get(relpath: str):
        if relpath not in done:
            source = tmp_path_factory.mktemp("in")
            (source / Path(relpath).name).symlink_to(_input(relpath))
            out = source.parent / f"{source.name}.pftrace"
            merge(source, out, progress=False)
            assert validate_file(out) == []
            done[relpath] = (read(out), source, out)
        return done[relpath]

    return get


def _annotated(parsed, scope: str) -> dict:
    return {(s.args["commtag rank"], s.args["commtag kernels id"]): s for s in parsed.slices
            if s.args.get(SCOPE) == scope}


def _assert_same(found: Breakdown, expected: Breakdown) -> None:
    # Same additions in the same order: equal floats, not approximately equal.
    assert dict(found.time_us) == dict(expected.time_us)
    assert dict(found.count) == dict(expected.count)


def _check_slice(s, expected: Breakdown) -> None:
    _assert_same(Breakdown.from_annotations(s.args), expected)
    assert s.args["commtag dominant"] == expected.dominant[0]
    assert s.args["commtag kernels"] == expected.describe()


@pytest.mark.parametrize("relpath", [
    "edge-cases/tracelens_vllm_hipgraph_replay.json.gz",
    "single-rank-scale/hta_a100_rank0_of16.json.gz",
])
def test_graph_launches_and_streams_carry_their_breakdown(relpath, merged):
    kernels = kernels_from_events(_events(_input(relpath)), rank=0)
    parsed, _, _ = merged(relpath)

    launches = by_graph_launch(kernels)
    assert launches, "the trace has graph launches with kernels"
    annotated = _annotated(parsed, "graph launch")
    assert set(annotated) == set(launches)
    for key, s in annotated.items():
        assert s.name in ("cudaGraphLaunch", "hipGraphLaunch") and s.end > s.ts  # the CPU launch slice itself
        # It is the launch of that replay: its launch flows reach exactly the device work counted.
        reached = [k for k in parsed.slices if set(s.flows_out) & set(k.flows_in)]
        assert len(reached) == sum(launches[key].count.values())
        _check_slice(s, launches[key])

    streams = by_stream(kernels)
    rows = _annotated(parsed, "stream")
    assert set(rows) == set(streams)
    for (rank, stream), s in rows.items():
        assert s.end == s.ts  # an instant, on the stream's own row, where its first kernel starts
        row = parsed.name_path(s.track)
        assert row[1].startswith("GPU ") and row[-1].split()[-1] == str(stream)
        first = min(k.ts for k in parsed.slices if k.track == s.track and k is not s)
        assert s.ts == first
        assert s.name == f"commtag kernels: {streams[(rank, stream)].describe()}"
        _check_slice(s, streams[(rank, stream)])


@pytest.mark.slow  # merges a large public trace (conftest.LARGE_TRACE_BYTES)
def test_real_graph_replay_is_gemm_bound_and_real_streams_split_nccl_from_compute(merged):
    """What a user reads off the annotations of real traces."""
    parsed, _, _ = merged("edge-cases/tracelens_vllm_hipgraph_replay.json.gz")
    (launch,) = _annotated(parsed, "graph launch").values()
    assert launch.name == "hipGraphLaunch" and launch.args["commtag dominant"] == "GEMM"
    assert launch.args["commtag kernels"].startswith("GEMM ")

    parsed, _, _ = merged("single-rank-scale/hta_a100_rank0_of16.json.gz")
    dominant = {ident: s.args["commtag dominant"] for (_, ident), s in _annotated(parsed, "stream").items()}
    nccl = {s.args["stream"] for s in parsed.slices if s.name.startswith("ncclKernel")}
    assert nccl and all(dominant[stream] == "communication" for stream in nccl)
    assert "GEMM" in dominant.values()


def test_lane_breakdown_is_the_device_work_of_its_collectives(merged):
    """Eager NCCL kernels with metadata: each lane's breakdown is its group's NCCL kernels."""
    relpath = "eager-nccl-metadata/hta_a100_nccl_data.json.gz"
    events = _events(_input(relpath))
    parsed, _, _ = merged(relpath)
    group_of_lane = {s.args["commtag lane"]: s.args["Process Group Name"] for s in parsed.slices
                     if "commtag pg uid" in s.args and "Process Group Name" in s.args}
    lanes = _annotated(parsed, "lane")
    assert lanes and set(lanes) == {(0, lane) for lane in group_of_lane}
    for (rank, lane), s in lanes.items():
        expected = Breakdown()
        for e in events:
            args = e.get("args") or {}
            if e.get("cat") == "kernel" and args.get("Process Group Name") == group_of_lane[lane]:
                expected.time_us[categorize(e["name"])] += float(e["dur"])
                expected.count[categorize(e["name"])] += 1
        assert set(expected.time_us) == {"communication"}
        _check_slice(s, expected)
        assert parsed.name_path(s.track) == [lane, f"rank {rank}"]


@pytest.mark.parametrize("relpath", [
    "single-rank-scale/hta_a100_rank0_of16.json.gz",
    "eager-nccl-metadata/hta_a100_nccl_data.json.gz",
])
def test_summary_reads_the_same_breakdowns_from_the_merged_trace(relpath, merged):
    from commtag.report.tables import to_json, to_text
    from commtag.report.inputs import load

    _, source, out = merged(relpath)
    from_dir, dir_kernels = load(source)
    from_file, file_kernels = load(out)
    assert set(dir_kernels) == {"stream", "graph launch", "lane"}
    assert orjson.loads(to_json(from_file, file_kernels))["kernels"] == orjson.loads(to_json(from_dir, dir_kernels))["kernels"]
    text = to_text(from_file, file_kernels)
    assert "GPU time by kernel category, per stream:" in text
    assert text.split("GPU time by kernel category")[1:] == to_text(from_dir, dir_kernels).split("GPU time by kernel category")[1:]


def test_a_lane_replayed_in_a_graph_gets_the_whole_launch():
    """A collective captured in a CUDA graph costs its replay: the lane's breakdown is its eager
    kernels plus every kernel of the launches that ran its graph kernels, computed alike from
    events (by_lane) and by the merge's single pass (DeviceWork)."""
    from commtag.kernels import DeviceWork
    from kernel_reference import by_lane

    lane = "PG 1 (tp) [0, 1]"

    def kernel(name, dur, corr, on_lane=False, stream=7, cat="kernel"):
        args = {"correlation": corr, "stream": stream}
        if on_lane:
            args["commtag lane"] = lane
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": 1.0, "dur": dur, "args": args}

    events = [
        # kernels before their launch, as a trace may order them
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 40.0, 9, on_lane=True, stream=20),
        kernel("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", 100.0, 9),
        kernel("Memcpy DtoD (Device -> Device)", 5.0, 9, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 0.5, "dur": 3.0,
         "args": {"correlation": 9}},
        kernel("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", 70.0, 11),  # another launch, none of the lane's
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 0.6, "dur": 3.0,
         "args": {"correlation": 11}},
        kernel("ncclDevKernel_Broadcast_RING_LL", 8.0, 12, on_lane=True, stream=20),  # eager
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 0.7, "dur": 1.0,
         "args": {"correlation": 12}},
    ]
    expected = by_lane(kernels_from_events(events, rank=0))
    assert set(expected) == {(0, lane)}
    b = expected[(0, lane)]
    assert dict(b.time_us) == {"communication": 48.0, "GEMM": 100.0, "memcpy/memset": 5.0}
    assert dict(b.count) == {"communication": 2, "GEMM": 1, "memcpy/memset": 1}

    work = DeviceWork()
    for e in events:
        if e["cat"] == "cuda_runtime":
            work.launch(e["name"], e["args"]["correlation"])
        else:
            work.kernel((e["pid"], e["tid"]), e["name"], e["cat"], e["dur"], e["args"])
    assert work.end_trace() == [9, 11]
    work.finish()
    _assert_same(work.lanes[lane], b)
    launches = by_graph_launch(kernels_from_events(events, rank=0))
    for corr in (9, 11):
        _assert_same(work.launches[corr], launches[(0, corr)])


def test_summary_of_one_trace_file_is_that_of_its_directory(merged):
    from commtag.report.tables import to_json
    from commtag.report.inputs import load

    _, source, _ = merged("eager-nccl-metadata/hta_a100_nccl_data.json.gz")
    (trace,) = source.iterdir()
    assert to_json(*load(trace)) == to_json(*load(source))
    assert orjson.loads(to_json(*load(trace)))["collectives"]


def test_a_group_mixing_symmetric_and_regular_nccl_kernels_is_said(tmp_path):
    """The public eager trace with every other all_reduce kernel renamed to the symmetric-memory
    kernel NCCL runs for it on registered buffers (src/device/symmetric/generate.py:
    ncclSymkDevKernel_AllReduce_<algo>_sum_f32): each is still its collective, counted as
    communication, and the lane says it mixes both kinds, from the directory and the merged trace."""
    from commtag.report.inputs import load
    from commtag.report.tables import to_json, to_text

    source = _input("eager-nccl-metadata/hta_a100_nccl_data.json.gz")
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel_AllReduce"):
            if renamed % 2 == 0:
                e["name"] = "ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f32(ncclSymkDevWorkArgs4K)"
            renamed += 1
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / source.name).write_bytes(gzip.compress(orjson.dumps(doc)))
    out = tmp_path / "merged.pftrace"
    merge(tmp_path / "in", out, progress=False)
    assert validate_file(out) == []
    (lane,) = _annotated(read(out), "lane").values()
    assert (lane.args["commtag kernels nccl symmetric count"], lane.args["commtag kernels nccl regular count"]) == (8, 13)
    for path in (tmp_path / "in", out):
        analysis, kernels = load(path)
        text = to_text(analysis, kernels)
        assert "groups mixing NCCL's symmetric-memory and regular kernels" in text
        assert f"{lane.args['commtag kernels id']}: 8 symmetric-memory and 13 regular NCCL kernels" in text
        (entry,) = orjson.loads(to_json(analysis, kernels))["kernels"]["lane"]
        assert entry["nccl_kernels"] == {"symmetric": 8, "regular": 13}
        assert entry["count"] == {"communication": 21}
