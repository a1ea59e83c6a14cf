"""What the merge makes of what other tools write into, or beside, a profiler trace: Kineto's own
trace-wide instants, a folder holding another profiler's output, and HTA's critical-path flows."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.merge.inputs.load import discover
from merging import merge
from pftrace_reader import read


def test_the_record_window_end_instant_sits_on_its_ranks_trace_row(public_traces: Path, tmp_path: Path) -> None:
    """Kineto ends every file with a global instant "Record Window End" written with pid "" and
    tid "" (libkineto/src/output_json.cpp, finalizeTrace); PARAM's DLRM rank 1 is such a file. It
    goes on the row of the window's other global instant, "Iteration Start", under its rank."""
    source = next((public_traces / "param-dlrm-8rank").glob("worker1_*"))
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(source, job / source.name)
    out = tmp_path / "merged.pftrace"
    merge(job, out, progress=False)
    parsed = read(out)
    marks = {s.name: parsed.name_path(s.track) for s in parsed.slices
             if s.instant and (s.name == "Record Window End" or s.name.startswith("Iteration Start"))}
    assert marks["Record Window End"] == marks["Iteration Start: PyTorch Profiler"], marks
    assert marks["Record Window End"][0].startswith("rank 1 ") and marks["Record Window End"][1:] == \
        ["Traces", "Trace PyTorch Profiler"]


def _rocprofiler_sdk_results(path: Path) -> None:
    """A small ``<pid>_results.json.gz`` as rocprofv3 --output-format json writes it: one object per
    process under "rocprofiler-sdk-tool" holding metadata, agents, strings, symbols, a summary and
    the buffer records (rocprofiler-sdk source/lib/output/generateJSON.cpp: write_json)."""
    process = {
        "metadata": {"pid": 4242, "init_time": 1_700_000_000_000_000_000, "fini_time": 1_700_000_001_000_000_000,
                     "config": {"kernel_trace": True}, "command": ["python", "train.py"]},
        "agents": [{"node_id": 1, "type": 2, "name": "gfx942"}],
        "counters": [],
        "strings": {"callback_records": [], "buffer_records": [{"kind": "KERNEL_DISPATCH", "operations": []}],
                    "marker_api": [], "correlation_id": {"external": []}},
        "code_objects": [], "kernel_symbols": [{"kernel_id": 1, "kernel_name": "ncclDevKernel_Generic"}],
        "host_functions": [],
        "summary": [{"domain": "KERNEL_DISPATCH", "stats": {"count": 1}}],
        "callback_records": {"counter_collection": []},
        "buffer_records": {"kernel_dispatch": [{"start_timestamp": 1_700_000_000_100_000_000,
                                                "end_timestamp": 1_700_000_000_100_500_000,
                                                "dispatch_info": {"kernel_id": 1}}],
                           "hip_api": [], "hsa_api": [], "marker_api": [], "rccl_api": [], "memory_copy": []},
    }
    path.write_bytes(gzip.compress(orjson.dumps({"rocprofiler-sdk-tool": [process]}, option=orjson.OPT_INDENT_2)))


@pytest.mark.slow
def test_a_folder_of_another_tools_json_is_refused_naming_the_folder_and_the_format(tmp_path: Path) -> None:
    job = tmp_path / "profiles"
    job.mkdir()
    _rocprofiler_sdk_results(job / "4242_results.json.gz")
    out = tmp_path / "merged.pftrace"
    for command in (["merge", str(job), "-o", str(out)], ["summary", str(job)]):
        done = subprocess.run([sys.executable, "-m", "commtag", *command], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"commtag {command[0]}: "), done.stderr
        assert f"{job}: no PyTorch profiler trace" in lines[0], lines
        assert "4242_results.json.gz is another tool's format: rocprofiler-sdk's JSON" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profiles"]  # nothing written, no temporaries


def test_another_tools_json_beside_traces_is_said_and_left_out(public_traces: Path, tmp_path: Path) -> None:
    source = next((public_traces / "param-dlrm-8rank").glob("worker1_*"))
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(source, job / source.name)
    _rocprofiler_sdk_results(job / "4242_results.json.gz")
    notices: list[str] = []
    ranks = discover([job], notices=notices)
    assert [r.rank for r in ranks] == [1]
    assert notices == [f"{job}: 1 file(s) left out; 4242_results.json.gz is another tool's format: "
                       "rocprofiler-sdk's JSON (rocprofv3 --output-format json)"]


def _overlaid_critical_path(source: Path, out: Path) -> list[str]:
    """``source`` as HTA's critical-path overlay writes it (hta/analyzers/critical_path_analysis.py,
    overlay_critical_path_analysis; hta/common/trace.py, Trace.flow_event): the events on the path get
    ``"critical": 1``, each edge a flow start at its first event and an end ("bp": "e") at its second,
    named "critical_path", its category the edge's type. The names of the events marked."""
    trace = orjson.loads(gzip.decompress(source.read_bytes()))
    events = trace["traceEvents"]
    launch = next(e for e in events if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaLaunchKernel")
    kernel = next(e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") ==
                  launch["args"]["correlation"])
    op = next(e for e in events if e.get("cat") == "cpu_op" and e["ts"] + e["dur"] <= launch["ts"]
              and (e["pid"], e["tid"]) == (launch["pid"], launch["tid"]))
    edges = [(op, launch, "critical_path_dependency"), (launch, kernel, "critical_path_kernel_launch_delay")]
    for flow_id, (begin, end, kind) in enumerate(edges):
        for event, phase in ((begin, "s"), (end, "f")):
            event["args"]["critical"] = 1
            flow = {"ph": phase, "id": flow_id, "pid": event["pid"], "tid": event["tid"], "ts": int(event["ts"]),
                    "cat": kind, "name": "critical_path", "args": {"weight": 0, "critical": True}}
            events.append({**flow, "bp": "e"} if phase == "f" else flow)
    out.write_bytes(gzip.compress(orjson.dumps(trace)))
    return [op["name"], launch["name"], kernel["name"]]


def test_htas_critical_path_flows_are_counted_and_said_why_not_drawn(public_traces: Path, tmp_path: Path) -> None:
    """PARAM's DLRM rank 1, overlaid with a two-edge critical path as HTA writes one: its four flow
    events are left out under a reason that names them and says why; the events on the path keep
    HTA's mark."""
    source = next((public_traces / "param-dlrm-8rank").glob("worker1_*"))
    job = tmp_path / "job"
    job.mkdir()
    marked = _overlaid_critical_path(source, job / source.name)
    out = tmp_path / "merged.pftrace"
    result = merge(job, out, progress=False)
    [account] = result.accounts
    reasons = {reason: n for reason, n in account.left_out.items() if "critical-path" in reason}
    assert reasons == {"HTA critical-path flows (not drawn: HTA found that path in this one rank's trace alone; "
                       "the events on it keep HTA's 'critical': 1 arg)": 4}, account.left_out
    kept = {s.name for s in read(out).slices if s.args.get("critical") == 1}
    assert set(marked) <= kept, (marked, kept)
