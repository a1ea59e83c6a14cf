"""A sidecar's CUDA-graph captures as the replay matcher reads them, and what it finds.

The replay log of each capture (:class:`ReplayLog`), the kernels captures
hold (:class:`CapturedKernels`), a trace's graph launches grouped into
replays (:func:`replays_of`) and the one rule for a replay's index
(:class:`ReplayIndex`); the matcher itself is :mod:`commtag.merge.rank.replays`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from commtag.vocab import (
    ANN_MATCH, CORRELATION_KEY, DEVICE_WORK_NODE_TYPES, GRAPH_ID_KEY, GRAPH_NODE_ID_KEY,
    KERNEL_NODE_TYPE, LAUNCH_CATEGORIES, LAUNCH_TOLERANCE_NS, NCCL_OPS_FOR, NODE_ID_MASK,
    base_name, is_graph_launch, kernel_row, parse_nccl_kernel,
)

if TYPE_CHECKING:  # pydantic models: only a sidecar brings captures, and it imports them
    from commtag.schema import CapturedCollective, CollectiveAnnotation, GraphCapture, GraphNodeRecord


#: Lower 32 bits of a "graph node id" minus this = the node's creation index (hypothesis 1).
NODE_ID_BASE = 0


class ReplayLog:
    """One capture's logged ``CUDAGraph.replay()`` calls on the trace's clock, searchable by time.

    Both joins ask it which replay a graph launch belongs to: the closest logged
    call on the launch's thread, at most :data:`~commtag.vocab.LAUNCH_TOLERANCE_NS`
    outside it (a linear scan per launch would be quadratic).
    """

    def __init__(self, capture: GraphCapture, offset_ns: int = 0) -> None:
        self.capture = capture
        ordered = sorted(capture.replays, key=lambda r: r.start_ns)
        self._starts = [r.start_ns + offset_ns for r in ordered]
        self._ends = [r.end_ns + offset_ns for r in ordered]
        self._tids = [r.tid for r in ordered]
        self._index = [r.index for r in ordered]
        #: Latest end among the replays up to each one: ascending, so bisectable.
        self._reach: list[int] = []
        for end in self._ends:
            self._reach.append(max(self._reach[-1], end) if self._reach else end)

    def near(self, at_ns: int, tid: object) -> list[tuple[int, int]]:
        """(distance in ns, replay index) of each logged replay within tolerance of a launch
        at ``at_ns`` on thread ``tid`` (a replay logged on another thread is not it)."""
        first = bisect.bisect_left(self._reach, at_ns - LAUNCH_TOLERANCE_NS)
        last = bisect.bisect_right(self._starts, at_ns + LAUNCH_TOLERANCE_NS)
        found = []
        for j in range(first, last):
            if self._tids[j] and tid.__class__ is int and tid != self._tids[j]:
                continue
            distance = max(self._starts[j] - at_ns, at_ns - self._ends[j], 0)
            if distance <= LAUNCH_TOLERANCE_NS:
                found.append((distance, self._index[j]))
        return found


def logged_replay(logs: Iterable[ReplayLog], at_ns: int, tid: object) -> tuple[GraphCapture, int] | str | None:
    """The logged replay() call a launch at ``at_ns`` on ``tid`` ran in: (capture, replay index);
    a reason when several fit equally well; None when none is near."""
    best: list[tuple[int, GraphCapture, int]] = [
        (distance, log.capture, index) for log in logs for distance, index in log.near(at_ns, tid)]
    if not best:
        return None
    nearest = min(distance for distance, _, _ in best)
    closest = {(c.capture_id, i): (c, i) for d, c, i in best if d == nearest}
    if len(closest) > 1:
        return f"the launch fits {len(closest)} logged replays equally"
    return next(iter(closest.values()))


def confirm(captured: CapturedCollective, node: GraphNodeRecord, event: dict) -> Optional[str]:
    """None when ``event`` can be the replay of ``node``; else why not (for the report).

    With the kernel's name known from capture, the names must agree and the
    collective must be the right one. Without it, the trace's NCCL kernel
    name must agree with the collective, the reduction op and the dtype
    (where the name carries them). Copies and memsets have no name to
    check: they are only ever matched by an exact id.
    """
    kind = DEVICE_WORK_NODE_TYPES.get(event.get("cat", ""))
    if kind != node.node_type:
        return f"a {kind or event.get('cat')} event where a {node.node_type} node was captured"
    if kind != KERNEL_NODE_TYPE:
        return None
    name = str(event.get("name", ""))
    if node.kernel_name and base_name(node.kernel_name) != base_name(name):
        return f"kernel {base_name(name)!r} where {base_name(node.kernel_name)!r} was captured"
    parsed = parse_nccl_kernel(name)
    if parsed is None:
        return None if node.kernel_name else f"kernel {base_name(name)!r} is not an NCCL kernel"
    ann = captured.annotation
    row = kernel_row(ann.collective_name, ann.in_split_size, ann.out_split_size)
    expected = row.nccl_kernel if row else None
    if parsed.collective != "Generic" and expected is not None and parsed.collective != expected:
        return f"{parsed.collective} kernel for a {ann.collective_name!r} collective"
    if node.kernel_name:
        return None  # the very kernel captured: its op/type specialisation is NCCL's choice, not the user's
    if parsed.op and captured.reduce_op and parsed.op not in NCCL_OPS_FOR.get(captured.reduce_op, {captured.reduce_op}):
        return f"{parsed.op} kernel for a {captured.reduce_op} reduction"
    if parsed.dtype and parsed.dtype != ann.dtype:
        return f"{parsed.dtype} kernel for {ann.dtype} data"
    return None


def _is_nccl_node(node: GraphNodeRecord) -> bool:
    return node.node_type == KERNEL_NODE_TYPE and (not node.kernel_name or parse_nccl_kernel(node.kernel_name) is not None)


def comm_nodes(captured: CapturedCollective) -> list[GraphNodeRecord]:
    """The nodes of a collective that carry its metadata at replay.

    Its NCCL kernels; a collective that launched none (a one-rank NCCL
    communicator copies or reduces with plain CUDA work) is represented by
    all its kernel, copy and memset nodes.
    """
    nccl = [n for n in captured.nodes if _is_nccl_node(n)]
    if nccl:
        return nccl
    return [n for n in captured.nodes if n.node_type in DEVICE_WORK_NODE_TYPES.values()]


class CapturedKernels:
    """The kernels collectives were captured launching, by base name: replayed, these are theirs
    even where the name is not NCCL's (a one-rank communicator reduces with its own kernel).

    ``name in captured`` asks it of a trace's kernel name; each distinct name is reduced to its
    base name once (that costs ~10 us, and a trace repeats a few names on every kernel).
    """

    def __init__(self, captures: Sequence[GraphCapture]) -> None:
        self.names = frozenset(base_name(node.kernel_name) for cap in captures for cc in cap.collectives
                               for node in comm_nodes(cc) if node.kernel_name and node.node_type == KERNEL_NODE_TYPE)
        self._seen: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.names)

    def __contains__(self, name: str) -> bool:
        found = self._seen.get(name)
        if found is None:
            found = self._seen[name] = base_name(name) in self.names
        return found


@dataclass(frozen=True, eq=False)
class ReplayMatch:
    """One device event of a replay and the captured collective it ran (both joins give these)."""

    #: The trace's event (a kernel, copy or memset), as given.
    event: dict
    capture: GraphCapture
    #: Index of the collective in ``capture.collectives``.
    collective: int
    replay: int
    #: How it was matched (see the module docstring), written as "commtag match".
    method: str

    @property
    def capture_id(self) -> int:
        return self.capture.capture_id

    @property
    def annotation(self) -> CollectiveAnnotation:
        """The captured annotation with ``replay`` and ``capture_id`` set (a copy: for reports and checks)."""
        return self.capture.collectives[self.collective].annotation.model_copy(
            update={"replay": self.replay, "capture_id": self.capture.capture_id})

    def args(self) -> dict[str, object]:
        """What to add to the event's args: the eager keys, commtag's, and how it was matched."""
        return {**self.annotation.eager_dict(), ANN_MATCH: self.method}


@dataclass(frozen=True)
class UnmatchedReplay:
    """A replay that carries captured collectives but could not be matched safely."""

    #: Its launch's correlation id as the trace wrote it (a kernel matched by its node ids may carry none).
    correlation: object
    graph_id: int
    ts: float
    capture_id: Optional[int]
    reason: str


@dataclass
class GraphMatchResult:
    matches: list[ReplayMatch] = field(default_factory=list)
    unmatched: list[UnmatchedReplay] = field(default_factory=list)
    #: Facts worth a line in the merge report (e.g. replay indices counted within the trace).
    notes: list[str] = field(default_factory=list)
    #: Replays of graphs with no captured collective (nothing to annotate).
    plain_replays: int = 0


@dataclass
class Replay:
    correlation: int
    launch: dict
    events: list[int]  # indices into the trace's events, in start order
    graph_id: int


def replays_of(events: Sequence[dict]) -> list[Replay]:
    launches: dict[int, dict] = {}
    for event in events:
        if event.get("cat") in LAUNCH_CATEGORIES and is_graph_launch(str(event.get("name", ""))):
            corr = event.get("args", {}).get(CORRELATION_KEY)
            if corr is not None:
                launches[corr] = event
    members: dict[int, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        if event.get("cat") in DEVICE_WORK_NODE_TYPES:
            corr = event.get("args", {}).get(CORRELATION_KEY)
            if corr in launches:
                members[corr].append(i)
    result = []
    for corr, idx in members.items():
        idx.sort(key=lambda i: events[i].get("ts", 0))
        graph_ids = {int(events[i].get("args", {}).get(GRAPH_ID_KEY, 0) or 0) for i in idx}
        result.append(Replay(corr, launches[corr], idx, max(graph_ids)))
    result.sort(key=lambda r: r.launch.get("ts", 0))
    return result


def node_id(event: dict) -> Optional[int]:
    value = event.get("args", {}).get(GRAPH_NODE_ID_KEY)
    return None if value is None else int(value) & NODE_ID_MASK


def _ns(ts: float, base_ns: int) -> int:
    return round(float(ts) * 1000) + base_ns


class ReplayIndex:
    """The one rule for a replay's index, shared by both joins of one trace file (module docstring)."""

    def __init__(self, captures: Sequence[GraphCapture], base_ns: int, result: GraphMatchResult) -> None:
        self.logs = {c.capture_id: ReplayLog(c) for c in captures}
        self.base_ns = base_ns
        self.result = result
        #: capture id -> launch correlation -> its replay index counted in this trace.
        self._in_trace: dict[int, dict[object, int]] = defaultdict(dict)

    def logged(self, launch: dict, captures: Iterable[GraphCapture]) -> tuple[GraphCapture, int] | str | None:
        """The logged replay() call of one of ``captures`` around this launch: (capture, replay
        index), a reason when several fit equally, or None."""
        found = logged_replay([self.logs[c.capture_id] for c in captures], _ns(launch.get("ts", 0), self.base_ns),
                              launch.get("tid"))
        return f"launch at {launch.get('ts')}: {found}" if isinstance(found, str) else found

    def of(self, capture: GraphCapture, correlation: object, launch: Optional[dict]) -> Optional[int]:
        """The index of a replay of ``capture``: from its log, else (no log at all) counted in
        this trace; None when its log holds no call for this launch."""
        if capture.replays:
            found = self.logged(launch, [capture]) if launch is not None else None
            return found[1] if isinstance(found, tuple) else None
        return self.in_trace(capture, correlation)

    def in_trace(self, capture: GraphCapture, correlation: object) -> int:
        """Replay index counted within this trace, for a capture without a replay log (noted)."""
        seen = self._in_trace[capture.capture_id]
        if correlation not in seen:
            seen[correlation] = len(seen)
        note = f"capture {capture.capture_id}: no replay log; replay indices count its replays within this trace"
        if note not in self.result.notes:
            self.result.notes.append(note)
        return seen[correlation]


def index_node_id(node: GraphNodeRecord) -> int:
    """The lower 32 bits of the "graph node id" a replayed kernel of ``node`` carries, under hypothesis 1
    (its creation index): trusted only where a kernel name confirms it (replays.py)."""
    return node.index + NODE_ID_BASE
