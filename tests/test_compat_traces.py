"""Traces a newer torch's profiler wrote merge here with every event accounted for.

tests/data/torch-traces/torch-X.Y holds a 2-rank gloo job (launch/compat_traces.py:
two groups, seven collectives and a send/recv) profiled by that torch with commtag
installed, traces and sidecars as written. The merge runs on whatever torch this is
(CI: 2.13), as a user's merge machine would on files from a newer cluster: each
rank's every complete event must be a slice of the merged trace, every other event
counted under a reason, and every collective attached and paired across the ranks.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from merging import merge
from test_merge_accounting import assert_accounted

DATA = Path(__file__).resolve().parent / "data" / "torch-traces"
SETS = sorted(p for p in DATA.glob("torch-*") if p.is_dir())


def test_the_newer_torch_traces_are_there() -> None:
    assert {"torch-2.14", "torch-2.15"} <= {p.name for p in SETS}, SETS


@pytest.mark.parametrize("folder", SETS, ids=lambda p: p.name)
def test_every_event_is_merged_or_accounted_for(folder: Path, tmp_path: Path) -> None:
    trace = orjson.loads(gzip.decompress((folder / "rank0.step0.pt.trace.json.gz").read_bytes()))
    sidecar = orjson.loads((folder / "rank0.step0.commtag.json").read_bytes())
    assert sidecar["torch_version"].startswith(folder.name.removeprefix("torch-") + ".")  # what the data claims
    assert "distributedInfo" in trace
    out = tmp_path / "merged.pftrace"
    result = merge(folder, out, progress=False)
    assert result.ranks == [0, 1]
    assert_accounted([folder], out, result)
    # Every call is attached on both ranks, each rank's half found by its group and Seq:
    # on the world all_reduce, all_gather, all_to_all, barrier; on the pair all_reduce,
    # broadcast; the send/recv.
    calls: dict[tuple, list] = {}
    for inst in result.instances:
        calls.setdefault((inst.pg_uid, inst.is_p2p, inst.seq), []).append(inst)
    assert len(calls) == 7, sorted(calls)
    for key, halves in calls.items():
        assert sorted(i.rank for i in halves) == [0, 1], key
    assert sorted(halves[0].collective for halves in calls.values() if not halves[0].is_p2p) == [
        "_allgather_base", "all_to_allv", "allreduce", "allreduce", "barrier", "broadcast"]
