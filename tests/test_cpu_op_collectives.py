"""Collectives from record_param_comms CPU ops when no kernel carries the eager metadata.

A CPU-only profile of an NCCL job (``activities=[CPU]``) or a world of one
rank (NCCL runs no kernel) has every eager key on the ``record_param_comms``
ops and none on a kernel. The input here is a real A100 NCCL trace
(HolisticTraceAnalysis' nccl_data, rank 0 of 2) reduced to what a CPU-only
profile of the same run would have written: its GPU activity and runtime
calls dropped.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.merge.inputs.clock import base_ns, event_ns
from merging import merge
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES as PUBLIC
from commtag.vocab import GPU_CATEGORIES, KERNEL_EAGER_KEYS, LAUNCH_CATEGORIES

A100 = PUBLIC / "eager-nccl-metadata" / "hta_a100_nccl_data.json.gz"


def _trace() -> dict:
    return orjson.loads(gzip.decompress(A100.read_bytes()))


def _cpu_only(trace: dict) -> dict:
    """What activities=[CPU] keeps of the run: no device work, no runtime calls, no flows to them."""
    dropped = GPU_CATEGORIES | LAUNCH_CATEGORIES | {"ac2g"}
    return {**trace, "traceEvents": [e for e in trace["traceEvents"] if e.get("cat") not in dropped]}


def _write(path: Path, trace: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(orjson.dumps(trace)))
    return path


def _key(inst) -> tuple:
    return (inst.pg_uid, inst.seq, inst.collective, inst.in_nelems, inst.out_nelems, inst.dtype, inst.group_size,
            inst.lane_name, inst.group_ranks)


def test_a_cpu_only_profile_gives_the_collectives_its_kernels_gave(tmp_path: Path) -> None:
    full = merge([_write(tmp_path / "full" / "rank0.json.gz", _trace())], tmp_path / "full.pftrace")
    assert len(full.instances) == 21 and {i.source for i in full.instances} == {"nccl-kernel"}
    cpu = merge([_write(tmp_path / "cpu" / "rank0.json.gz", _cpu_only(_trace()))], tmp_path / "cpu.pftrace")
    assert validate_file(tmp_path / "cpu.pftrace") == []
    # the same collectives (15 allreduce, 6 broadcast; the 6 "wait" ops are no collective), the same lanes
    # and cross-rank keys, timed by their ops
    assert [_key(i) for i in cpu.instances] == [_key(i) for i in full.instances]
    assert {i.source for i in cpu.instances} == {"cpu-op"}
    assert all(i.arg("commtag seq from") == "record_param_comms order" for i in cpu.instances)
    trace = _trace()
    ops = sorted(event_ns(e, base_ns(trace)) for e in trace["traceEvents"]
                 if e.get("name") == "record_param_comms" and e["args"]["Collective name"] != "wait")
    assert [(i.start_ns, i.end_ns) for i in cpu.instances] == ops
    assert any("timed by their CPU op (record_param_comms or c10d" in n for n in cpu.notices)


@pytest.mark.slow
def test_ranks_of_a_cpu_only_run_are_matched_and_the_summary_says_how(tmp_path: Path) -> None:
    """Rank 1 is rank 0's CPU-only trace relabelled: the op-made instances pair up across ranks."""
    rank0 = _cpu_only(_trace())
    rank1 = {**rank0, "distributedInfo": {**rank0["distributedInfo"], "rank": 1}}
    _write(tmp_path / "in" / "rank0.json.gz", rank0)
    _write(tmp_path / "in" / "rank1.json.gz", rank1)
    out = tmp_path / "merged.pftrace"
    result = merge([tmp_path / "in"], out)
    assert result.ranks == [0, 1] and len(result.instances) == 42
    summary = subprocess.run([sys.executable, "-m", "commtag", "summary", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0] == "21 collectives on 2 ranks, 1 process group, 0 desyncs"
    assert lines[1].startswith("note: 21 of 21 collectives are timed by their CPU op (record_param_comms or c10d)")
    allreduce = next(line.split() for line in lines if line.strip().startswith("allreduce"))
    # No bandwidth from host times, and no cause: no kernel says when the transfer ran.
    assert allreduce[1] == "15" and allreduce[-5:-3] == ["-", "-"] and allreduce[-2:] == ["inconclusive", "100%"]


def test_an_older_torchs_integer_process_group_id_names_the_group(tmp_path: Path) -> None:
    """Older torch wrote "Process Group ID" (pg_config's uid) where newer writes "Process Group Name"."""
    trace = _cpu_only(_trace())
    by_name = merge([_write(tmp_path / "name" / "rank0.json.gz", trace)], tmp_path / "name.pftrace")
    for e in trace["traceEvents"]:
        args = e.get("args") or {}
        if e.get("name") == "record_param_comms" and "Process Group Name" in args:
            args["Process Group ID"] = int(args.pop("Process Group Name"))
            args.pop("Process Group Description", None)
    trace["distributedInfo"]["pg_config"] = [{**pg, "uid": int(pg["pg_name"])}
                                             for pg in trace["distributedInfo"]["pg_config"]]
    by_id = merge([_write(tmp_path / "id" / "rank0.json.gz", trace)], tmp_path / "id.pftrace")
    assert len(by_id.instances) == 21
    assert [_key(i) for i in by_id.instances] == [_key(i) for i in by_name.instances]
    assert by_id.instances[0].lane_name == "PG 0 (default_pg) [0, 1]"


def test_a_public_world_of_one_rank_with_process_group_ids(tmp_path: Path) -> None:
    """HolisticTraceAnalysis' ns_resolution trace: NCCL on one V100, a world of one, so no NCCL kernel."""
    found = sorted(PUBLIC.rglob("hta_v100_nccl_world1_pgid*"))
    result = merge(found[:1], tmp_path / "one.pftrace")
    assert sorted(i.collective for i in result.instances) == ["allreduce"] * 25 + ["broadcast"] * 10
    assert {i.lane_name for i in result.instances} == {"PG 0 () [0]"}


def test_kernels_without_the_keys_are_timed_with_their_ops_metadata(tmp_path: Path) -> None:
    """A Kineto that did not copy the keys onto the kernel: each op lends its keys to its kernel
    (the same "External id"), which keeps the device time; nothing is counted twice."""
    full = merge([_write(tmp_path / "full" / "rank0.json.gz", _trace())], tmp_path / "full.pftrace")
    bare = _trace()
    for e in bare["traceEvents"]:
        if e.get("cat") == "kernel":
            for key in KERNEL_EAGER_KEYS:
                (e.get("args") or {}).pop(key, None)
    paired = merge([_write(tmp_path / "bare" / "rank0.json.gz", bare)], tmp_path / "bare.pftrace")
    assert [_key(i) for i in paired.instances] == [_key(i) for i in full.instances]
    assert [(i.start_ns, i.end_ns, i.source) for i in paired.instances] == \
        [(i.start_ns, i.end_ns, i.source) for i in full.instances]  # the kernels' own times
    assert not any("CPU ops" in n for n in paired.notices)
