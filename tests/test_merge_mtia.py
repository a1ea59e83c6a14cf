"""A trace of another device (MTIA) whose work carries its runtime calls' correlation ids.

No public MTIA trace is known, so the input is a public GPU trace (rank 1 of the
DLRM set in tests/data/public) with Kineto's MTIA category names in place of CUDA's,
as libkineto's ActivityType table (libkineto/include/ActivityType.h and
ActivityType.cpp in pytorch/kineto) names them: ``cuda_runtime`` -> ``mtia_runtime``
(MTIA_RUNTIME, "host side MTIA runtime events"), and the device work ``kernel``,
``gpu_memcpy``, ``gpu_memset`` -> ``mtia_ccp_events`` (MTIA_CCP_EVENTS, "MTIA
ondevice CCP events"). The devices' "process_labels" ("GPU N") are dropped: an MTIA
device is not a GPU, and its rows must be found by their category.

The account is checked against the merged trace read back: what it says was drawn
is what the output holds, also when that is nothing.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from merging import merge
from pftrace_reader import read
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES

DLRM_RANK1 = PUBLIC_TRACES / "param-dlrm-8rank" / "worker1_step_12.1694128201556.pt.trace.json.gz"
#: CUDA's category -> MTIA's (see the module's docstring for where each name comes from).
TO_MTIA = {"cuda_runtime": "mtia_runtime", "kernel": "mtia_ccp_events", "gpu_memcpy": "mtia_ccp_events",
           "gpu_memset": "mtia_ccp_events"}


def _as_mtia(trace: dict, correlated: bool = True) -> dict:
    """``trace`` with MTIA's categories; ``correlated`` False: its device work without correlation ids."""
    events = []
    for e in trace["traceEvents"]:
        if e.get("name") == "process_labels" and str(e["args"]["labels"]).startswith("GPU"):
            continue
        e = {**e, "cat": TO_MTIA.get(e.get("cat"), e.get("cat"))} if "cat" in e else dict(e)
        if not correlated and e.get("cat") == "mtia_ccp_events":
            e["args"] = {k: v for k, v in e.get("args", {}).items() if k != "correlation"}
        events.append(e)
    return {**trace, "traceEvents": events}


def _launched(trace: dict) -> int:
    """Device work whose correlation id is a runtime call's: the launch flows the output should hold."""
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    calls = {e["args"]["correlation"] for e in complete if e.get("cat") == "mtia_runtime"}
    return sum(1 for e in complete if e.get("cat") == "mtia_ccp_events"
               and (e.get("args") or {}).get("correlation") in calls)


def _merged(tmp_path: Path, trace: dict):
    src = tmp_path / "in"
    src.mkdir()
    (src / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
    out = tmp_path / "mtia.pftrace"
    result = merge([src], out, progress=False)
    assert validate_file(out) == []
    return result, read(out)


@pytest.mark.parametrize("correlated", [True, False], ids=["correlated", "no-correlation"])
def test_mtia_work_is_on_its_device_and_the_account_says_what_was_drawn(tmp_path: Path, correlated: bool) -> None:
    trace = _as_mtia(orjson.loads(gzip.decompress(DLRM_RANK1.read_bytes())), correlated)
    result, parsed = _merged(tmp_path, trace)
    (account,) = result.accounts
    groups = {}
    for s in parsed.slices:
        path = parsed.name_path(s.track)
        if path[0].startswith("rank ") and not s.instant:
            groups.setdefault(path[1], []).append(s)
    # Device streams are streams: under the device, none among the threads.
    device = groups.pop("MTIA 1")
    assert len(device) == sum(1 for e in trace["traceEvents"] if e.get("cat") == "mtia_ccp_events")
    assert {parsed.name_path(s.track)[2] for s in device} == {"stream 7", "stream 22", "stream 24", "stream 84"}
    assert not any(parsed.name_path(s.track)[2].startswith("stream") for s in groups["CPU threads"])
    # The account's launch flows are those the output holds between the threads and the device.
    host_out = {f for s in groups["CPU threads"] for f in s.flows_out}
    host_in = {f for s in groups["CPU threads"] for f in s.flows_in}
    drawn = {f for s in device for f in s.flows_in if f in host_out} | {f for s in device for f in s.flows_out
                                                                          if f in host_in}
    assert account.flows == len(drawn) == _launched(trace)
    assert (account.flows > 0) == correlated
    assert f"written, {account.flows} launch flows drawn; left out: " in account.describe()
