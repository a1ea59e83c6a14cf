"""Graphed collectives in traces torch's own exporter annotated (torch 2.15+) merge once, on commtag's lanes.

tests/data/torch-traces/graphs-torch-2.15/ holds a graphed 2-rank NCCL job (three captured
collectives on two groups, the graph replayed twice) written by torch 2.15's
``export_chrome_trace`` with the annotations commtag's runtime hands torch's
``mark_kernels`` (launch/torch_graph_traces.py; no GPU here, so the replays are described
to the exporter, not run). The merge runs on CI's torch, as a user's merge machine would.

What a user checks: each call is one slice on its group's lane on each rank, paired across
the ranks, once per replay; the group appears once per rank (commtag's lane, never also
torch's lane of that name); every event of every trace is written or accounted for.
"""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from pathlib import Path
from typing import Optional

import orjson
import pytest

from merging import merge
from commtag.runtime.capture import CaptureTracker
from commtag.runtime.capture.torch_marks import TorchMarks
from pftrace_reader import lane_of, read
from test_capture_bookkeeping import AG, AR, MAIN, NCCL, FakeGraphAPI, annotation_of
from test_merge_accounting import assert_accounted

TRACES = Path(__file__).resolve().parent / "data" / "torch-traces"
DATA = TRACES / "graphs-torch-2.15"
#: Folders, and where each NCCL kernel ends up: "ran" on the stream it ran on; "moved" where
#: torch 2.14's post-processor put it (it keeps no record of the stream it ran on).
VARIANTS = {"graph-lanes-all": "ran", "graph-lanes-none": "ran", "plain": "ran", "graph-lanes-all-wrapper": "ran",
            "../graphs-torch-2.14/annotate-tool": "moved"}
#: The lanes torch named by "Process Group Description" in the graph-lanes-all traces.
TORCH_GROUP_LANES = {"default_pg", "tp"}
COMMTAG_LANES = {"PG 0 (default_pg) [0, 1]", "PG 1 (tp) [0, 1]"}


def _trace(folder: Path, rank: int = 0) -> dict:
    return orjson.loads(gzip.decompress((folder / f"rank{rank}.step0.pt.trace.json.gz").read_bytes()))


def test_torch_laid_the_graphed_collectives_out_per_group() -> None:
    """The input is what torch 2.15 writes with graph_lanes="all": its own group lanes."""
    trace = _trace(DATA / "graph-lanes-all")
    assert trace["cudaGraphInlineAnnotated"] is True
    lanes = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == 0}
    moved = [e for e in trace["traceEvents"] if "original_stream" in e.get("args", {})]
    assert {lanes[e["tid"]] for e in moved if "Process Group Description" in e["args"]} == TORCH_GROUP_LANES
    assert {e["args"]["original_stream"] for e in moved} == {20, 21, 22}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.split("/")[-1])
def test_graphed_collectives_are_one_slice_per_call_rank_and_replay_on_one_lane_per_group(
        variant: str, tmp_path: Path) -> None:
    folder = DATA / variant
    out = tmp_path / "merged.pftrace"
    result = merge(folder, out, progress=False)
    assert_accounted([folder], out, result)

    # Three calls, two replays, two ranks: twelve instances, each (call, replay) on both ranks once.
    halves = Counter((i.pg_uid, i.seq, i.replay, i.rank) for i in result.instances)
    assert len(result.instances) == 12 and set(halves.values()) == {1}
    calls = Counter((i.collective, i.seq, i.replay) for i in result.instances)
    assert calls == {(name, seq, replay): 2 for name, seq in (("allreduce", 1), ("allreduce", 2), ("_allgather_base", 1))
                     for replay in (0, 1)}
    assert {i.source for i in result.instances} == {"graph-replay"}

    parsed = read(out)
    rows: dict[int, set[tuple[str, str]]] = {0: set(), 1: set()}
    nccl = []
    for s in parsed.slices:
        where = lane_of(parsed, s)
        if where is not None:  # a member row of the process-group view
            rows[where[0]].add(("group view", where[1]))
            continue
        path = parsed.name_path(s.track)
        rows[int(path[0].split()[1])].add((path[1], path[2]))
        if s.name.startswith("nccl"):
            nccl.append((path, s.args))
    for rank, seen in rows.items():
        assert {lane for group, lane in seen if group == "group view"} >= COMMTAG_LANES, (rank, seen)
        assert not {lane for _, lane in seen} & TORCH_GROUP_LANES, (rank, seen)  # no second lane of a group
    # The NCCL kernels ran on streams 20 and 21 and are drawn there, each matched by torch's annotation
    # where torch baked it in, else by the tools ids torch's registry held.
    assert len(nccl) == 12
    method = "torch-tools-id" if variant == "plain" else "torch-annotation"
    for path, args in nccl:
        assert path[1:] == ["GPU 0", f"stream {args['stream']}"], path
        assert (args["stream"] in (20, 21)) == (VARIANTS[variant] == "ran"), path
        assert args["commtag match"] == method
        assert isinstance(args["Seq"], int)  # commtag's typed value, not the wrapper's text torch baked in
        if variant.startswith("graph-lanes-all"):
            assert args["commtag torch lane"] not in (20, 21)  # where torch had moved it


def test_replayed_kernels_with_baked_eager_keys_are_never_taken_for_eager_calls(tmp_path: Path) -> None:
    """Without its sidecar, a replayed kernel whose baked annotation repeats its capture's Seq on
    every replay must not become one call per replay with the same Seq."""
    src = DATA / "graph-lanes-all-wrapper"
    for trace in src.glob("*.pt.trace.json.gz"):
        shutil.copy(trace, tmp_path / trace.name)
    out = tmp_path / "merged.pftrace"
    result = merge(tmp_path, out, progress=False)
    assert_accounted([tmp_path], out, result)
    assert result.instances and not [i for i in result.instances if not i.pg_uid.startswith("unattributed")]
    for rank in (0, 1):
        keys = Counter((i.pg_uid, i.seq) for i in result.instances if i.rank == rank)
        assert set(keys.values()) == {1}


# -- the runtime half: commtag's scopes in torch's registry ----------------------------------


class TorchRegistry:
    """What torch's mark_kernels does with a scope during capture: the nodes made inside it
    get its annotation in the registry under their tools id, the dict read at capture end."""

    def __init__(self, api: FakeGraphAPI, fail: bool = False) -> None:
        self.api = api
        self.fail = fail
        self.pending: list[tuple[dict, list[int]]] = []
        self.registry: dict[int, list[dict]] = {}
        self.kwargs: list[dict] = []
        self.open = 0

    def mark_kernels(self, annotation: dict, *, backward: bool = True):  # torch 2.14+'s signature
        registry = self
        kwargs = {"backward": backward}

        class Scope:
            def __enter__(self) -> None:
                if registry.fail:
                    raise RuntimeError("cudaErrorCallRequiresNewerDriver")
                registry.kwargs.append(kwargs)
                registry.open += 1
                graph = next(g for _, g in registry.api.capturing.values())
                self.graph, self.before = graph, len(graph.nodes)

            def __exit__(self, *exc: object) -> None:
                registry.open -= 1
                made = range(self.before, len(self.graph.nodes))
                registry.pending.append((annotation, [(self.graph.graph_id << 32) | i for i in made]))

        return Scope()

    def resolve(self, exec_graph_id: int) -> None:
        """Capture end and instantiation: re-keyed to the exec graph, one merged dict per node."""
        for annotation, ids in self.pending:
            for tools_id in ids:
                self.registry.setdefault((exec_graph_id << 32) | (tools_id & 0xFFFFFFFF), []).append(dict(annotation))
        self.pending.clear()

    def get_kernel_annotations(self) -> dict[int, list[dict]]:
        return self.registry


def _capture(api: FakeGraphAPI, tracker: CaptureTracker, torch_side: Optional[TorchRegistry]) -> None:
    owner = object()
    api.begin(MAIN)
    tracker.begin_capture(owner, MAIN)
    api.launch(MAIN, name="gemm")                        # node 0, marked by no one
    token = tracker.begin_collective(MAIN)
    api.join(NCCL, MAIN)
    api.launch(NCCL, name=AR)                            # node 1
    tracker.end_collective(token, annotation_of("allreduce", seq=5))
    token = tracker.begin_collective(MAIN)
    api.launch(NCCL, name=AG)                            # node 2
    api.launch(NCCL, kind="memcpy")                      # node 3
    # A patched Python call hands over its annotation's fields, not a model (built when the sidecar is written).
    tracker.end_collective(token, annotation_of("_allgather_base", seq=6).model_dump())
    tracker.begin_collective(MAIN)                       # a call that raised: never ended
    tracker.end_capture(owner, lambda: api.end(MAIN, 0xE0), lambda: 0xE0)
    if torch_side is not None:
        torch_side.resolve(api.exec_ids[0xE0])


def test_captured_collectives_are_marked_in_torchs_registry_and_the_sidecar_keeps_its_ids() -> None:
    api = FakeGraphAPI(tools_ids=True)
    torch_side = TorchRegistry(api)
    tracker = CaptureTracker(api, marks=TorchMarks(torch_side.mark_kernels, torch_side.get_kernel_annotations))
    _capture(api, tracker, torch_side)
    # Only the collective's own nodes, forward only; the unfinished call's scope is closed at capture end.
    assert torch_side.kwargs == [{"backward": False}] * 3 and torch_side.open == 0
    exec_id = api.exec_ids[0xE0]
    marks = {ann["commtag graph mark"]: (key, ann) for key, anns in torch_side.registry.items() for ann in anns}
    assert sorted(marks) == ["0.0", "0.1"]
    key, ann = marks["0.0"]
    assert key == (exec_id << 32) | 1
    # The group, as torch names and numbers a lane: its description and commtag's lane id.
    assert ann == {"commtag graph mark": "0.0", "Process Group Name": "0",
                   "Process Group Description": "default_pg", "stream": 77}
    (record,) = tracker.captures()
    ar, ag = record.collectives
    assert (ar.torch_mark, ar.torch_tools_ids) == ("0.0", [(exec_id << 32) | 1])
    assert (ag.torch_mark, ag.torch_tools_ids) == ("0.1", [(exec_id << 32) | 2, (exec_id << 32) | 3])


def test_a_torch_that_refuses_the_scope_leaves_capture_bookkeeping_as_it_was() -> None:
    api = FakeGraphAPI(tools_ids=True)
    torch_side = TorchRegistry(api, fail=True)
    tracker = CaptureTracker(api, marks=TorchMarks(torch_side.mark_kernels, torch_side.get_kernel_annotations))
    _capture(api, tracker, None)
    (record,) = tracker.captures()
    assert [(c.annotation.seq, c.torch_mark, c.torch_tools_ids) for c in record.collectives] == [
        (5, None, None), (6, None, None)]
    assert [n.index for n in record.collectives[1].nodes] == [2, 3]


def test_torchs_own_module_takes_commtags_scope_and_its_registry_gives_the_marks_back() -> None:
    """Over the installed torch's real graph_annotations (2.14+; the compat run has them):
    its mark_kernels accepts commtag's scope (a no-op here: no capture records), and its
    registry, whatever its shape in that torch, gives back each mark's tools ids."""
    module = pytest.importorskip("torch.cuda.graph_annotations", reason="torch before 2.14 has no public module")
    private = pytest.importorskip("torch.cuda._graph_annotations")
    marks = TorchMarks(module.mark_kernels, module.get_kernel_annotations)
    assert marks.scope_kwargs == {"backward": False}
    scope = marks.open(TorchMarks.annotation("3.0"))
    assert scope is not None
    TorchMarks.close(scope)
    tools_id = (41 << 32) | 7
    if hasattr(private, "record_node_annotation"):  # 2.15: one merged dict per node
        private.record_node_annotation(tools_id, {"commtag graph mark": "3.0", "name": "fwd"})
    else:  # 2.14: a list of dicts per node
        private._kernel_annotations[tools_id].append({"commtag graph mark": "3.0"})
    try:
        assert marks.tools_ids() == {"3.0": [tools_id]}
    finally:
        (getattr(private, "_reset_kernel_annotations", None) or private.clear_kernel_annotations)()
