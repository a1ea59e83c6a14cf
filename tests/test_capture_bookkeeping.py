"""Capture bookkeeping over a synthetic CUDA graph (no GPU here).

The tracker only talks to a GraphAPI; these tests give it a small in-memory
graph that behaves like the driver's (opaque node handles, creation-ordered
node list, capture sequence ids, tools ids only on a "13.1" driver), issue
collectives into it the way NCCL does (kernels added by another stream of
the same capture), and check what a rank's sidecar would receive.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Optional

import pytest
import torch

from commtag.runtime import capture
from commtag.runtime.capture import c10d_ops
from commtag.runtime.install import hooks
from commtag.runtime.capture import CaptureTracker
from commtag.schema import CollectiveAnnotation, GraphCapture


class FakeGraph:
    def __init__(self, graph_id: int) -> None:
        self.graph_id = graph_id
        self.nodes: list[tuple[int, str, str]] = []  # (handle, type, kernel name) in creation order


class FakeGraphAPI:
    """An in-memory stand-in for the driver: several streams may capture into one graph."""

    def __init__(self, tools_ids: bool = False) -> None:
        self.tools_ids = tools_ids
        self._handles = itertools.count(0x7F00_0000_1000, 0x40)  # addresses, unrelated to creation order
        self._seq = itertools.count(1)
        self._graph_ids = itertools.count(11)
        self.capturing: dict[int, tuple[int, FakeGraph]] = {}
        self.exec_ids: dict[int, int] = {}
        self.calls = 0

    # driver-side actions the tests perform
    def begin(self, stream: int) -> FakeGraph:
        graph = FakeGraph(next(self._graph_ids))
        self.capturing[stream] = (next(self._seq), graph)
        return graph

    def join(self, stream: int, other: int) -> None:
        """``stream`` waits on an event of capturing ``other``: it joins the same capture."""
        self.capturing[stream] = self.capturing[other]

    def launch(self, stream: int, kind: str = "kernel", name: str = "") -> int:
        graph = self.capturing[stream][1]
        handle = next(self._handles)
        graph.nodes.append((handle, kind, name))
        return handle

    def end(self, stream: int, exec_handle: int) -> None:
        _, graph = self.capturing.pop(stream)
        for other, (_, g) in list(self.capturing.items()):
            if g is graph:
                del self.capturing[other]
        self.exec_ids[exec_handle] = graph.graph_id + 100

    # GraphAPI
    def capture_info(self, stream: int) -> Optional[tuple[int, Any]]:
        self.calls += 1
        return self.capturing.get(stream)

    def nodes(self, graph: FakeGraph) -> list[int]:
        return [h for h, _, _ in graph.nodes]

    def node_count(self, graph: FakeGraph) -> int:
        return len(graph.nodes)

    def _node(self, handle: int) -> tuple[FakeGraph, int]:
        for _, graph in self.capturing.values():
            for i, (h, _, _) in enumerate(graph.nodes):
                if h == handle:
                    return graph, i
        raise KeyError(handle)

    def node_type(self, node: int) -> str:
        graph, i = self._node(node)
        return graph.nodes[i][1]

    def kernel_name(self, node: int) -> str:
        graph, i = self._node(node)
        return graph.nodes[i][2]

    def tools_id(self, node: int) -> Optional[int]:
        if not self.tools_ids:
            return None
        graph, i = self._node(node)
        return (graph.graph_id << 32) | i

    def local_id(self, node: int) -> Optional[int]:
        return self._node(node)[1] if self.tools_ids else None

    def graph_id(self, graph: FakeGraph) -> Optional[int]:
        return graph.graph_id if self.tools_ids else None

    def exec_graph_id(self, exec_handle: int) -> Optional[int]:
        return self.exec_ids.get(exec_handle) if self.tools_ids else None


def annotation_of(name: str = "allreduce", seq: int = 1, dtype: str = "Float", n: int = 1024) -> CollectiveAnnotation:
    return CollectiveAnnotation(
        collective_name=name, in_msg_nelems=n, out_msg_nelems=n, group_size=2, dtype=dtype,
        pg_name="0", pg_desc="default_pg", pg_ranks="[0, 1]", rank=0, seq=seq,
        lane_id=77, lane_name="PG 0 (default_pg) [0, 1]", pg_uid="0:abc",
    )


MAIN, NCCL = 0x1000, 0x2000
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
AG = "ncclDevKernel_AllGather_RING_LL"


def _capture_two_collectives(api: FakeGraphAPI, tracker: CaptureTracker, owner: object) -> GraphCapture:
    capture_id = _capture_two(api, tracker, owner)
    (record,) = [c for c in tracker.captures() if c.capture_id == capture_id]
    return record


def _capture_two(api: FakeGraphAPI, tracker: CaptureTracker, owner: object) -> int:
    api.begin(MAIN)
    assert tracker.begin_capture(owner, MAIN) is not None
    api.launch(MAIN, name="gemm")                 # node 0
    token = tracker.begin_collective(MAIN)
    api.join(NCCL, MAIN)
    api.launch(NCCL, name=AR)                     # node 1, on NCCL's stream
    tracker.end_collective(token, annotation_of("allreduce", seq=5))
    api.launch(MAIN, name="relu")                 # node 2
    api.launch(MAIN, kind="memset")               # node 3
    token = tracker.begin_collective(MAIN)
    api.launch(NCCL, name=AG)                     # node 4
    api.launch(NCCL, kind="memcpy")               # node 5
    tracker.end_collective(token, annotation_of("_allgather_base", seq=6))
    capture_id = tracker.end_capture(owner, lambda: api.end(MAIN, 0xE0), lambda: 0xE0)
    assert capture_id is not None
    return capture_id


def test_a_capture_whose_record_cannot_be_written_is_left_out_alone(caplog: pytest.LogCaptureFixture) -> None:
    """Records are built when the sidecar is written: one that fails validation costs only itself."""

    class BadToolsId(FakeGraphAPI):
        def tools_id(self, node: int) -> Optional[int]:
            graph, _ = self._node(node)
            return -5 if graph.graph_id == 12 else super().tools_id(node)

    api = BadToolsId(tools_ids=True)
    tracker = CaptureTracker(api)
    good = _capture_two(api, tracker, object())  # graph 11
    _capture_two(api, tracker, object())         # graph 12: a tools id pydantic refuses
    assert [c.capture_id for c in tracker.captures()] == [good]
    assert "writing down CUDA-graph capture 1" in caplog.text


def test_nodes_of_each_collective_get_creation_index_type_and_name() -> None:
    api = FakeGraphAPI()
    tracker = CaptureTracker(api)
    record = _capture_two_collectives(api, tracker, object())
    assert record.capture_id == 0 and record.total_nodes == 6
    first, second = record.collectives
    assert [(n.index, n.node_type, n.kernel_name) for n in first.nodes] == [(1, "kernel", AR)]
    assert [(n.index, n.node_type, n.kernel_name) for n in second.nodes] == [(4, "kernel", AG), (5, "memcpy", "")]
    # The stored annotation names its capture, and is not a replay yet.
    assert first.annotation.capture_id == 0 and first.annotation.replay is None
    assert (first.annotation.seq, second.annotation.seq) == (5, 6)
    # Driver 13.0: no tools ids, no graph ids.
    assert record.graph_id is None and record.exec_graph_id is None
    assert all(n.tools_id is None and n.local_id is None for c in record.collectives for n in c.nodes)
    # The record is what a sidecar carries: it must survive a JSON round trip.
    assert GraphCapture.model_validate_json(record.model_dump_json()) == record


def test_tools_ids_and_graph_ids_are_kept_where_the_driver_has_them() -> None:
    api = FakeGraphAPI(tools_ids=True)
    tracker = CaptureTracker(api)
    record = _capture_two_collectives(api, tracker, object())
    assert record.graph_id == 11 and record.exec_graph_id == 111
    ar, ag = record.collectives
    assert [n.tools_id for n in ar.nodes] == [(11 << 32) | 1]
    assert [n.local_id for n in ag.nodes] == [4, 5]


def test_captures_get_increasing_ids_and_replays_are_logged_per_graph() -> None:
    api = FakeGraphAPI()
    clock = iter(range(1_000, 10**9, 1_000))
    tracker = CaptureTracker(api, clock=lambda: next(clock))
    g1, g2 = object(), object()
    _capture_two_collectives(api, tracker, g1)
    _capture_two_collectives(api, tracker, g2)
    for start in (100, 200, 300):
        tracker.record_replay(g1, start, start + 5, tid=42)
    tracker.record_replay(g2, 400, 405, tid=42)
    by_id = {c.capture_id: c for c in tracker.captures()}
    assert sorted(by_id) == [0, 1]
    assert [(r.index, r.start_ns) for r in by_id[0].replays] == [(0, 100), (1, 200), (2, 300)]
    assert [(r.index, r.start_ns) for r in by_id[1].replays] == [(0, 400)]
    # The sidecar writer asks for its profiled window only; indices stay "since capture".
    window = {c.capture_id: c for c in tracker.captures(since_ns=150, until_ns=350)}
    assert [r.index for r in window[0].replays] == [1, 2] and window[1].replays == []


def test_collectives_outside_a_tracked_capture_are_not_recorded() -> None:
    api = FakeGraphAPI()
    tracker = CaptureTracker(api)
    assert tracker.begin_collective(MAIN) is None  # not capturing at all
    api.begin(0x3000)  # a capture commtag did not see begin (e.g. raw cudaStreamBeginCapture)
    assert tracker.begin_collective(0x3000) is None


def test_a_capture_that_fails_to_end_leaves_no_record_and_the_error_propagates() -> None:
    api = FakeGraphAPI()
    tracker = CaptureTracker(api)
    owner = object()
    api.begin(MAIN)
    tracker.begin_capture(owner, MAIN)

    def failing_end() -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="not permitted"):
        tracker.end_capture(owner, failing_end, lambda: 0)
    assert tracker.captures() == [] and not capture.OPEN_CAPTURES


def test_bookkeeping_errors_never_reach_the_collective(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(FakeGraphAPI):
        def node_count(self, graph: FakeGraph) -> int:
            raise RuntimeError("driver exploded")

    api = Broken()
    tracker = CaptureTracker(api)
    capture.use_tracker(tracker)
    try:
        api.begin(MAIN)
        tracker.begin_capture(object(), MAIN)
        original = capture.current_stream
        capture.current_stream = lambda: MAIN  # type: ignore[assignment]
        try:
            assert capture.before_collective() is None  # the snapshot failed: logged, not raised
            capture.after_collective(None, annotation_of())
        finally:
            capture.current_stream = original  # type: ignore[assignment]
        assert "driver exploded" in caplog.text
    finally:
        capture.OPEN_CAPTURES.clear()
        capture.use_tracker(None)


class _Owner:
    """Stands in for a torch.cuda.CUDAGraph: the hooks only need identity and raw_cuda_graph_exec."""

    def raw_cuda_graph_exec(self) -> int:
        return 0xE1


def test_hooks_open_and_close_a_capture_and_push_operator_interception_only_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeGraphAPI()
    tracker = CaptureTracker(api)
    capture.use_tracker(tracker)
    monkeypatch.setattr(capture, "current_stream", lambda: MAIN)
    owner = _Owner()
    begin = hooks.capture_begin_hook(lambda self: api.begin(MAIN))
    end = hooks.capture_end_hook(lambda self: api.end(MAIN, 0xE1))
    replay = hooks.replay_hook(lambda self: "replayed")
    try:
        assert not capture.capture_active() and not c10d_ops.is_active()
        begin(owner)
        assert capture.capture_active() and c10d_ops.is_active()
        token = capture.before_collective()
        assert token is not None
        api.join(NCCL, MAIN)
        api.launch(NCCL, name=AR)
        capture.after_collective(token, annotation_of())
        end(owner)
        assert not capture.capture_active() and not c10d_ops.is_active()
        assert torch._C._len_torch_dispatch_stack() == 0
        assert capture.before_collective() is None
        assert replay(owner) == "replayed" and replay(owner) == "replayed"
        (record,) = capture.captures_snapshot()
        assert [n.kernel_name for n in record.collectives[0].nodes] == [AR]
        assert [r.index for r in record.replays] == [0, 1]
        assert all(r.tid == threading.get_native_id() for r in record.replays)
    finally:
        capture.OPEN_CAPTURES.clear()
        capture.use_tracker(None)


def _torch_graph_hooks() -> bool:
    from torch.cuda import graphs

    return hasattr(graphs, "register_graph_capture_start_hook")


def test_install_wraps_and_uninstall_restores_cudagraph_methods() -> None:
    """Where torch has no graph lifecycle hooks (before 2.14) all three methods are wrapped; where
    it has, only capture_end (torch skips its capture-end hook when ending fails), and the hooks
    are registered with torch; uninstall leaves torch as it was."""
    from torch.cuda import graphs
    from torch.cuda.graphs import CUDAGraph

    before = {name: CUDAGraph.__dict__.get(name) for name in ("capture_begin", "capture_end", "replay")}
    registries = [getattr(graphs, name) for name in ("_global_capture_start_hooks", "_global_replay_start_hooks",
                                                     "_global_replay_end_hooks") if hasattr(graphs, name)]
    registered = [dict(registry) for registry in registries]
    hooks.install()
    try:
        assert hooks.is_installed()
        wrapped = {name for name in before if CUDAGraph.__dict__.get(name) is not before[name]}
        assert wrapped == ({"capture_end"} if _torch_graph_hooks() else set(before))
        assert all(len(registry) == len(was) + 1 for registry, was in zip(registries, registered))
        hooks.install()  # idempotent
    finally:
        hooks.uninstall()
    assert {name: CUDAGraph.__dict__.get(name) for name in before} == before
    assert [dict(registry) for registry in registries] == registered
    assert not hooks.is_installed()


@pytest.mark.skipif(not _torch_graph_hooks(), reason="torch.cuda.graphs lifecycle hooks are torch 2.14+ "
                                                    "(CI's 2.13 keeps the wrapping path; the compat run covers this)")
def test_torch_graph_hooks_open_a_capture_and_log_its_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """On torch 2.14+ torch's own capture-start and replay hooks (run by torch's own dispatcher of
    global hooks, as CUDAGraph runs them) open the bookkeeping and log replays; capture_end is
    still the wrapped method."""
    from torch.cuda import graphs

    api = FakeGraphAPI()
    capture.use_tracker(CaptureTracker(api))
    monkeypatch.setattr(capture, "current_stream", lambda: MAIN)
    owner = _Owner()
    hooks.install()
    try:
        api.begin(MAIN)
        graphs._run_global_hooks(graphs._global_capture_start_hooks, owner)
        assert capture.capture_active() and c10d_ops.is_active()
        token = capture.before_collective()
        api.join(NCCL, MAIN)
        api.launch(NCCL, name=AR)
        capture.after_collective(token, annotation_of())
        hooks.capture_end_hook(lambda self: api.end(MAIN, 0xE1))(owner)
        assert not capture.capture_active() and not c10d_ops.is_active()
        for _ in range(2):
            graphs._run_global_hooks(graphs._global_replay_start_hooks, owner)
            graphs._run_global_hooks(graphs._global_replay_end_hooks, owner)
        (record,) = capture.captures_snapshot()
        assert [n.kernel_name for n in record.collectives[0].nodes] == [AR]
        assert [r.index for r in record.replays] == [0, 1]
    finally:
        hooks.uninstall()
        capture.OPEN_CAPTURES.clear()
        capture.use_tracker(None)
    # Uninstalled: torch's hooks are gone, and a replay logs nothing more.
    graphs._run_global_hooks(graphs._global_replay_start_hooks, owner)
    graphs._run_global_hooks(graphs._global_replay_end_hooks, owner)


def test_without_cuda_everything_is_a_silent_no_op() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    capture.reset_tracker()
    try:
        assert capture.get_tracker() is None
        assert capture.before_collective() is None
        assert capture.captures_snapshot() == []
    finally:
        capture.use_tracker(None)


def test_uninstall_during_a_capture_leaves_nothing_of_commtag_active() -> None:
    """A capture still open at uninstall(): its capture_end is torch's own from then on, so commtag
    forgets the capture and its operator interception goes inert, or every collective of the job
    would stay off the idle path and every operator of the thread would pass through the mode."""
    import commtag

    api = FakeGraphAPI()
    capture.use_tracker(CaptureTracker(api))
    opened = None
    commtag.install()
    try:
        owner = object()
        api.begin(7)
        opened = capture.tracker().begin_capture(owner, 7)
        opened.interceptor = c10d_ops.activate(hooks.TrackerSink(capture.tracker()))
        assert capture.capture_active() and c10d_ops.is_active()
        commtag.uninstall()
        assert not capture.capture_active()
        assert not c10d_ops.is_active()
        assert capture.tracker().open_capture(owner) is None
        # torch's own capture_end then closes the capture; commtag installed again starts clean.
        api.end(7, 0)
        commtag.install()
        assert not capture.capture_active()
    finally:
        commtag.uninstall()
        if opened is not None:
            c10d_ops.deactivate(opened.interceptor)
        capture.OPEN_CAPTURES.clear()
        capture.use_tracker(None)
