"""Match CUDA-graph replays in a trace to the collectives captured in them: the one home of it.

A replayed NCCL kernel links to ``cudaGraphLaunch``, not to the collective
that created it, so it carries no metadata. The rank's sidecar says, per
capture, which graph nodes each collective created (see
:mod:`commtag.runtime.capture`); :func:`match` finds those nodes among the
kernels of a trace file, in this order, every kernel matched at most once (to
all the collectives that captured its node: a legacy batch_isend_irecv's ops
share one SendRecv kernel; the method is written as "commtag match"):

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
(:class:`commtag.merge.rank.captures.ReplayIndex`): the logged ``replay()`` call around the launch
(:class:`commtag.merge.rank.captures.ReplayLog`, :data:`~commtag.vocab.LAUNCH_TOLERANCE_NS`); for a
capture with no replay log, its position among that capture's replays in
this trace (said in :attr:`GraphMatchResult.notes`); a capture whose log
holds no call for the launch gives no index: the replay is unmatched.

Everything here is a pure function of plain data: Kineto event dicts and
:class:`~commtag.schema.GraphCapture` models.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from commtag.merge.inputs.clock import event_ns
from commtag.merge.rank.events import FileEvents, make_instance, mark_nccl2, own_args
from commtag.vocab import (
    ANN_MATCH, ANN_REPLAY, CORRELATION_KEY, GRAPH_ID_KEY, GRAPH_NODE_ID_KEY,
    KERNEL_CATEGORY, KERNEL_NODE_TYPE, NODE_ID_MASK,
    TOOLS_ID_GRAPH_SHIFT, TORCH_MARK_KEY, base_name, nccl_kind, parse_nccl_kernel,
)
from commtag.merge.rank.captures import (
    CapturedKernels, GraphMatchResult, Replay, ReplayIndex, ReplayMatch, UnmatchedReplay, comm_nodes, confirm,
    index_node_id, node_id, replays_of,
)

if TYPE_CHECKING:  # pydantic models: only a sidecar brings captures, and it imports them
    from commtag.schema import CapturedCollective, GraphCapture, GraphNodeRecord


# ---------------------------------------------------------------------------- results


# ---------------------------------------------------------------------------- matching


def match(kernels: Sequence[dict], launches: Mapping[Any, dict], captures: Sequence[GraphCapture],
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
    index = ReplayIndex(captures, base_ns, result)
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


def _exact(kernels: Sequence[dict], launches: Mapping[Any, dict], captures: Sequence[GraphCapture]
           ) -> tuple[list[tuple[dict, GraphCapture, int, str]], list[dict]]:
    """(kernel, capture, collective index, method) of each kernel whose ids name its node, and
    the NCCL kernels of graph launches (or with a node id) that none named."""
    by_graph: dict[object, GraphCapture] = {}  # looked up by the graph id a kernel's args hold
    by_tools: dict[int, list[tuple[GraphCapture, int]]] = defaultdict(list)
    by_node: dict[tuple[int, int], list[tuple[GraphCapture, int]]] = defaultdict(list)
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
                    by_tools[node.tools_id].append((cap, ci))
                local = node.local_id if node.local_id is not None else node.index
                by_node[(cap.capture_id, local)].append((cap, ci))
    captured_names = CapturedKernels(captures)
    exact: list[tuple[dict, GraphCapture, int, str]] = []
    leftover: list[dict] = []
    for e in kernels:
        args = e.get("args") or {}
        raw = args.get(GRAPH_NODE_ID_KEY) or 0
        hit = None
        if raw and nccl_kind(e.get("name", "")):  # torch marks all the scope's nodes; NCCL's carry the call
            one = by_mark.get(str(args.get(TORCH_MARK_KEY)))
            method = "torch-annotation"
            if one is None:
                one = by_torch_tools.get(raw)
                method = "torch-tools-id"
            hit = [one] if one is not None else None
        if raw and hit is None:
            method = "tools-id"
            hit = by_tools.get(raw)
            if hit is None:
                method = "node-id"
                gid, nid = (raw >> TOOLS_ID_GRAPH_SHIFT, raw & NODE_ID_MASK) if raw >> TOOLS_ID_GRAPH_SHIFT else (args.get(GRAPH_ID_KEY), raw)
                graph = by_graph.get(gid)
                hit = by_node.get((graph.capture_id, nid)) if graph is not None else None
        if hit:
            exact += [(e, cap, ci, method) for cap, ci in hit]
        elif ((nccl_kind(e.get("name", "")) or e.get("name", "") in captured_names)
              and (raw or args.get(CORRELATION_KEY) in launches)):
            leftover.append(e)
    return exact, leftover


def match_graph_replays(events: Sequence[dict], captures: Sequence[GraphCapture], base_ns: int = 0) -> GraphMatchResult:
    """The replay-by-replay join alone, on a trace's events (any order; not modified): what
    :func:`match` does with the kernels no id named. ``base_ns`` as for :func:`match`."""
    result = GraphMatchResult()
    _by_replay(events, captures, ReplayIndex(captures, base_ns, result), result)
    return result


def _by_replay(events: Sequence[dict], captures: Sequence[GraphCapture], index: ReplayIndex,
               result: GraphMatchResult) -> None:
    with_collectives = [c for c in captures if any(comm_nodes(cc) for cc in c.collectives)]
    replays = replays_of(events)
    if not replays:
        return
    by_exec = {c.exec_graph_id: c for c in with_collectives if c.exec_graph_id}
    assigned: dict[int, tuple[GraphCapture, Optional[int]]] = {}
    pending: list[Replay] = []
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


def _check_graph_ids(replays: list[Replay], assigned: dict, result: GraphMatchResult) -> None:
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


def _match_replay(events: Sequence[dict], replay: Replay, capture: GraphCapture, index: Optional[int], result: GraphMatchResult) -> None:
    if index is None:
        result.unmatched.append(UnmatchedReplay(
            replay.correlation, replay.graph_id, replay.launch.get("ts", 0), capture.capture_id, _NO_LOGGED_CALL))
        return
    pairs, method, reason = _pair_nodes(events, replay, capture)
    if pairs is None:
        result.unmatched.append(UnmatchedReplay(replay.correlation, replay.graph_id, replay.launch.get("ts", 0), capture.capture_id, reason))
        return
    _emit(events, pairs, method, capture, index, result)


def _match_by_content(events: Sequence[dict], replay: Replay, captures: list[GraphCapture], index: ReplayIndex,
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


def _has_nccl(events: Sequence[dict], replay: Replay) -> bool:
    return any(events[i].get("cat") == KERNEL_CATEGORY and parse_nccl_kernel(str(events[i].get("name", ""))) for i in replay.events)


_Pair = tuple[int, "CapturedCollective"]


def _pair_nodes(events: Sequence[dict], replay: Replay, capture: GraphCapture) -> tuple[Optional[list[_Pair]], str, str]:
    """(event index, collective) pairs for one replay of ``capture``, the method, or None and why."""
    wanted = [(cc, node) for cc in capture.collectives for node in comm_nodes(cc)]
    node_ids = [node_id(events[i]) for i in replay.events]
    distinct = [n for n in node_ids if n is not None]
    usable_ids = len(distinct) == len(replay.events) and len(set(distinct)) == len(distinct) and len(distinct) > 1
    if usable_ids and all(node.tools_id is not None for _, node in wanted):
        pairs, reason = _join(events, replay, wanted, lambda node: node.tools_id & NODE_ID_MASK)
        if pairs is not None:
            return pairs, "tools-id", ""
    if usable_ids and any(node.node_type == KERNEL_NODE_TYPE for _, node in wanted):
        # Hypothesis 1 is only trusted where a kernel name confirms it within the same replay.
        pairs, reason = _join(events, replay, wanted, index_node_id)
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


def _join(events: Sequence[dict], replay: Replay, wanted: list[tuple[CapturedCollective, GraphNodeRecord]],
          key) -> tuple[Optional[list[_Pair]], str]:
    by_id = {node_id(events[i]): i for i in replay.events}
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


def _by_order(events: Sequence[dict], replay: Replay, wanted: list[tuple[CapturedCollective, GraphNodeRecord]]) -> tuple[Optional[list[_Pair]], str]:
    """Kernels only: a copy or memset has no name to confirm its place (see :func:`_skipped_by_order`)."""
    # One kernel per node: the collectives that share a node (a legacy batch's ops) share its kernel.
    sharing: dict[int, list[CapturedCollective]] = defaultdict(list)
    kernels = []
    for cc, n in sorted(((cc, n) for cc, n in wanted if n.node_type == KERNEL_NODE_TYPE), key=lambda item: item[1].index):
        if n.index not in sharing:
            kernels.append((cc, n))
        sharing[n.index].append(cc)
    names = {base_name(n.kernel_name) for _, n in kernels if n.kernel_name}
    candidates = [
        i for i in replay.events
        if events[i].get("cat") == KERNEL_CATEGORY
        and (base_name(str(events[i].get("name", ""))) in names or parse_nccl_kernel(str(events[i].get("name", ""))))
    ]
    if len(candidates) != len(kernels):
        return None, f"{len(candidates)} NCCL kernels in the replay, {len(kernels)} captured"
    pairs = []
    for i, (_, node) in zip(candidates, kernels):
        for cc in sharing[node.index]:
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


def attach_replays(events: FileEvents) -> None:
    """The attach pass of graph replays: the file's kernels joined to its sidecar's captures
    (:func:`match`), one instance per replay of each captured collective; what is left unmatched is noted."""
    captures = events.sidecar.captures if events.sidecar else []
    if not captures:
        return
    kernels = [e for _, _, e in events.kernels]
    result = match(kernels, events.launches, captures, events.base - events.offset)
    matches = result.matches
    events.notes += result.notes
    reasons = Counter(unmatched.reason for unmatched in result.unmatched)
    events.notes += [f"{n} graph replay(s) carrying captured collectives left unannotated: {reason}"
                   for reason, n in reasons.items()]
    grouped: dict[tuple[int, int, int], list[ReplayMatch]] = {}
    for m in matches:
        grouped.setdefault((m.capture_id, m.collective, m.replay), []).append(m)
    sites: dict[tuple[int, int, str], dict] = {}
    marked: dict[int, dict[int, dict]] = {}
    #: Each matched kernel (by id) and the annotations of the collectives that claim it, in order.
    claims: dict[int, tuple[dict, list[tuple[dict, dict]]]] = {}
    for (cap_id, ci, replay), group in sorted(grouped.items(), key=lambda item: item[0]):
        capture = group[0].capture
        annotation = capture.collectives[ci].annotation
        nccl2 = _nccl2_marked(events, capture, marked).get(ci)
        own = own_args(annotation, **{ANN_REPLAY: replay}) if nccl2 is None else \
            events.interner.split({**nccl2, ANN_REPLAY: replay})[1]
        spans = [event_ns(m.event, events.base) for m in group]
        for m in group:
            events.taken.add(id(m.event))
            site = sites.get((cap_id, ci, m.method))
            if site is None:
                site = sites[(cap_id, ci, m.method)] = events.interner.split(
                    {**(annotation.eager_dict() if nccl2 is None else nccl2), ANN_MATCH: m.method})[0]
            claims.setdefault(id(m.event), (m.event, []))[1].append((site, own))
        first = group[min(zip(spans, range(len(group))))[1]]
        events.instances.append(make_instance(
            events.interner, events.rank, (sites[(cap_id, ci, first.method)], own),
            min(s[0] for s in spans), max(s[1] for s in spans),
            "graph-replay", events.by_uid.get(annotation.pg_uid), events.flows.source(first.event), events.members,
        ))
    for event, parts in claims.values():
        events.annotate(event, parts[0] if len(parts) == 1 else _shared(events, parts))


def _shared(events: FileEvents, parts: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """The annotation of a kernel several collectives share (a legacy batch's ops, one SendRecv):
    the keys all of them agree on; each op's own keys stay on its instance, none on the kernel."""
    whole = [{**common, **own} for common, own in parts]
    return events.interner.split({key: value for key, value in whole[0].items()
                                  if all(key in other and other[key] == value for other in whole[1:])})


def _nccl2_marked(events: FileEvents, capture: GraphCapture, marked: dict[int, dict[int, dict]]) -> dict[int, dict]:
    """The eager dicts of a capture's nccl2 collectives (by index), marked as the eager ones are
    (:func:`commtag.merge.rank.events.mark_nccl2`) once per capture: the k records of a coalesced
    call, captured with one Seq, are parts 0..k-1 on every replay."""
    found = marked.get(capture.capture_id)
    if found is None:
        found = marked[capture.capture_id] = {}
        parts: dict[tuple[str, int], int] = {}
        for ci, cc in enumerate(capture.collectives):
            ann = cc.annotation
            if events.reads_nccl2(ann.collective_name, ann.in_split_size, ann.out_split_size, ann.pg_uid, "sidecar"):
                group = events.by_uid.get(ann.pg_uid)
                eager = found[ci] = {**ann.eager_dict(), **own_args(ann)}
                mark_nccl2(eager, parts, group.ranks if group else ())
    return found
