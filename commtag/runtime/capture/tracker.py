"""The capture tracker: which graph nodes each collective created, and the replays of each graph.

A call's nodes are those between the capture graph's node counts before and
after it (the driver lists a graph's nodes in creation order; launch/gpu_check.py
checks this on a real GPU): two constant-time queries per collective, and one
listing per capture, however many nodes the graph already holds. What a capture and its replays leave is
kept as plain values; the sidecar's models are built when it is written.
:mod:`commtag.runtime.capture` holds the process's one tracker.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from commtag.runtime.failopen import log_once
from commtag.runtime.capture.graph_api import GraphAPI
from commtag.runtime.capture.torch_marks import TorchMarks
from commtag.schema import (
    CapturedCollective,
    CollectiveAnnotation,
    GraphCapture,
    GraphNodeRecord,
    GraphReplay,
)
from commtag.vocab import KERNEL_NODE_TYPE, TORCH_MARK_KEY

#: Replays kept per capture (newest win); the sidecar writer keeps those in the profiled window.
MAX_REPLAYS_PER_CAPTURE = 65536

#: Open captures by CUDA capture sequence id: mutated in place, never rebound; read by the
#: collectives' idle path (empty: no capture can be active) and by before_collective.
OPEN_CAPTURES: dict[int, "OpenCapture"] = {}

#: A resolved node: (creation index, node type, kernel name, tools id, local id).
_Node = tuple[int, str, str, Optional[int], Optional[int]]


@dataclass
class _PendingCollective:
    #: The annotation, or its fields by name (a patched call's: built when the sidecar is written).
    annotation: CollectiveAnnotation | dict[str, Any]
    #: Creation indices of the nodes the call added: [first, end).
    first: int
    end: int
    tid: int
    reduce_op: Optional[str]
    source: str
    #: Its mark in torch's annotation registry, where torch recorded the capture.
    torch_mark: Optional[str] = None
    #: (the call as described, its Seq): what commtag's flight recorder keeps of each replay of it.
    kept: Optional[tuple[Any, int]] = None


@dataclass
class OpenCapture:
    capture_id: int
    sequence_id: int
    graph: Any
    start_ns: int
    owner_key: int
    collectives: list[_PendingCollective] = field(default_factory=list)
    interceptor: Any = None
    #: Collectives handed to torch's mark_kernels so far (numbers their marks).
    marked: int = 0
    #: torch scopes still open, by id of their token (closed at capture end if a call raised).
    scopes: dict[int, Any] = field(default_factory=dict)


@dataclass
class CollectiveToken:
    """What :func:`before_collective` hands the wrapper while a capture is open."""

    capture: OpenCapture
    #: The capture graph's node count when the call began: the index of its first node.
    first: int
    reduce_op: Optional[str] = None
    source: str = "python"
    #: The annotation handed to torch's mark_kernels for this call, if any.
    torch_annotation: Optional[dict] = None
    #: (the call as described, its Seq), set by whoever records it: kept with the capture for the
    #: flight recorder's entries of its replays.
    kept: Optional[tuple[Any, int]] = None


@dataclass
class _Finished:
    """A finished capture as its end read it, and its replays as (index, start_ns, end_ns, tid)."""

    capture_id: int
    graph_id: Optional[int]
    exec_graph_id: Optional[int]
    start_ns: int
    end_ns: int
    total_nodes: int
    collectives: list[tuple[_PendingCollective, list[_Node]]]
    replays: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_REPLAYS_PER_CAPTURE))
    replay_count: int = 0
    #: Its model without replays, built on first use.
    _record: Optional[GraphCapture] = None

    def record(self) -> GraphCapture:
        """The capture as the sidecar holds it (no replays)."""
        if self._record is None:
            self._record = GraphCapture(
                capture_id=self.capture_id, graph_id=self.graph_id, exec_graph_id=self.exec_graph_id,
                start_ns=self.start_ns, end_ns=self.end_ns, total_nodes=self.total_nodes,
                collectives=[_captured(self.capture_id, pending, nodes) for pending, nodes in self.collectives],
            )
        return self._record


def _captured(capture_id: int, pending: _PendingCollective, nodes: list[_Node]) -> CapturedCollective:
    annotation = pending.annotation
    if not isinstance(annotation, CollectiveAnnotation):
        annotation = CollectiveAnnotation.model_construct(**annotation)  # a patched call's fields, as eager
    return CapturedCollective(
        annotation=annotation.model_copy(update={"capture_id": capture_id, "replay": None}),
        nodes=[GraphNodeRecord(index=index, node_type=kind, kernel_name=name, tools_id=tools_id, local_id=local_id)
               for index, kind, name, tools_id, local_id in nodes],
        tid=pending.tid, reduce_op=pending.reduce_op, source=pending.source, torch_mark=pending.torch_mark,
    )


def _field(annotation: CollectiveAnnotation | dict[str, Any], name: str) -> Any:
    return annotation[name] if isinstance(annotation, dict) else getattr(annotation, name)


class CaptureTracker:
    """Capture bookkeeping over a :class:`GraphAPI`; one per process in production, one per test in tests."""

    def __init__(self, api: GraphAPI, clock: Callable[[], int] = time.time_ns,
                 marks: Optional[TorchMarks] = None) -> None:
        self.api = api
        self.clock = clock
        #: torch's own graph annotations (torch 2.14+), or None: see commtag.runtime.capture.torch_marks.
        self.marks = marks
        self._lock = threading.Lock()
        self._next_id = 0
        self._by_owner: dict[int, OpenCapture] = {}
        self._finished: dict[int, _Finished] = {}
        #: id(CUDAGraph) -> capture id of its last finished capture: read without the lock by
        #: the replay hook on every replay, written under it.
        self.owner_captures: dict[int, int] = {}
        self._tls = threading.local()

    # ------------------------------------------------------------------ capture lifetime

    def begin_capture(self, owner: object, stream: int) -> Optional[OpenCapture]:
        """Register the capture ``owner`` (a CUDAGraph) just began on ``stream``."""
        info = self.api.capture_info(stream)
        if info is None:
            return None
        sequence_id, graph = info
        with self._lock:
            capture = OpenCapture(self._next_id, sequence_id, graph, self.clock(), id(owner))
            self._next_id += 1
            self._by_owner[id(owner)] = capture
            OPEN_CAPTURES[sequence_id] = capture
        return capture

    def end_capture(self, owner: object, finish: Callable[[], None], exec_handle: Callable[[], int]) -> Optional[int]:
        """Resolve the capture of ``owner``, run ``finish`` (the real capture_end), then store it; its id.

        Everything is read from the capture graph before ``finish``: torch
        destroys it after instantiation unless the graph keeps it.
        """
        with self._lock:
            capture = self._by_owner.pop(id(owner), None)
            if capture is not None:
                OPEN_CAPTURES.pop(capture.sequence_id, None)
        if capture is None:
            finish()
            return None
        self._close_scopes(capture)
        try:
            resolved = self._resolve(capture)
        except Exception as exc:  # noqa: BLE001 - fail open: capture proceeds, this graph stays unannotated
            log_once("resolving a CUDA-graph capture", exc)
            resolved = None
        finish()  # exceptions from the real capture_end propagate; the record is dropped with them
        if resolved is None:
            return None
        try:
            exec_id = self.api.exec_graph_id(exec_handle())
        except Exception as exc:  # noqa: BLE001 - fail open: the replay stays unlinked, the job runs on
            log_once("reading the exec graph id", exc)
            exec_id = None
        resolved.exec_graph_id = exec_id
        resolved.end_ns = max(self.clock(), resolved.start_ns)
        with self._lock:
            self._finished[resolved.capture_id] = resolved
            self.owner_captures[id(owner)] = resolved.capture_id
        return resolved.capture_id

    def open_capture(self, owner: object) -> Optional[OpenCapture]:
        """The capture ``owner`` (a CUDAGraph) has open, if commtag tracks one."""
        return self._by_owner.get(id(owner))

    def abandon_capture(self, capture: OpenCapture) -> None:
        """Forget ``capture``, still open (commtag is being uninstalled)."""
        with self._lock:
            if self._by_owner.get(capture.owner_key) is capture:
                del self._by_owner[capture.owner_key]
            OPEN_CAPTURES.pop(capture.sequence_id, None)
        self._close_scopes(capture)

    def _close_scopes(self, capture: OpenCapture) -> None:
        """Leave torch scopes of calls that raised before their end (torch keeps a region per thread)."""
        while capture.scopes and self.marks is not None:
            self.marks.close(capture.scopes.popitem()[1])

    def _resolve(self, capture: OpenCapture) -> _Finished:
        """Read what the graph says of each collective's nodes now: torch destroys it after instantiation."""
        api = self.api
        final = api.nodes(capture.graph)
        collectives = []
        for pending in capture.collectives:
            nodes: list[_Node] = []
            for index in range(pending.first, min(pending.end, len(final))):
                node = final[index]
                kind = api.node_type(node)
                nodes.append((index, kind, api.kernel_name(node) if kind == KERNEL_NODE_TYPE else "",
                              api.tools_id(node), api.local_id(node)))
            collectives.append((pending, nodes))
        return _Finished(capture.capture_id, api.graph_id(capture.graph), None, capture.start_ns, capture.start_ns,
                         len(final), collectives)

    # ------------------------------------------------------------------ collectives

    def begin_collective(self, stream: int, source: str = "python", marked: bool = True) -> Optional[CollectiveToken]:
        """Snapshot the graph ``stream`` captures into, or None when it captures nothing we track
        (``marked``: open a torch mark_kernels scope for it, where torch records marks)."""
        info = self.api.capture_info(stream)
        if info is None:
            return None
        capture = OPEN_CAPTURES.get(info[0])
        if capture is None:
            return None
        token = CollectiveToken(capture, self.api.node_count(capture.graph), source=source)
        if self.marks is not None and marked:
            self._open_scope(token, self.marks)
        return token

    def _open_scope(self, token: CollectiveToken, marks: TorchMarks) -> None:
        """Hand the call to torch's mark_kernels, last before it runs (see commtag.runtime.capture.torch_marks)."""
        capture = token.capture
        with self._lock:
            mark = f"{capture.capture_id}.{capture.marked}"
            capture.marked += 1
        annotation = marks.annotation(mark)
        scope = marks.open(annotation)
        if scope is not None:
            token.torch_annotation = annotation
            capture.scopes[id(token)] = scope

    def end_collective(self, token: CollectiveToken, annotation: CollectiveAnnotation | dict[str, Any]) -> None:
        """Keep the nodes added since ``token`` was taken, with the collective's annotation (or its fields)."""
        capture = token.capture
        mark = None
        scope = capture.scopes.pop(id(token), None)
        # A scope is only opened with marks, and the token then holds its annotation.
        if scope is not None and self.marks is not None and token.torch_annotation is not None:
            mark = token.torch_annotation[TORCH_MARK_KEY]
            try:
                self.marks.name_group(token.torch_annotation, _field(annotation, "pg_name"), _field(annotation, "pg_desc"),
                                      _field(annotation, "lane_id"))
            except Exception as exc:  # noqa: BLE001 - the mark alone still joins the call
                log_once("naming a collective's group for torch", exc)
            self.marks.close(scope)
        if OPEN_CAPTURES.get(capture.sequence_id) is not capture:
            return  # the capture ended (or failed) in between
        end = self.api.node_count(capture.graph)
        capture.collectives.append(
            _PendingCollective(annotation, token.first, end, threading.get_native_id(), token.reduce_op, token.source, mark,
                               token.kept)
        )

    # ------------------------------------------------------------------ wrapper nesting (read by c10d_ops)

    @property
    def wrapper_token(self) -> Optional[CollectiveToken]:
        """The token of a Python wrapper running on this thread, if any."""
        return getattr(self._tls, "token", None)

    def set_wrapper_token(self, token: Optional[CollectiveToken]) -> None:
        self._tls.token = token

    # ------------------------------------------------------------------ replays and results

    def record_replay(self, owner: object, start_ns: int, end_ns: int, tid: int) -> None:
        """Log one replay of ``owner``'s graph (index = replays since its capture)."""
        capture_id = self.owner_captures.get(id(owner))
        if capture_id is None:
            return
        finished = self._finished[capture_id]
        finished.replays.append((finished.replay_count, start_ns, end_ns, tid))
        finished.replay_count += 1

    def replayed_calls(self, owner: object) -> Optional[tuple[int, list[tuple[Any, int]]]]:
        """For a replay of ``owner``'s graph about to start: the index it will get and its captured
        collectives as described at capture, with their Seq (None: no capture of it holds one)."""
        capture_id = self.owner_captures.get(id(owner))
        if capture_id is None:
            return None
        finished = self._finished[capture_id]
        calls = [pending.kept for pending, _ in finished.collectives if pending.kept is not None]
        return (finished.replay_count, calls) if calls else None

    def forget_owner(self, owner: object) -> None:
        """``owner`` was reset: its next replays belong to whatever it captures next."""
        with self._lock:
            self.owner_captures.pop(id(owner), None)

    def captures(self, since_ns: Optional[int] = None, until_ns: Optional[int] = None) -> list[GraphCapture]:
        """Every finished capture, with its replays that overlap [since_ns, until_ns]."""
        with self._lock:
            finished = list(self._finished.values())
        torch_ids = self._torch_tools_ids(finished)
        result = []
        for item in finished:
            try:
                replays = [
                    GraphReplay(index=index, start_ns=start, end_ns=end, tid=tid)
                    for index, start, end, tid in list(item.replays)
                    if (since_ns is None or end >= since_ns) and (until_ns is None or start <= until_ns)
                ]
                record = item.record()
            except Exception as exc:  # noqa: BLE001 - fail open: this capture stays out of the sidecar, the others go in
                log_once(f"writing down CUDA-graph capture {item.capture_id}", exc)
                continue
            if torch_ids:
                record = record.model_copy(update={"collectives": [
                    c.model_copy(update={"torch_tools_ids": torch_ids[c.torch_mark]}) if c.torch_mark in torch_ids else c
                    for c in record.collectives]})
            result.append(record.model_copy(update={"replays": replays}))
        return result

    def _torch_tools_ids(self, finished: list[_Finished]) -> dict[str, list[int]]:
        """The tools ids torch's registry holds now for each commtag mark (exec-graph keyed once
        the graphs are instantiated); {} where no capture was marked."""
        if self.marks is None or not any(pending.torch_mark for f in finished for pending, _ in f.collectives):
            return {}
        try:
            return self.marks.tools_ids()
        except Exception as exc:  # noqa: BLE001 - fail open: the sidecar goes without torch's tools ids
            log_once("reading torch's CUDA-graph annotations", exc)
            return {}
