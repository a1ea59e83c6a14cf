"""Merge real public traces nobody here produced: ranks, streams, NCCL kernels, lanes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from commtag.vocab import LINK_ARGS
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.load import discover
from merging import merge
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES as PUBLIC
from pftrace_reader import lane_of, read



def _nccl_kernels(parsed, rank: int) -> list:
    return [s for s in parsed.slices if s.name.startswith("ncclKernel")
            and parsed.name_path(s.track)[0].startswith(f"rank {rank} ")]


def test_param_dlrm_8_ranks(tmp_path: Path) -> None:
    out = tmp_path / "dlrm.pftrace"
    result = merge(PUBLIC / "param-dlrm-8rank", out)
    assert result.ranks == list(range(8))
    assert validate_file(out) == []
    parsed = read(out)
    procs = sorted(parsed.processes(), key=lambda d: d.sibling_order_rank)
    assert [d.process.process_name.split(" · ")[0] for d in procs] == [f"rank {r}" for r in range(8)]
    assert len({d.process.pid for d in procs}) == 8
    for rank in range(8):
        kernels = _nccl_kernels(parsed, rank)
        # 5 SendRecv + 3 AllReduce per rank, on their real stream 84 of the rank's GPU
        assert sorted(k.name.split("_")[1] for k in kernels) == ["AllReduce"] * 3 + ["SendRecv"] * 5
        assert {tuple(parsed.name_path(k.track)[1:]) for k in kernels} == {(f"GPU {rank}", "stream 84")}
        lane = [s for s in parsed.slices if (lane_of(parsed, s) or (None,))[0] == rank]
        assert len(lane) == 8 and {s.args["commtag lane"] for s in lane} == {"NCCL kernels (no metadata)"}
    # every rank saw the same kernels, so the inferred instances are linked across ranks
    lanes = [s for s in parsed.slices if s.args.get("commtag lane")]
    starts = {f for s in lanes for f in s.flows_out}
    ends = {f for s in lanes for f in s.flows_in}
    assert len(starts & ends) == 8 * 28  # 8 instances x every pair of 8 ranks


def test_hta_2_ranks_keep_their_streams(tmp_path: Path) -> None:
    out = tmp_path / "hta.pftrace"
    result = merge(PUBLIC / "hta-sampled-2rank", out)
    assert result.ranks == [0, 1]
    assert validate_file(out) == []
    parsed = read(out)
    for rank in (0, 1):
        kernels = _nccl_kernels(parsed, rank)
        assert len(kernels) == 10
        streams = {parsed.name_path(k.track)[-1] for k in kernels}
        assert streams == {"stream 84", "stream 203"}
    # overlapping kernels on one stream stay there, on backing tracks sharing one merge key
    names = [d for d in parsed.tracks.values() if d.name == "stream 84" and d.sibling_merge_key]
    for d in names:
        assert d.sibling_merge_behavior == d.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY


@pytest.mark.slow  # merges a large public trace (conftest.LARGE_TRACE_BYTES)
def test_eager_metadata_is_kept_and_completed(tmp_path: Path) -> None:
    src = PUBLIC / "eager-nccl-metadata" / "hta_a100_nccl_data.json.gz"
    out = tmp_path / "eager.pftrace"
    result = merge([src], out, json_dir=tmp_path / "json")
    assert validate_file(out) == []
    assert len(result.instances) == 21
    inst = result.instances[0]
    assert inst.lane_name == "PG 0 (default_pg) [0, 1]" and inst.group_ranks == (0, 1)
    assert [i.seq for i in result.instances] == list(range(1, 22))
    assert inst.arg("commtag seq from") == "kernel order"
    annotated = (tmp_path / "json" / src.name)
    import gzip

    import orjson
    events = orjson.loads(gzip.decompress(annotated.read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "Collective name" in e["args"]]
    assert len(kernels) == 21 and all("commtag pg uid" in k["args"] and "Seq" in k["args"] for k in kernels)
    # the merged kernels carry Kineto's eager keys once (read() refuses a name given twice), completed alike
    merged = sorted((s for s in read(out).slices if "commtag pg uid" in s.args and s.name.startswith("nccl")),
                    key=lambda s: s.ts)
    as_written = lambda v: orjson.dumps(v).decode() if isinstance(v, list) else v  # noqa: E731 - lists as JSON text
    assert [s.args for s in merged] == [{k: as_written(v) for k, v in e["args"].items() if k not in LINK_ARGS}
                                        for e in sorted(kernels, key=lambda e: e["ts"])]


@pytest.mark.parametrize("name", [
    "eager-nccl-metadata/tracelens_b200_eager_trace.json.gz",
    "eager-nccl-metadata/tracelens_mi300_rccl_resnet.json.gz",
    "edge-cases/hta_gloo_cpu_only_rank34_of300.json.gz",
    "edge-cases/kineto_h100_graph_node_id_zero.json",
    "edge-cases/tracelens_vllm_hipgraph_replay.json.gz",
])
def test_every_public_format_merges_and_validates(tmp_path: Path, name: str) -> None:
    out = tmp_path / "one.pftrace"
    src = tmp_path / ("rank0." + name.split("/")[-1])  # the graph-node-id trace names no rank
    src.symlink_to(PUBLIC / name)
    result = merge([src], out)
    assert len(result.ranks) == 1
    assert validate_file(out) == []
    assert read(out).slices


@pytest.mark.slow
def test_rank_from_file_name_or_a_clear_error(tmp_path: Path) -> None:
    nameless = PUBLIC / "edge-cases" / "hta_no_distributed_info.json.gz"
    with pytest.raises(MergeInputError, match=re.escape(str(nameless)) + ".*cannot tell the rank"):
        discover([nameless])
    (tmp_path / "trainer_rank-5.json.gz").symlink_to(nameless)
    assert [r.rank for r in discover([tmp_path])] == [5]
    other = tmp_path / "other"
    other.mkdir()
    (other / "job-7-of-8.json.gz").symlink_to(nameless)
    assert [r.rank for r in discover([other], rank_pattern=r"job-(\d+)")] == [7]
    proc = subprocess.run([sys.executable, "-m", "commtag.merge", str(nameless), "-o", str(tmp_path / "x.pftrace")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot tell the rank" in proc.stderr and str(nameless) in proc.stderr
    assert not (tmp_path / "x.pftrace").exists()


@pytest.mark.slow
def test_bad_input_writes_nothing_and_keeps_the_old_output(tmp_path: Path) -> None:
    good = tmp_path / "rank0.json"
    good.write_text('{"traceEvents": [')
    out = tmp_path / "merged.pftrace"
    out.write_bytes(b"previous")
    proc = subprocess.run([sys.executable, "-m", "commtag", "merge", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(good) in proc.stderr and "not valid JSON" in proc.stderr
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged.pftrace", "rank0.json"]
