"""Match CUDA-graph replays in a trace to the collectives captured in them: the one home of it.

A replayed NCCL kernel links to ``cudaGraphLaunch``, not to the collective
that created it, so it carries no metadata. The rank's sidecar says, per
capture, which graph nodes each collective created (see
:mod:`commtag.runtime.capture`); :func:`match` finds those nodes among the
kernels of a trace file, in this order, every kernel matched at most once
(the method is written as "commtag match"):

Exact, kernel by kernel (a kernel's ``"graph node id"`` names its node)
    ``"torch-annotation"`` / ``"torch-tools-id"``: torch's own graph
    annotations carried commtag's mark, or the tools id torch registered
    for the collective's nodes; ``"tools-id"``: the node's
    ``cudaGraphNodeGetToolsId`` (driver 13.1+) equals the id; ``"node-id"``:
    the graph id (packed ``(graph << 32) | node`` or beside it) names the
    capture, the node id its recorded local id (else creation index).
Replay by replay, for the NCCL kernels of graph launches left over (:func:`match_graph_replays`)
    ``"tools-id"``: tools ids compared on their lower 32 bits; ``"node-id"``:
    the node's creation index equals the lower 32 bits of the kernel's
    ``"graph node id"`` (hypothesis 1 of the CUDA-graph reference), used only
    where every such join in the replay is confirmed by the kernel name;
    ``"order"``: the replay's NCCL kernels, in start order, pair one-to-one
    with the captured NCCL kernel nodes in creation order, every pair
    confirmed by the kernel name (collective, reduction op, dtype). Copies
    and memsets of collectives have no name to confirm: they stay
    unannotated, said in :attr:`GraphMatchResult.notes` (the eager profiler
    annotates a collective's kernels, not its copies, either).

A replay whose nodes cannot be matched unambiguously is reported in
:attr:`GraphMatchResult.unmatched` and left unannotated, never guessed.

Which capture a replay ran: the exact ids above; else the capture whose
``exec_graph_id`` equals the kernels' ``"graph id"``; else the replay logged
by ``CUDAGraph.replay()`` around the launch; else the only capture whose
kernels match the replay. Its replay index, one rule for both joins
(:class:`_ReplayIndex`): the logged ``replay()`` call around the launch
(:class:`ReplayLog`, :data:`~commtag.vocab.LAUNCH_TOLERANCE_NS`); for a
capture with no replay log, its position among that capture's replays in
this trace (said in :attr:`GraphMatchResult.notes`); a capture whose log
holds no call for the launch gives no index: the replay is unmatched.

Everything here is a pure function of plain data: Kineto event dicts and
:class:`~commtag.schema.GraphCapture` models.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

from commtag.vocab import (
    ANN_MATCH, COLLECTIVES, CORRELATION_KEY, DEVICE_WORK_NODE_TYPES, GRAPH_ID_KEY, GRAPH_NODE_ID_KEY,
    KERNEL_CATEGORY, KERNEL_NODE_TYPE, LAUNCH_CATEGORIES, LAUNCH_TOLERANCE_NS, NCCL_OPS_FOR, NODE_ID_MASK,
    TOOLS_ID_GRAPH_SHIFT, TORCH_MARK_KEY, base_name, is_graph_launch, nccl_kind, parse_nccl_kernel,
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
    if kind != KERNEL_NODE_TYPE:
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


# ---------------------------------------------------------------------------- results


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
        result.append(_Replay(corr, launches[corr], idx, max(graph_ids)))
    result.sort(key=lambda r: r.launch.get("ts", 0))
    return result


def _node_id(event: dict) -> Optional[int]:
    value = event.get("args", {}).get(GRAPH_NODE_ID_KEY)
    return None if value is None else int(value) & NODE_ID_MASK


def _ns(ts: float, base_ns: int) -> int:
    return round(float(ts) * 1000) + base_ns


class _ReplayIndex:
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


def match(kernels: Sequence[dict], launches: Mapping[object, dict], captures: Sequence[GraphCapture],
          base_ns: int) -> GraphMatchResult:
    """The replayed collectives of one trace file: every kernel joined exactly where its node id
    allows, then the graph launches' NCCL kernels left over replay by replay (module docstring).

    ``kernels``: the file's kernel events in start order; ``launches``: its graph launches by
    correlation; ``captures``: the sidecar's; ``base_ns``: the file's ``baseTimeNanoseconds``,
    to compare launches with the replay log. The events are not modified.
    """
    result = GraphMatchResult()
    if not captures:
        return result
    index = _ReplayIndex(captures, base_ns, result)
    exact, leftover = _exact(kernels, launches, captures)
    unknown: dict[object, GraphCapture] = {}
    for event, capture, collective, method in exact:
        correlation = (event.get("args") or {}).get(CORRELATION_KEY)
        replay = index.of(capture, correlation, launches.get(correlation))
        if replay is None:
            unknown[correlation] = capture
        else:
            result.matches.append(ReplayMatch(event, capture, collective, replay, method))
    for correlation, capture in unknown.items():
        launch = launches.get(correlation) or {}
        result.unmatched.append(UnmatchedReplay(correlation, 0, launch.get("ts", 0), capture.capture_id, _NO_LOGGED_CALL))
    if leftover:
        _by_replay([*launches.values(), *leftover], captures, index, result)
    return result


#: Why a replay of a capture with a replay log has no index.
_NO_LOGGED_CALL = "no logged replay() call for this launch: its replay index is unknown"


def _exact(kernels: Sequence[dict], launches: Mapping[object, dict], captures: Sequence[GraphCapture]
           ) -> tuple[list[tuple[dict, GraphCapture, int, str]], list[dict]]:
    """(kernel, capture, collective index, method) of each kernel whose ids name its node, and
    the NCCL kernels of graph launches (or with a node id) that none named."""
    by_graph: dict[int, GraphCapture] = {}
    by_tools: dict[int, tuple[GraphCapture, int]] = {}
    by_node: dict[tuple[int, int], tuple[GraphCapture, int]] = {}
    by_mark: dict[str, tuple[GraphCapture, int]] = {}
    by_torch_tools: dict[int, tuple[GraphCapture, int]] = {}
    for cap in captures:
        for gid in (cap.graph_id, cap.exec_graph_id):
            if gid is not None:
                by_graph[gid] = cap
        for ci, captured in enumerate(cap.collectives):
            if captured.torch_mark is not None:
                by_mark[captured.torch_mark] = (cap, ci)
            for tools_id in captured.torch_tools_ids or ():
                by_torch_tools[tools_id] = (cap, ci)
            for node in captured.nodes:
                if node.tools_id is not None:
                    by_tools[node.tools_id] = (cap, ci)
                local = node.local_id if node.local_id is not None else node.index
                by_node[(cap.capture_id, local)] = (cap, ci)
    captured = CapturedKernels(captures)
    exact: list[tuple[dict, GraphCapture, int, str]] = []
    leftover: list[dict] = []
    for e in kernels:
        args = e.get("args") or {}
        raw = args.get(GRAPH_NODE_ID_KEY) or 0
        hit = None
        if raw and nccl_kind(e.get("name", "")):  # torch marks all the scope's nodes; NCCL's carry the call
            hit = by_mark.get(str(args.get(TORCH_MARK_KEY)))
            method = "torch-annotation"
            if hit is None:
                hit = by_torch_tools.get(raw)
                method = "torch-tools-id"
        if raw and hit is None:
            method = "tools-id"
            hit = by_tools.get(raw)
            if hit is None:
                method = "node-id"
                gid, nid = (raw >> TOOLS_ID_GRAPH_SHIFT, raw & NODE_ID_MASK) if raw >> TOOLS_ID_GRAPH_SHIFT else (args.get(GRAPH_ID_KEY), raw)
                cap = by_graph.get(gid)
                hit = by_node.get((cap.capture_id, nid)) if cap is not None else None
        if hit is not None:
            exact.append((e, *hit, method))
        elif ((nccl_kind(e.get("name", "")) or e.get("name", "") in captured)
              and (raw or args.get(CORRELATION_KEY) in launches)):
            leftover.append(e)
    return exact, leftover


def match_graph_replays(events: Sequence[dict], captures: Sequence[GraphCapture], base_ns: int = 0) -> GraphMatchResult:
    """The replay-by-replay join alone, on a trace's events (any order; not modified): what
    :func:`match` does with the kernels no id named. ``base_ns`` as for :func:`match`."""
    result = GraphMatchResult()
    _by_replay(events, captures, _ReplayIndex(captures, base_ns, result), result)
    return result


def _by_replay(events: Sequence[dict], captures: Sequence[GraphCapture], index: _ReplayIndex,
               result: GraphMatchResult) -> None:
    with_collectives = [c for c in captures if any(comm_nodes(cc) for cc in c.collectives)]
    replays = _replays(events)
    if not replays:
        return
    by_exec = {c.exec_graph_id: c for c in with_collectives if c.exec_graph_id}
    assigned: dict[int, tuple[GraphCapture, Optional[int]]] = {}
    pending: list[_Replay] = []
    for replay in replays:
        if replay.graph_id and replay.graph_id in by_exec:
            capture = by_exec[replay.graph_id]
            assigned[replay.correlation] = (capture, None)  # its index: below, once the ids are checked
            continue
        found = index.logged(replay.launch, with_collectives)
        if isinstance(found, str):
            result.unmatched.append(UnmatchedReplay(replay.correlation, replay.graph_id, replay.launch.get("ts", 0), None, found))
        elif found is not None:
            assigned[replay.correlation] = found
        else:
            pending.append(replay)
    _check_graph_ids(replays, assigned, result)
    for replay in replays:
        if replay.correlation in assigned:
            capture, replay_index = assigned[replay.correlation]
            if replay_index is None:
                replay_index = index.of(capture, replay.correlation, replay.launch)
            _match_replay(events, replay, capture, replay_index, result)
        elif replay in pending:
            _match_by_content(events, replay, with_collectives, index, result)


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
            replay.correlation, replay.graph_id, replay.launch.get("ts", 0), capture.capture_id, _NO_LOGGED_CALL))
        return
    pairs, method, reason = _pair_nodes(events, replay, capture)
    if pairs is None:
        result.unmatched.append(UnmatchedReplay(replay.correlation, replay.graph_id, replay.launch.get("ts", 0), capture.capture_id, reason))
        return
    _emit(events, pairs, method, capture, index, result)


def _match_by_content(events: Sequence[dict], replay: _Replay, captures: list[GraphCapture], index: _ReplayIndex,
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
    _emit(events, pairs, method, capture, index.in_trace(capture, replay.correlation), result)


def _has_nccl(events: Sequence[dict], replay: _Replay) -> bool:
    return any(events[i].get("cat") == KERNEL_CATEGORY and parse_nccl_kernel(str(events[i].get("name", ""))) for i in replay.events)


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
    if usable_ids and any(node.node_type == KERNEL_NODE_TYPE for _, node in wanted):
        # Hypothesis 1 is only trusted where a kernel name confirms it within the same replay.
        pairs, reason = _join(events, replay, wanted, lambda node: node.index + NODE_ID_BASE)
        if pairs is not None:
            return pairs, "node-id", ""
    pairs, reason = _by_order(events, replay, wanted)
    return pairs, "order", reason


def _skipped_by_order(capture: GraphCapture) -> int:
    """Copy and memset nodes of ``capture``'s collectives that a match by order leaves unannotated.

    Only the eager profiler's own choice is reproduced without node ids: it
    puts the collective's keys on its kernels, not on the copies around them.
    """
    return sum(1 for cc in capture.collectives for node in comm_nodes(cc) if node.node_type != KERNEL_NODE_TYPE)


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
    """Kernels only: a copy or memset has no name to confirm its place (see :func:`_skipped_by_order`)."""
    kernels = sorted(((cc, n) for cc, n in wanted if n.node_type == KERNEL_NODE_TYPE), key=lambda item: item[1].index)
    names = {base_name(n.kernel_name) for _, n in kernels if n.kernel_name}
    candidates = [
        i for i in replay.events
        if events[i].get("cat") == KERNEL_CATEGORY
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


def _emit(events: Sequence[dict], pairs: list[_Pair], method: str, capture: GraphCapture, index: int,
          result: GraphMatchResult) -> None:
    skipped = _skipped_by_order(capture) if method == "order" else 0
    note = (f"capture {capture.capture_id}: {skipped} copy/memset node(s) of its collectives stay unannotated on "
            "each replay matched by order (no usable graph node ids in the trace; only kernels are placed by order)")
    if skipped and note not in result.notes:
        result.notes.append(note)
    position = {id(cc): i for i, cc in enumerate(capture.collectives)}
    for event_index, cc in pairs:
        result.matches.append(ReplayMatch(events[event_index], capture, position[id(cc)], index, method))


def computed_node_ids(capture: GraphCapture) -> dict[int, tuple[CapturedCollective, GraphNodeRecord]]:
    """Lower-32-bit "graph node id" -> (collective, node) under hypothesis 1, for exact joins elsewhere."""
    return {node.index + NODE_ID_BASE: (cc, node) for cc in capture.collectives for node in comm_nodes(cc)}
