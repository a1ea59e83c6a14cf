"""Match CUDA-graph replays in a trace to the collectives captured in them.

A replayed NCCL kernel links to ``cudaGraphLaunch``, not to the collective
that created it, so it carries no metadata. The rank's sidecar says, per
capture, which graph nodes each collective created (see
:mod:`commtag.runtime.capture`); this module finds those nodes among the
kernels of every replay, in this order of preference:

``"tools-id"``
    exact: the node's ``cudaGraphNodeGetToolsId`` (driver 13.1+) equals the
    kernel's ``"graph node id"`` (both encodings: ``(graph << 32) | node``
    and the node part alone are compared on their lower 32 bits).
``"node-id"``
    the node's creation index equals the lower 32 bits of the kernel's
    ``"graph node id"`` (hypothesis 1 of the CUDA-graph reference); used
    only for replays where every such join is confirmed by the kernel name.
``"order"``
    the replay's NCCL kernels, in start order, pair one-to-one with the
    captured NCCL kernel nodes in creation order, every pair confirmed by
    the kernel name (collective, reduction op, dtype).

A replay whose nodes cannot be matched unambiguously is reported in
:attr:`GraphMatchResult.unmatched` and left unannotated, never guessed.

Which capture a replay ran, and its replay index: the capture whose
``exec_graph_id`` equals the kernels' ``"graph id"``; else the replay
logged by ``CUDAGraph.replay()`` whose time span holds the
``cudaGraphLaunch``; else the only capture whose kernels match the replay
(its replay index is then its position among that capture's replays in
this trace, reported in :attr:`GraphMatchResult.notes`).

Everything here is a pure function of plain data: Kineto event dicts and
:class:`~commtag.schema.GraphCapture` models.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from commtag.vocab import (
    ANN_MATCH, COLLECTIVES, DEVICE_WORK_NODE_TYPES, LAUNCH_CATEGORIES, LAUNCH_TOLERANCE_NS, NCCL_OPS_FOR,
    NODE_ID_MASK, base_name, is_graph_launch, parse_nccl_kernel,
)

if TYPE_CHECKING:  # pydantic models: only a sidecar brings captures, and it imports them
    from commtag.schema import CapturedCollective, CollectiveAnnotation, GraphCapture, GraphNodeRecord

#: Lower 32 bits of a "graph node id" minus this = the node's creation index (hypothesis 1).
NODE_ID_BASE = 0


class ReplayLog:
    """One capture's logged ``CUDAGraph.replay()`` calls on the trace's clock, searchable by time.

    Both joins ask it which replay a graph launch belongs to: the closest logged
    call on the launch's thread, at most :data:`~commtag.vocab.LAUNCH_TOLERANCE_NS`
    outside it (a linear scan per launch was quadratic).
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
    if kind != "kernel":
        return None
    name = str(event.get("name", ""))
    if node.kernel_name and base_name(node.kernel_name) != base_name(name):
        return f"kernel {base_name(name)!r} where {base_name(node.kernel_name)!r} was captured"
    parsed = parse_nccl_kernel(name)
    if parsed is None:
        return None if node.kernel_name else f"kernel {base_name(name)!r} is not an NCCL kernel"
    ann = captured.annotation
    row = COLLECTIVES.get(ann.collective_name)
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
    return node.node_type == "kernel" and (not node.kernel_name or parse_nccl_kernel(node.kernel_name) is not None)


def comm_nodes(captured: CapturedCollective) -> list[GraphNodeRecord]:
    """The nodes of a collective that carry its metadata at replay.

    Its NCCL kernels; a collective that launched none (a one-rank NCCL
    communicator copies or reduces with plain CUDA work) is represented by
    all its kernel, copy and memset nodes.
    """
    nccl = [n for n in captured.nodes if _is_nccl_node(n)]
    if nccl:
        return nccl
    return [n for n in captured.nodes if n.node_type in ("kernel", "memcpy", "memset")]


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ReplayMatch:
    """One device event of a replay and the collective it belongs to."""

    #: Index of the event in the list given to :func:`match_graph_replays`.
    event_index: int
    #: The captured annotation with ``replay`` and ``capture_id`` set.
    annotation: CollectiveAnnotation
    #: "tools-id", "node-id" or "order".
    method: str
    #: The capture and the index of the collective in its ``collectives``.
    capture_id: int = 0
    collective_index: int = 0

    def args(self) -> dict[str, object]:
        """What to add to the event's args: the eager keys, commtag's, and how it was matched."""
        return {**self.annotation.eager_dict(), ANN_MATCH: self.method}


@dataclass(frozen=True)
class UnmatchedReplay:
    """A replay that carries captured collectives but could not be matched safely."""

    correlation: int
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


# ---------------------------------------------------------------------------- matching


@dataclass
class _Replay:
    correlation: int
    launch: dict
    events: list[int]  # indices into the trace's events, in start order
    graph_id: int


def _replays(events: Sequence[dict]) -> list[_Replay]:
    launches: dict[int, dict] = {}
    for event in events:
        if event.get("cat") in LAUNCH_CATEGORIES and is_graph_launch(str(event.get("name", ""))):
            corr = event.get("args", {}).get("correlation")
            if corr is not None:
                launches[corr] = event
    members: dict[int, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        if event.get("cat") in DEVICE_WORK_NODE_TYPES:
            corr = event.get("args", {}).get("correlation")
            if corr in launches:
                members[corr].append(i)
    result = []
    for corr, idx in members.items():
        idx.sort(key=lambda i: events[i].get("ts", 0))
        graph_ids = {int(events[i].get("args", {}).get("graph id", 0) or 0) for i in idx}
        result.append(_Replay(corr, launches[corr], idx, max(graph_ids)))
    result.sort(key=lambda r: r.launch.get("ts", 0))
    return result


def _node_id(event: dict) -> Optional[int]:
    value = event.get("args", {}).get("graph node id")
    return None if value is None else int(value) & NODE_ID_MASK


def _ns(ts: float, base_ns: int) -> int:
    return round(float(ts) * 1000) + base_ns


def match_graph_replays(events: Sequence[dict], captures: Sequence[GraphCapture], base_ns: int = 0) -> GraphMatchResult:
    """Annotations for the replayed collectives of one rank's trace.

    ``events`` is the trace's ``traceEvents`` (any order); ``captures`` the
    sidecar's; ``base_ns`` the trace's ``baseTimeNanoseconds`` (0 for old
    traces with epoch-microsecond ``ts``), to compare launches with the
    replay log. The events are not modified.
    """
    result = GraphMatchResult()
    with_collectives = [c for c in captures if any(comm_nodes(cc) for cc in c.collectives)]
    replays = _replays(events)
    if not replays:
        return result
    by_exec = {c.exec_graph_id: c for c in with_collectives if c.exec_graph_id}
    logs = {c.capture_id: ReplayLog(c) for c in with_collectives}
    assigned: dict[int, tuple[GraphCapture, Optional[int]]] = {}
    pending: list[_Replay] = []
    for replay in replays:
        if replay.graph_id and replay.graph_id in by_exec:
            capture = by_exec[replay.graph_id]
            found = _from_log(replay, [logs[capture.capture_id]], base_ns)
            assigned[replay.correlation] = (capture, found[1] if isinstance(found, tuple) else None)
            continue
        found = _from_log(replay, logs.values(), base_ns)
        if isinstance(found, str):
            result.unmatched.append(UnmatchedReplay(replay.correlation, replay.graph_id, replay.launch.get("ts", 0), None, found))
        elif found is not None:
            assigned[replay.correlation] = found
        else:
            pending.append(replay)
    _check_graph_ids(replays, assigned, result)
    relative: dict[int, int] = defaultdict(int)
    for replay in replays:
        if replay.correlation in assigned:
            capture, index = assigned[replay.correlation]
            if index is None and not capture.replays:
                index = _relative_index(capture, relative, result)
            _match_replay(events, replay, capture, index, result)
        elif replay in pending:
            _match_by_content(events, replay, with_collectives, relative, result)
    return result


def _relative_index(capture: GraphCapture, relative: dict[int, int], result: GraphMatchResult) -> int:
    """Replay index counted within this trace, for a capture without a replay log (noted)."""
    index = relative[capture.capture_id]
    relative[capture.capture_id] += 1
    note = f"capture {capture.capture_id}: no replay log; replay indices count its replays within this trace"
    if note not in result.notes:
        result.notes.append(note)
    return index


def _from_log(replay: _Replay, logs: Iterable[ReplayLog], base_ns: int) -> tuple[GraphCapture, int] | str | None:
    """The logged replay() call around this launch: (capture, replay index), a reason, or None."""
    launch = replay.launch
    found = logged_replay(logs, _ns(launch.get("ts", 0), base_ns), launch.get("tid"))
    return f"launch at {launch.get('ts')}: {found}" if isinstance(found, str) else found


def _check_graph_ids(replays: list[_Replay], assigned: dict, result: GraphMatchResult) -> None:
    """One exec graph is one capture: replays of a graph id pointing at two captures are all dropped."""
    captures_of: dict[int, set[int]] = defaultdict(set)
    for replay in replays:
        if replay.graph_id and replay.correlation in assigned:
            captures_of[replay.graph_id].add(assigned[replay.correlation][0].capture_id)
    for replay in replays:
        seen = captures_of.get(replay.graph_id, set())
        if replay.graph_id and len(seen) > 1 and replay.correlation in assigned:
            del assigned[replay.correlation]
            result.unmatched.append(UnmatchedReplay(
                replay.correlation, replay.graph_id, replay.launch.get("ts", 0), None,
                f"graph id {replay.graph_id} is replayed as captures {sorted(seen)} by the replay log"))


def _match_replay(events: Sequence[dict], replay: _Replay, capture: GraphCapture, index: Optional[int], result: GraphMatchResult) -> None:
    if index is None:
        result.unmatched.append(UnmatchedReplay(
            replay.correlation, replay.graph_id, replay.launch.get("ts", 0), capture.capture_id,
            "no logged replay() call for this launch: its replay index is unknown"))
        return
    pairs, method, reason = _pair_nodes(events, replay, capture)
    if pairs is None:
        result.unmatched.append(UnmatchedReplay(replay.correlation, replay.graph_id, replay.launch.get("ts", 0), capture.capture_id, reason))
        return
    _emit(pairs, method, capture, index, result)


def _match_by_content(events: Sequence[dict], replay: _Replay, captures: list[GraphCapture], relative: dict[int, int],
                      result: GraphMatchResult) -> None:
    """No id and no log says which capture this is: accept it only if exactly one capture fits."""
    fits = []
    for capture in captures:
        if capture.replays or (capture.exec_graph_id and replay.graph_id):
            continue  # a capture with a log or a known graph id would have been recognised
        pairs, method, _ = _pair_nodes(events, replay, capture)
        if pairs is not None:
            fits.append((capture, pairs, method))
    if not fits:
        if _has_nccl(events, replay):
            result.unmatched.append(UnmatchedReplay(replay.correlation, replay.graph_id, replay.launch.get("ts", 0), None,
                                                    "NCCL kernels in a replay that matches no capture"))
        else:
            result.plain_replays += 1
        return
    if len(fits) > 1:
        result.unmatched.append(UnmatchedReplay(replay.correlation, replay.graph_id, replay.launch.get("ts", 0), None,
                                                f"fits captures {[c.capture_id for c, _, _ in fits]} equally"))
        return
    capture, pairs, method = fits[0]
    _emit(pairs, method, capture, _relative_index(capture, relative, result), result)


def _has_nccl(events: Sequence[dict], replay: _Replay) -> bool:
    return any(events[i].get("cat") == "kernel" and parse_nccl_kernel(str(events[i].get("name", ""))) for i in replay.events)


_Pair = tuple[int, "CapturedCollective"]


def _pair_nodes(events: Sequence[dict], replay: _Replay, capture: GraphCapture) -> tuple[Optional[list[_Pair]], str, str]:
    """(event index, collective) pairs for one replay of ``capture``, the method, or None and why."""
    wanted = [(cc, node) for cc in capture.collectives for node in comm_nodes(cc)]
    node_ids = [_node_id(events[i]) for i in replay.events]
    distinct = [n for n in node_ids if n is not None]
    usable_ids = len(distinct) == len(replay.events) and len(set(distinct)) == len(distinct) and len(distinct) > 1
    if usable_ids and all(node.tools_id is not None for _, node in wanted):
        pairs, reason = _join(events, replay, wanted, lambda node: node.tools_id & NODE_ID_MASK)
        if pairs is not None:
            return pairs, "tools-id", ""
    if usable_ids and any(node.node_type == "kernel" for _, node in wanted):
        # Hypothesis 1 is only trusted where a kernel name confirms it within the same replay.
        pairs, reason = _join(events, replay, wanted, lambda node: node.index + NODE_ID_BASE)
        if pairs is not None:
            return pairs, "node-id", ""
    pairs, reason = _by_order(events, replay, wanted)
    return pairs, "order", reason


def _join(events: Sequence[dict], replay: _Replay, wanted: list[tuple[CapturedCollective, GraphNodeRecord]],
          key) -> tuple[Optional[list[_Pair]], str]:
    by_id = {_node_id(events[i]): i for i in replay.events}
    pairs = []
    for cc, node in wanted:
        i = by_id.get(key(node))
        if i is None:
            return None, f"node {node.index} of {cc.annotation.collective_name} Seq {cc.annotation.seq} is not in the replay"
        why = confirm(cc, node, events[i])
        if why:
            return None, why
        pairs.append((i, cc))
    return pairs, ""


def _by_order(events: Sequence[dict], replay: _Replay, wanted: list[tuple[CapturedCollective, GraphNodeRecord]]) -> tuple[Optional[list[_Pair]], str]:
    kernels = sorted(((cc, n) for cc, n in wanted if n.node_type == "kernel"), key=lambda item: item[1].index)
    if len(kernels) != len(wanted):
        return None, "copy/memset nodes of a collective can only be matched by node id"
    names = {base_name(n.kernel_name) for _, n in kernels if n.kernel_name}
    candidates = [
        i for i in replay.events
        if events[i].get("cat") == "kernel"
        and (base_name(str(events[i].get("name", ""))) in names or parse_nccl_kernel(str(events[i].get("name", ""))))
    ]
    if len(candidates) != len(kernels):
        return None, f"{len(candidates)} NCCL kernels in the replay, {len(kernels)} captured"
    pairs = []
    for i, (cc, node) in zip(candidates, kernels):
        why = confirm(cc, node, events[i])
        if why:
            return None, f"in capture order: {why}"
        pairs.append((i, cc))
    return pairs, ""


def _emit(pairs: list[_Pair], method: str, capture: GraphCapture, index: int, result: GraphMatchResult) -> None:
    position = {id(cc): i for i, cc in enumerate(capture.collectives)}
    for event_index, cc in pairs:
        annotation = cc.annotation.model_copy(update={"replay": index, "capture_id": capture.capture_id})
        result.matches.append(ReplayMatch(event_index, annotation, method, capture.capture_id, position[id(cc)]))


def computed_node_ids(capture: GraphCapture) -> dict[int, tuple[CapturedCollective, GraphNodeRecord]]:
    """Lower-32-bit "graph node id" -> (collective, node) under hypothesis 1, for exact joins elsewhere."""
    return {node.index + NODE_ID_BASE: (cc, node) for cc in capture.collectives for node in comm_nodes(cc)}


def fallback_for(trace: dict, report: Optional[list[UnmatchedReplay]] = None):
    """A ``commtag.merge.attach.GraphFallback`` for one trace file.

    attach.py joins by exact node id first and hands this the NCCL kernels
    left over, its launch events by correlation, and the sidecar. ``report``
    (if given) receives the replays that could not be matched.
    """
    from commtag.merge.attach import GraphMatch
    from commtag.merge.load import base_ns

    base = base_ns(trace)

    def fallback(kernels: list[dict], sidecar, launches: dict[int, dict]) -> list[GraphMatch]:
        events = list(launches.values()) + list(kernels)
        result = match_graph_replays(events, sidecar.captures, base)
        if report is not None:
            report.extend(result.unmatched)
        return [
            GraphMatch(events[m.event_index], m.capture_id, m.collective_index, m.annotation.replay or 0, m.method)
            for m in result.matches
        ]

    return fallback
