"""Replay matching and the merge on the real GPU fixtures written by launch/gpu_check.py.

tests/fixtures/gpu_graphs/ holds what one H100 run wrote (PROVENANCE.md there):
an eager step and the same step captured in a CUDA graph, each under the
profiler, with commtag's sidecars. The step (see gpu_check's ``_make_step``)
holds all_reduce(AVG) of N floats, an out-of-place all_gather, a broadcast,
an all_reduce(AVG) of N/2 floats on a second process group ("tp", ranks
[0]) and a functional all_reduce("avg"); a second graph holds one
all_reduce(AVG) of 2N floats. Replay 0 of the step's graph ran before the profiler started,
so its profiled replays are 1, 2 and 3; the second graph's are 0, 1 and 2.
These tests check, on CPU, what a user would: every replayed collective is
annotated on every replay with the eager profiler's values, and the merge
shows them so; and the eager step merges as one collective per call. Without
the fixtures they skip with that reason.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from commtag.merge.rank.replays import match_graph_replays
from commtag.merge.records import CPU_OP_SOURCE
from commtag.merge.inputs.clock import base_ns
from commtag.merge import merge
from commtag.merge.pftrace.validate import validate_file
from commtag.schema import GraphCapture, Sidecar
from commtag.sidecarfile import read_sidecar
from commtag.vocab import (
    ANN_LANE_ID, ANN_MATCH, ANN_REPLAY, ANN_SEQ_FROM, COLLECTIVE_NAME_KEY, IN_NELEMS_KEY, KERNEL_EAGER_KEYS, P2P_PEER_KEYS, PG_DESC_KEY,
    SEQ_KEY,
)
from pftrace_reader import read
from merging import matched

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu_graphs"
#: Keys a replay must say as the eager kernel did (its Seq is the capture's: see gpu_check).
KEYS = [key for key in KERNEL_EAGER_KEYS if key not in (*P2P_PEER_KEYS, SEQ_KEY)]
#: gpu_check's buffer size: the step's collectives move N floats, the second graph's 2N.
N = 4096

pytestmark = pytest.mark.skipif(not (FIXTURES / "PROVENANCE.md").exists(),
                                reason="no GPU fixtures yet: run launch/gpu_check.py on a GPU machine")


def _load(sub: str) -> tuple[dict, Sidecar]:
    trace_path = next((FIXTURES / sub).glob("*.pt.trace.json.gz"))
    side_path = next((FIXTURES / sub).glob("*.commtag.json"))
    with gzip.open(trace_path, "rt") as f:
        trace = json.load(f)
    return trace, read_sidecar(side_path)


def _eager_kernel_args() -> dict[tuple[str, str], dict]:
    """The eager profiler's keys on the first kernel of each (collective, group description)."""
    eager_trace, _ = _load("eager")
    found: dict[tuple[str, str], dict] = {}
    for e in eager_trace["traceEvents"]:
        if e.get("cat") == "kernel" and COLLECTIVE_NAME_KEY in e.get("args", {}):
            found.setdefault((e["args"][COLLECTIVE_NAME_KEY], e["args"][PG_DESC_KEY]), e["args"])
    return found


def _captures(sidecar: Sidecar) -> tuple[GraphCapture, GraphCapture]:
    """(the step's capture, the one-all_reduce capture)."""
    step = [c for c in sidecar.captures if len(c.collectives) > 1]
    single = [c for c in sidecar.captures if len(c.collectives) == 1]
    assert len(step) == 1 and len(single) == 1, [len(c.collectives) for c in sidecar.captures]
    return step[0], single[0]


def test_the_graphed_steps_collectives_carry_the_eager_metadata_on_every_replay() -> None:
    eager = _eager_kernel_args()
    assert set(eager) == {("allreduce", "default_pg"), ("allreduce", "tp")}, \
        "on one rank only the all_reduces launch a kernel the profiler annotates"
    trace, sidecar = _load("graph")
    step, _ = _captures(sidecar)
    result = match_graph_replays(trace["traceEvents"], sidecar.captures, base_ns(trace))
    assert result.unmatched == []
    got = [m for m in result.matches if m.capture_id == step.capture_id]
    # The step's three all_reduces (two Python calls, one on each group, and the functional one
    # caught at the c10d operator), on each profiled replay.
    seqs = sorted((c.annotation.pg_desc, c.annotation.seq) for c in step.collectives
                  if c.annotation.collective_name == "allreduce")
    assert len(seqs) == 3
    assert sorted((m.annotation.replay, m.annotation.pg_desc, m.args()[SEQ_KEY]) for m in got) == [
        (r, desc, seq) for r in (1, 2, 3) for desc, seq in seqs]
    for m in got:
        args = m.args()
        expected = eager[("allreduce", m.annotation.pg_desc)]
        assert {k: args.get(k) for k in KEYS} == {k: expected.get(k) for k in KEYS}
        assert args[ANN_MATCH] in ("tools-id", "node-id", "order")
    # One lane per process group, the same on every replay.
    lanes = {(m.annotation.pg_desc, m.args()[ANN_LANE_ID]) for m in got}
    assert len(lanes) == 2 and {desc for desc, _ in lanes} == {"default_pg", "tp"}
    # The all_gather ran as one device copy: without node ids it is said, not guessed.
    assert any("copy/memset node(s)" in note for note in result.notes)


def test_the_one_collective_graph_says_its_own_size_on_each_replay() -> None:
    trace, sidecar = _load("graph")
    _, single = _captures(sidecar)
    result = match_graph_replays(trace["traceEvents"], sidecar.captures, base_ns(trace))
    got = [m for m in result.matches if m.capture_id == single.capture_id]
    assert sorted(m.annotation.replay for m in got) == [0, 1, 2]
    assert {m.args()[IN_NELEMS_KEY] for m in got} == {2 * N}


def test_the_merge_shows_each_replayed_all_reduce_with_its_replay(tmp_path: Path) -> None:
    """As a user runs it: merge the graph run's directory, then read the kernels of the .pftrace."""
    inputs = tmp_path / "graph"
    shutil.copytree(FIXTURES / "graph", inputs)
    out = tmp_path / "merged.pftrace"
    result = merge(inputs, out)
    assert validate_file(out) == []
    # The step's all_gather copy and the functional all_reduce's copy are not placed: the user is told.
    assert any(n.startswith("rank 0: capture 0: 2 copy/memset node(s)") for n in result.notices), result.notices
    # Replays carry capture-time Seqs (30, 33, 35 on default_pg: the all_gather between them left only a
    # copy, the broadcast nothing, Seq 34 ran before the profiler): no Seq went missing in the window.
    assert len(matched(result)) == 12  # 3 x 3 of the step's, 3 of the single one: all analyzed
    assert not [f for f in result.analysis.findings if f.kind == "seq_gap"], result.analysis.findings
    parsed = read(out)
    replayed = sorted((s.args[ANN_REPLAY], s.args[PG_DESC_KEY], s.args[IN_NELEMS_KEY], s.args[SEQ_KEY])
                      for s in parsed.slices
                      if s.args.get(COLLECTIVE_NAME_KEY) == "allreduce" and "onerank" in s.name.lower())
    _, sidecar = _load("graph")
    step, single = _captures(sidecar)
    size = {"default_pg": N, "tp": N // 2}
    step_calls = [(c.annotation.pg_desc, c.annotation.seq) for c in step.collectives
                  if c.annotation.collective_name == "allreduce"]
    expected = sorted([(r, desc, size[desc], seq) for r in (1, 2, 3) for desc, seq in step_calls]
                      + [(r, "default_pg", 2 * N, single.collectives[0].annotation.seq) for r in (0, 1, 2)])
    assert replayed == expected


def test_the_eager_step_is_one_collective_per_call(tmp_path: Path) -> None:
    """The eager run merged as a user runs it: each recorded call is one collective, on its kernel where it
    launched one (by identity), else on its c10d op; never a second copy beside its kernel."""
    inputs = tmp_path / "eager"
    shutil.copytree(FIXTURES / "eager", inputs)
    out = tmp_path / "merged.pftrace"
    result = merge(inputs, out)
    assert validate_file(out) == []
    trace, sidecar = _load("eager")
    # Ground truth from the raw trace: the kernels the profiler gave collective metadata, in start order.
    kernels = sorted((e["ts"], e["args"][PG_DESC_KEY]) for e in trace["traceEvents"]
                     if e.get("cat") == "kernel" and COLLECTIVE_NAME_KEY in e.get("args", {}))
    assert [desc for _, desc in kernels] == ["default_pg", "tp", "default_pg"]  # the step's, tp's, funcol's
    found = sorted(((i.arg(PG_DESC_KEY), i.seq, i.collective, i.source, i.arg(ANN_SEQ_FROM))
                    for m in matched(result) for i in m.members.values()), key=str)
    recorded = {(c.annotation.pg_desc, c.annotation.seq): c.annotation.collective_name for c in sidecar.collectives}
    # all_reduce and tp's all_reduce launched kernels; the one-rank all_gather only a copy, the broadcast nothing.
    launched = {"allreduce"}
    expected = sorted([(desc, seq, name, "nccl-kernel" if name in launched else CPU_OP_SOURCE, None)
                       for (desc, seq), name in recorded.items()]
                      # the functional all_reduce passes no Python wrapper: its kernel alone, Seq by kernel order
                      + [("default_pg", 1, "allreduce", "nccl-kernel", "kernel order")], key=str)
    assert found == expected
    base = base_ns(trace)
    timed = sorted(i.start_ns for m in matched(result) for i in m.members.values()
                   if i.source == "nccl-kernel")
    assert timed == sorted(base + round(ts * 1000) for ts, _ in kernels)
    assert not [f for f in result.analysis.findings if f.kind == "seq_gap"], result.analysis.findings
    assert any("2 collective instances are timed by their CPU op" in n for n in result.notices), result.notices
