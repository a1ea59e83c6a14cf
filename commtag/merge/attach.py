"""Attach collective annotations to a rank's trace events; make CollectiveInstances.

Five sources (an event gets at most one annotation):

gloo (sidecar records)
    A recorded call is joined to the ``c10d::*`` CPU op of its family that
    starts within it on its thread, then to the ``gloo:*`` work event(s) that
    ran it, by identity (see :class:`_GlooCall`): p2p works start inside the
    op on the calling thread; an async work is the event on the worker thread
    that the runtime saw complete it, holding that moment; any other work is
    the one of its family inside the call on a worker of its group, taken only
    when no other event could be it. A call whose work is not identified keeps
    its op and says ``"commtag gloo work": "not identified"``. The slice's time
    is its works' span, else the op's, else the recorded span.
eager NCCL kernels
    A recorded call takes the kernels its ``c10d::`` op launched, by identity
    (a kernel's "External id" is the op's, or that of the record_param_comms
    inside it). Other kernels keep Kineto's own metadata; the sidecar record
    of the same group, collective and Seq (by identity, not call order: a
    call recorded earlier on another thread keeps its own kernel; k-th with
    k-th only where a kernel carries no Seq) supplies the exact uid, else
    they are completed from distributedInfo's pg_config and the kernel order
    per group (``"commtag seq from": "kernel order"``). A recorded call that
    no kernel took (one rank's broadcast launches none; a copy is no kernel)
    is timed by its c10d op, else by its record (:data:`CPU_OP_SOURCE`).
``record_param_comms`` CPU ops, when no kernel of the file carries metadata
    (a CPU-only profile of an NCCL job; a world of one rank, where NCCL runs
    no kernel; a Kineto that did not copy the keys): the same keys, taken
    from the op that records them, timed by the op's NCCL kernel (the same
    "External id") where there is one, else by the op (host time: the call,
    not the transfer; :data:`CPU_OP_SOURCE`). An older torch's integer
    "Process Group ID" is read through pg_config's uid.
graph-replayed kernels (:func:`commtag.merge.graphs.match`, called once per file)
    Joined to the captured collectives of the sidecar exactly where the
    kernel's ids allow (torch's own annotation, tools ids, node ids), then
    replay by replay (order confirmed by kernel names); the replay index
    comes from the sidecar's replay log. A graphed kernel is never taken for
    an eager one, even with eager keys torch baked into it: its Seq is its
    capture's, the same on every replay.
NCCL kernels with no metadata at all (old traces)
    Still shown on a lane "NCCL kernels (no metadata)": collective from the
    kernel name, Seq by order per collective on the rank; linked across ranks
    only if every rank saw the same sequence (:func:`settle_inferred`).
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from commtag.constants import MIN_LANE_ID, parse_rank_list
from commtag.identity import GroupRow, group_info
from commtag.merge import graphs
from commtag.merge.ids import FLOW_LAUNCH, FLOW_SOURCE, flow_id
from commtag.merge.load import base_ns, event_ns
from commtag.merge.records import CPU_OP_SOURCE, CollectiveInstance, Interner, ranks_of, whole
from commtag.vocab import (
    ANN_CROSS_RANK, ANN_GLOO_WORK, ANN_INFERRED, ANN_LANE, ANN_LANE_ID, ANN_MATCH, ANN_P2P, ANN_P2P_PAIR_SEQ,
    ANN_PG_UID, ANN_RANK, ANN_REPLAY, ANN_SEQ_FROM, C10D_OPS_WITHOUT_GLOO_WORK, COLLECTIVE_NAME_KEY, COMMS_OP,
    CORRELATION_KEY, DST_RANK_KEY, EXTERNAL_ID_KEY, GLOO_CALLER_FAMILIES, GLOO_WORK_FAMILY, GLOO_WORK_PER_MEMBER,
    GRAPH_NODE_ID_KEY, KERNEL_CATEGORY, KERNEL_EAGER_KEYS, LAUNCH_CATEGORIES, NON_COLLECTIVE_NAMES, P2P_COLLECTIVES,
    P2P_FAMILIES, PG_DESC_KEY, PG_ID_KEY, PG_NAME_KEY, PG_RANKS_KEY, RANK_KEY, SEQ_KEY, SPAN_TOLERANCE_NS,
    SRC_RANK_KEY, family, is_graph_launch, nccl_kind,
)

if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import CollectiveAnnotation, RecordedCollective, Sidecar

UNATTRIBUTED_UID = "unattributed"
UNATTRIBUTED_LANE = "NCCL kernels (no metadata)"
UNATTRIBUTED_LANE_ID = MIN_LANE_ID + (1 << 30)


def group_rows(trace: dict, sidecar: Optional[Sidecar]) -> list[GroupRow]:
    """Every group of a rank: the sidecar's table, else rebuilt from distributedInfo's pg_config.

    A sidecar may hold one name several times, once per life of the world
    (a re-init names its groups again), each life with its own uid.
    """
    if sidecar is not None:
        return [GroupRow(uid=pg.uid, name=pg.name, desc=pg.desc, ranks=pg.ranks, backend=pg.backend,
                         lane_id=pg.lane_id, lane_name=pg.lane_name)
                for pg in sidecar.process_groups]
    info = trace.get("distributedInfo") or {}
    rows = []
    for pg in info.get("pg_config") or ():
        ranks = pg.get("ranks")
        if isinstance(ranks, list) and ranks and "pg_name" in pg:
            name = str(pg["pg_name"])
            rows.append(group_info(name, str(pg.get("pg_desc", "")), ranks, str(pg.get("backend_config", ""))))
    return rows


def group_table(rows: Sequence[GroupRow]) -> dict[str, GroupRow]:
    """Groups by pg name, for kernels that name only that: of several lives, the latest (a sidecar lists them in order)."""
    return {row.name: row for row in rows}


class RankFlows:
    """Flow ids of one rank's block (deterministic: derived from the rank and a counter)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._next = 0
        self.out: dict[int, list[int]] = {}
        self.into: dict[int, list[int]] = {}

    def source(self, event: dict) -> int:
        """A flow that ``event`` starts and its lane slice will end."""
        self._next += 1
        fid = flow_id(FLOW_SOURCE, self.rank, self._next)
        self.out.setdefault(id(event), []).append(fid)
        return fid

    def launches(self, n: int) -> range:
        """The ids of the next ``n`` flows from a launch to its device work."""
        first = flow_id(FLOW_LAUNCH, self.rank, self._next + 1)
        self._next += n
        return range(first, first + n)


#: CollectiveAnnotation fields behind OWN_ORDER's eager keys (an annotation has no "commtag rank").
_OWN_FIELDS = (("rank", RANK_KEY), ("seq", SEQ_KEY), ("p2p_pair_seq", ANN_P2P_PAIR_SEQ), ("replay", ANN_REPLAY))
_OWN_FIELD_NAMES = frozenset(name for name, _ in _OWN_FIELDS)
def own_args(annotation: CollectiveAnnotation, **more: object) -> dict:
    """A sidecar annotation's own keys (Seq, Rank, ...), as its eager dict has them."""
    own = {}
    for name, key in _OWN_FIELDS:
        value = getattr(annotation, name)
        if value is not None:
            own[key] = value
    own.update(more)
    return own


def _instance(interner: Interner, rank: int, parts: tuple[dict, dict], start: int, end: int, source: str,
              group: Optional[GroupRow], flow: Optional[int], members: dict[tuple, tuple[int, ...]]) -> CollectiveInstance:
    """The instance whose slices carry ``parts`` (an event's common and own args), with its
    rank and source added. ``members``: the file's member tuples by group (made once per group:
    a world's ranks copied and hashed for each instance grew with the square of the ranks)."""
    event_common, own = parts
    common_args = interner.with_source(event_common, source)
    key = (True, group.uid) if group else (False, str(common_args.get(PG_RANKS_KEY, "[]")))
    ranks = members.get(key)
    if ranks is None:
        ranks = members[key] = interner.shared(tuple(group.ranks) if group else ranks_of(common_args))
    return CollectiveInstance.from_args(
        common_args, rank=rank, seq=whole(own.get(SEQ_KEY), 0), replay=own.get(ANN_REPLAY), group_ranks=ranks,
        start_ns=start, end_ns=end, source=source, own={**own, ANN_RANK: rank}, common_args=common_args,
        source_flow=flow)


class _GlooCall:
    """One recorded call on its way to its gloo events.

    Identity, strongest first: a p2p work runs on the calling thread and starts
    inside the call's c10d op; an async work whose completion the runtime saw on
    a worker thread (``done_tid``) is the event there that holds that moment
    (a worker runs one work at a time); any other work is the one of its family
    that runs inside the call on a worker of its group (each group has its own
    workers, learned from the matches before), taken only when that leaves no
    choice and no other waiting call of the group could have run it. An async
    work whose completion was never seen (gloo's reduce_scatter) is never
    guessed. Time only bounds where to look: a candidate never starts before
    its c10d op.
    """

    __slots__ = ("rec", "group", "op", "uid", "family", "need", "works", "lo", "hi", "on_caller",
                 "done_on_worker", "bounded", "settled")

    def __init__(self, rec: RecordedCollective, group: Optional[GroupRow], op: Optional[tuple], offset: int) -> None:
        ann = rec.annotation
        self.rec = rec
        self.group = group
        self.op = op
        self.uid = ann.pg_uid
        fam = family(ann.collective_name)
        self.family = GLOO_WORK_FAMILY.get(fam, fam)
        self.need = ann.group_size if ann.collective_name in GLOO_WORK_PER_MEMBER else 1
        if op is not None and op[2].get("name") in C10D_OPS_WITHOUT_GLOO_WORK:
            self.need = 0  # its own work is the op's inner gloo:send/recv: a worker event is another call's
        self.works: list[tuple] = []
        #: The call on the trace's clock: from its op's start (or its recorded start) to its recorded end.
        self.lo = op[0] if op is not None else rec.start_ns + offset
        self.hi = rec.end_ns + offset
        self.on_caller = self.family in GLOO_CALLER_FAMILIES
        self.done_on_worker = rec.done_tid is not None and rec.done_tid != rec.tid
        #: Its work ended by ``hi``: a sync call waited for it; an async one saw it complete.
        self.bounded = not ann.async_op or rec.done_tid is not None
        #: Unbounded only: when all its works had surely started (see _gloo_works).
        self.settled: Optional[int] = None


class _Claims:
    """Which bounded gloo calls still waiting for their works could have run each work: a work
    more than one of them could have run is contested. Counted once per work, so asking costs
    what the works asked about cost (comparing each call with every call of its time span grew
    with the square of the calls that share one)."""

    def __init__(self, calls: list[_GlooCall], inside: Callable[[_GlooCall], list[tuple]]) -> None:
        #: A call -> the ids of the works it could have run (whatever group their worker serves).
        self._of: dict[int, list[int]] = {}
        #: A work's id -> how many calls still waiting could have run it.
        self._waiting: Counter[int] = Counter()
        for call in calls:
            ids = self._of[id(call)] = [id(g[2]) for g in inside(call)]
            self._waiting.update(ids)

    def contested(self, works: list[tuple]) -> bool:
        """Could a waiting call other than the one asking (which could have run them all) have run one of ``works``?"""
        return any(self._waiting[id(g[2])] > 1 for g in works)

    def settle(self, call: _GlooCall) -> None:
        """``call`` has its works: it waits for none any more."""
        self._waiting.subtract(self._of.pop(id(call), ()))


def _settle_times(calls: list[_GlooCall], unbounded: list[_GlooCall]) -> None:
    """Each unbounded call's ``settled``: its works were queued before any later call's, so all
    have started by the time the next sync call of its group (first in ``calls``' order among
    those starting no earlier) has returned: that call waited for its own work."""
    later: dict[str, tuple[list[int], list[int]]] = {}
    for uid in {call.uid for call in unbounded}:
        syncs = sorted(((c.lo, order) for order, c in enumerate(calls) if c.uid == uid and not c.on_caller
                        and not c.rec.annotation.async_op))
        firsts = [order for _, order in syncs]  # from each position on, the first in calls' order
        for i in range(len(firsts) - 2, -1, -1):
            firsts[i] = min(firsts[i], firsts[i + 1])
        later[uid] = ([lo for lo, _ in syncs], firsts)
    for call in unbounded:
        los, firsts = later[call.uid]
        at = bisect.bisect_left(los, call.lo)
        call.settled = calls[firsts[at]].hi if at < len(firsts) else None


def _pending(bounded: list[_GlooCall], unbounded: list[_GlooCall]) -> dict[int, tuple[int, int]]:
    """For each bounded call that unbounded calls of its group and family were queued before
    and may not have settled by its start: the earliest of their starts and the works they
    need. One sweep by start time (not each call against every unbounded one)."""
    out: dict[int, tuple[int, int]] = {}
    families: dict[tuple[str, str], list[_GlooCall]] = {}
    for other in unbounded:
        families.setdefault((other.uid, other.family), []).append(other)
    for key, others in families.items():
        opened = sorted(others, key=lambda o: o.lo)
        asking = sorted((c for c in bounded if (c.uid, c.family) == key), key=lambda c: c.lo)
        active: list[tuple[int, int]] = []  # heap of (start, index)
        closing: list[tuple[int, int]] = []  # heap of (settled, index)
        live: set[int] = set()  # indexes of the unbounded calls pending now
        need = i = 0
        for call in asking:
            while i < len(opened) and opened[i].lo < call.lo:
                other = opened[i]
                live.add(i)
                need += other.need
                heapq.heappush(active, (other.lo, i))
                if other.settled is not None:
                    heapq.heappush(closing, (other.settled, i))
                i += 1
            while closing and closing[0][0] <= call.lo:
                gone = heapq.heappop(closing)[1]
                live.discard(gone)
                need -= opened[gone].need
            while active and active[0][1] not in live:
                heapq.heappop(active)
            if live:
                out[id(call)] = (active[0][0], need)
    return out


class _RankAttacher:
    """Attach everything for one trace file of a rank (see module docstring)."""

    def __init__(self, rank: int, trace: dict, sidecar: Optional[Sidecar], offset_ns: int,
                 flows: RankFlows, interner: Interner, annotated: Optional[dict], notes: list[str]) -> None:
        self.rank = rank
        #: What this file's events are left without, said in the merge's report.
        self.notes = notes
        self.interner = interner
        self.annotated = annotated
        #: A sidecar call site's fields (all but its own) -> its common args.
        self.sites: dict[tuple, dict] = {}
        self.trace = trace
        self.sidecar = sidecar
        self.base = base_ns(trace) + offset_ns
        self.offset = offset_ns
        self.flows = flows
        rows = group_rows(trace, sidecar)
        self.groups = group_table(rows)
        self.by_uid = {g.uid: g for g in rows}
        #: Each group's member ranks as the merge's one tuple (see :func:`_instance`).
        self.members: dict[tuple, tuple[int, ...]] = {}
        self.instances: list[CollectiveInstance] = []
        self.taken: set[int] = set()
        self.c10d: dict[int, list[tuple[int, int, dict]]] = {}
        self.gloo: list[tuple[int, int, dict, str, int]] = []
        self.kernels: list[tuple[int, int, dict]] = []
        #: record_param_comms ops of collectives, in start order.
        self.comms_ops: list[tuple[int, int, dict]] = []
        #: pg_config's uid -> pg_name, for an older torch's "Process Group ID".
        self.pg_ids = {pg["uid"]: str(pg["pg_name"]) for pg in (trace.get("distributedInfo") or {}).get("pg_config") or ()
                       if isinstance(pg, dict) and "uid" in pg and "pg_name" in pg}
        self.launches: dict[int, dict] = {}
        #: Eager kernels by "External id" (that of the CPU op that launched them), in start order.
        self.by_external: dict[object, list[tuple[int, int, dict]]] = {}
        #: record_param_comms ops by thread, in start order: inside a c10d op, they launch its kernels.
        self.comms_by_tid: dict[object, list[tuple[int, int, dict]]] = {}
        for e in trace["traceEvents"]:
            # Only slices the timeline places (int pid and tid): a flow to any other would dangle.
            if e.get("ph") != "X" or "ts" not in e or e.get("pid").__class__ is not int or e.get("tid").__class__ is not int:
                continue
            name = e.get("name", "")
            cat = e.get("cat")
            if cat == KERNEL_CATEGORY:
                self.kernels.append((*event_ns(e, self.base), e))
            elif name.startswith("gloo:"):
                self.gloo.append((*event_ns(e, self.base), e, family(name), e.get("tid")))
            elif name.startswith("c10d::"):
                self.c10d.setdefault(e.get("tid"), []).append((*event_ns(e, self.base), e))
            elif name == COMMS_OP:
                op = (*event_ns(e, self.base), e)
                self.comms_by_tid.setdefault(e.get("tid"), []).append(op)
                if (e.get("args") or {}).get(COLLECTIVE_NAME_KEY) not in (None, *NON_COLLECTIVE_NAMES):
                    self.comms_ops.append(op)
            elif cat in LAUNCH_CATEGORIES and is_graph_launch(name):
                corr = (e.get("args") or {}).get(CORRELATION_KEY)
                if corr is not None:
                    self.launches[corr] = e
        self.kernels.sort(key=lambda k: k[0])
        for kernel in self.kernels:  # in start order
            args = kernel[2].get("args") or {}
            if EXTERNAL_ID_KEY in args and not args.get(GRAPH_NODE_ID_KEY):
                self.by_external.setdefault(args[EXTERNAL_ID_KEY], []).append(kernel)
        self.comms_ops.sort(key=lambda o: o[0])
        self.gloo.sort(key=lambda g: g[0])
        for ops in (*self.c10d.values(), *self.comms_by_tid.values()):
            ops.sort(key=lambda o: o[0])

    def _annotate(self, event: dict, parts: tuple[dict, dict]) -> None:
        """Give ``event`` its annotation, ``(common, own)`` args: merged into its args, or
        handed to the writer in ``annotated`` (which encodes a call site's common args once)."""
        args = event.get("args")
        if self.annotated is None:
            if args is None:
                args = event["args"] = {}
            args.update(parts[0])
            args.update(parts[1])
            return
        if args and not (args.keys().isdisjoint(parts[0]) and args.keys().isdisjoint(parts[1])):
            for key in (*parts[0], *parts[1]):  # Kineto's own eager keys, which the annotation restates
                args.pop(key, None)
        self.annotated[id(event)] = parts

    def _site(self, annotation: CollectiveAnnotation) -> dict:
        """The common args of a sidecar annotation's call site (its eager dict is made once per site)."""
        key = tuple([value for name, value in annotation.__dict__.items() if name not in _OWN_FIELD_NAMES])
        found = self.sites.get(key)
        if found is None:
            found = self.sites[key] = self.interner.split(annotation.eager_dict())[0]
        return found

    def run(self) -> list[CollectiveInstance]:
        leftover = self._gloo() if self.sidecar else []
        self._graph_replays()
        eager = [(start, end, k, k["args"], "nccl-kernel") for start, end, k in self.kernels
                 if id(k) not in self.taken and COLLECTIVE_NAME_KEY in (k.get("args") or {})
                 and not k["args"].get(GRAPH_NODE_ID_KEY)]
        records = [call.rec for call in leftover]
        if eager:
            paired = self._eager(eager, records, "kernel order")
        else:
            paired = self._eager(self._comms_ops(), records, f"{COMMS_OP} order")
        for call in leftover:  # an NCCL call no kernel joined: one rank's broadcast launches none, a copy is none
            if id(call.rec.annotation) not in paired:
                self._host_timed(call, self._record_parts(call.rec.annotation), CPU_OP_SOURCE)
        self._unattributed()
        return self.instances

    # -- gloo --------------------------------------------------------------
    def _gloo(self) -> list[_GlooCall]:
        """Join sidecar records to their c10d ops and gloo works, or to the NCCL kernels their
        op launched; return the calls of NCCL groups left for the kernel join (:meth:`_eager`)."""
        calls = []
        for rec in sorted(self.sidecar.collectives, key=lambda r: r.start_ns):
            group = self.by_uid.get(rec.annotation.pg_uid)
            calls.append(_GlooCall(rec, group, self._take_op(rec), self.offset))
        self._gloo_works(calls)
        leftover = []
        for call in calls:
            op, works, ann = call.op, call.works, call.rec.annotation
            backend = call.group.backend if call.group is not None else ""
            kernels = self._launched(op) if op is not None and not works and "nccl" in backend else []
            if kernels:
                self._kernel_timed(call, kernels)
                continue
            if not works and call.group is not None and "gloo" not in backend:
                leftover.append(call)  # NCCL: paired with its kernel by Seq or order, else timed on the host (run)
                continue
            site, own = self._record_parts(ann)
            if call.need and "gloo" in backend and "nccl" not in backend:  # a gloo work not identified: no guess
                site = self.interner.common({**site, ANN_GLOO_WORK: "not identified"})
            self._host_timed(call, (site, own), "gloo")
        return leftover

    def _record_parts(self, annotation: CollectiveAnnotation) -> tuple[dict, dict]:
        """A sidecar annotation as an event's (common, own) args."""
        return self._site(annotation), own_args(annotation)

    def _host_timed(self, call: _GlooCall, parts: tuple[dict, dict], source: str) -> None:
        """The instance of a call timed on the host: by its gloo works, else its c10d op, else its
        record; its op and works carry ``parts``."""
        op, works = call.op, call.works
        for hit in (op, *works):
            if hit is not None:
                self._annotate(hit[2], parts)
        if works:
            timing = (min(w[0] for w in works), max(w[1] for w in works))
        else:
            timing = op[:2] if op is not None else (call.lo, call.hi)
        first = min(works, key=lambda w: w[0]) if works else None
        origin = op if op is not None and (first is None or op[0] <= first[0]) else first
        flow = self.flows.source(origin[2]) if origin is not None else None
        self.instances.append(_instance(self.interner, self.rank, parts, timing[0], timing[1], source, call.group, flow,
                                        self.members))

    def _launched(self, op: tuple) -> list[tuple]:
        """The collective kernels a c10d op launched, by identity: a kernel's "External id" is
        that of the CPU op around its launch, the c10d op or a record_param_comms inside it on
        its thread."""
        start, end, event = op
        inner = self.comms_by_tid.get(event.get("tid"), ())
        ids = [(event.get("args") or {}).get(EXTERNAL_ID_KEY)]
        for s, t, comms in inner[bisect.bisect_left(inner, start, key=lambda o: o[0]):]:
            if s > end:
                break
            if t <= end:
                ids.append((comms.get("args") or {}).get(EXTERNAL_ID_KEY))
        return sorted((k for x in ids if x is not None for k in self.by_external.get(x, ())
                       if id(k[2]) not in self.taken
                       and (COLLECTIVE_NAME_KEY in k[2]["args"] or nccl_kind(k[2].get("name", "")))),
                      key=lambda k: k[0])

    def _kernel_timed(self, call: _GlooCall, kernels: list[tuple]) -> None:
        """The instance of an NCCL call whose kernels its op launched: they carry its annotation."""
        parts = self._record_parts(call.rec.annotation)
        for kernel in kernels:
            self.taken.add(id(kernel[2]))
            self._annotate(kernel[2], parts)
        self.instances.append(_instance(self.interner, self.rank, parts, kernels[0][0], max(k[1] for k in kernels),
                                        "nccl-kernel", call.group, self.flows.source(kernels[0][2]), self.members))

    def _take_op(self, rec: RecordedCollective) -> Optional[tuple]:
        """The call's ``c10d::`` op: the first of its family on the calling thread that starts
        within the call. (The recorded end of an async call is its completion, which can come
        before the op returns: only the op's start is compared.)"""
        ops = self.c10d.get(rec.tid, ())
        fam = family(rec.annotation.collective_name)
        lo, hi = rec.start_ns + self.offset - SPAN_TOLERANCE_NS, rec.end_ns + self.offset + SPAN_TOLERANCE_NS
        # Ops are sorted by start: skip those starting before the call (a scan from the first was quadratic).
        for op in ops[bisect.bisect_left(ops, lo, key=lambda o: o[0]):]:
            if op[0] > hi:
                break
            if id(op[2]) not in self.taken and family(op[2].get("name", "")) == fam:
                self.taken.add(id(op[2]))
                return op
        return None

    def _gloo_works(self, calls: list[_GlooCall]) -> None:
        """Find each call's ``gloo:`` work events, by identity first (see :class:`_GlooCall`)."""
        owner: dict[int, str] = {}  # worker thread -> the group it serves (each group has its own)
        by_tid: dict[int, list[tuple]] = {}
        for g in self.gloo:
            by_tid.setdefault(g[4], []).append(g)
        for call in calls:
            if call.on_caller and call.op is not None:
                # p2p runs on the calling thread and starts inside its op: nesting on one thread.
                op_start, op_end = call.op[0], call.op[1]
                mine = by_tid.get(call.rec.tid, [])
                for g in mine[bisect.bisect_left(mine, op_start, key=lambda g: g[0]):]:
                    if g[0] > op_end:
                        break
                    if g[3] == call.family and id(g[2]) not in self.taken:
                        self._take_work(call, g, None)
                        break
            elif call.done_on_worker:
                # Its completion was seen on a worker thread, inside the work's event there: a
                # worker runs one work at a time, so that is the last one starting before it
                # (two looked at, for the clocks' rounding).
                t = call.hi
                theirs = by_tid.get(call.rec.done_tid, [])
                last = bisect.bisect_right(theirs, t + SPAN_TOLERANCE_NS, key=lambda g: g[0])
                near = [g for g in theirs[max(0, last - 2):last]
                        if g[3] == call.family and id(g[2]) not in self.taken and g[0] >= call.lo
                        and t <= g[1] + SPAN_TOLERANCE_NS]
                if near:
                    self._take_work(call, min(near, key=lambda g: max(g[0] - t, t - g[1], 0)), owner)
        # The rest (sync calls, async ones completed before their callback was added, a list
        # reduce_scatter's other works): gloo works of the call's family that run inside the
        # call on a worker thread of its group (or of no group known yet), when unambiguous.
        # An async call whose completion was never seen (gloo's reduce_scatter works have no
        # future) is not bounded: its work could be any later one of its group's, so none is
        # taken for it (start order is not queue order when two workers dequeue at once), and
        # no later call of its group takes a work it could have run.
        unbounded = [call for call in calls if call.need and not call.on_caller and not call.bounded]
        _settle_times(calls, unbounded)
        bounded = [call for call in calls if call.need and not call.on_caller and call.bounded]
        claims = _Claims(bounded, lambda call: self._inside(call, {}))
        pending = _pending(bounded, unbounded)
        for owned_only in (False, True):
            progress = True
            while progress and bounded:
                progress = False
                waiting = []
                for call in bounded:
                    found = self._inside(call, owner)
                    if owned_only:
                        found = [g for g in found if owner.get(g[4]) == call.uid]
                    if (len(found) != call.need or claims.contested(found)
                            or self._queued_before(call, pending.get(id(call)), owner)):
                        waiting.append(call)
                        continue
                    for g in found:
                        self._take_work(call, g, owner)
                    claims.settle(call)
                    progress = True
                bounded = waiting

    def _queued_before(self, call: _GlooCall, pending: Optional[tuple[int, int]], owner: dict[int, str]) -> bool:
        """Were works of unbounded calls of its group queued before ``call`` (``pending``: the
        earliest of their starts, and how many works they need) still unstarted when it was?"""
        if pending is None:
            return False
        since, need = pending
        started = 0
        for g in self.gloo[bisect.bisect_left(self.gloo, since, key=lambda g: g[0]):
                           bisect.bisect_left(self.gloo, call.lo, key=lambda g: g[0])]:
            if (g[3] == call.family and id(g[2]) not in self.taken and g[4] != call.rec.tid
                    and owner.get(g[4], call.uid) == call.uid):
                started += 1
                if started >= need:
                    return False
        return True

    def _inside(self, call: _GlooCall, owner: dict[int, str]) -> list[tuple]:
        """Untaken works of the call's family that start inside it (and for a sync call also
        end inside it) on a worker thread that serves its group or no known group."""
        found = []
        start_at = bisect.bisect_left(self.gloo, call.lo, key=lambda g: g[0])
        for g in self.gloo[start_at:]:
            if g[0] > call.hi + SPAN_TOLERANCE_NS:
                break
            if (g[3] == call.family and g[4] != call.rec.tid and id(g[2]) not in self.taken
                    and owner.get(g[4], call.uid) == call.uid
                    and (call.rec.annotation.async_op or g[1] <= call.hi + SPAN_TOLERANCE_NS)):
                found.append(g)
        return found

    def _take_work(self, call: _GlooCall, work: tuple, owner: Optional[dict[int, str]]) -> None:
        self.taken.add(id(work[2]))
        call.works.append(work)
        call.need -= 1
        if owner is not None:
            owner.setdefault(work[4], call.uid)

    # -- eager NCCL kernels, or the CPU ops that record their keys ----------
    def _eager(self, calls: list[tuple[int, int, dict, dict, str]], records: list, order: str) -> set[int]:
        """Instances of ``calls``: (start, end, the event timing it, the eager keys, source), in
        call order; ``order``: what a Seq derived from that order is said to come from. Returns
        the ids of the records' annotations it paired with a call."""
        by_group: dict[str, list[CollectiveAnnotation]] = {}
        by_seq: dict[tuple[str, str, int], list[CollectiveAnnotation]] = {}
        for rec in records:
            by_group.setdefault(rec.annotation.pg_name, []).append(rec.annotation)
            key = (rec.annotation.pg_name, rec.annotation.collective_name, rec.annotation.seq)
            by_seq.setdefault(key, []).append(rec.annotation)
        derived: dict[tuple[str, bool], int] = {}
        used: dict[str, int] = {}
        paired: set[int] = set()
        for start, end, e, args, source in calls:
            self.taken.add(id(e))
            pg_name = self._pg_name(args)
            record = None
            if SEQ_KEY in args:  # the call's own Seq names its record
                key = (pg_name, args[COLLECTIVE_NAME_KEY], whole(args[SEQ_KEY], -1))
                same = [a for a in by_seq.get(key, ())
                        if id(a) not in paired]
                record = same[0] if same else None
            else:
                queue = by_group.get(pg_name, ())
                k = used.get(pg_name, 0)
                while k < len(queue) and id(queue[k]) in paired:
                    k += 1
                if k < len(queue) and queue[k].collective_name == args[COLLECTIVE_NAME_KEY]:
                    record = queue[k]
                    k += 1
                used[pg_name] = k
            if record is not None:
                paired.add(id(record))
                parts = self._record_parts(record)
            else:
                parts = self.interner.split(self._complete(args, derived, order))
            self._annotate(e, parts)
            group = self.by_uid.get(str(parts[0][ANN_PG_UID]))
            self.instances.append(_instance(self.interner, self.rank, parts, start, end, source, group, self.flows.source(e), self.members))
        return paired

    def _comms_ops(self) -> list[tuple[int, int, dict, dict, str]]:
        """The record_param_comms ops as calls: each timed by its NCCL kernel (the same
        "External id") where one was profiled without the keys, else by the op itself."""
        calls = []
        for start, end, op in self.comms_ops:
            args = op["args"]
            kernel = next((k for k in self.by_external.get(args.get(EXTERNAL_ID_KEY), ())
                           if id(k[2]) not in self.taken and nccl_kind(k[2].get("name", ""))), None)
            calls.append((*kernel, args, "nccl-kernel") if kernel else (start, end, op, args, CPU_OP_SOURCE))
        return calls

    def _pg_name(self, args: dict) -> str:
        """The group's name: "Process Group Name", else an older torch's integer "Process Group ID"."""
        if PG_NAME_KEY in args or PG_ID_KEY not in args:
            return str(args.get(PG_NAME_KEY, ""))
        pg_id = args[PG_ID_KEY]
        return self.pg_ids.get(pg_id, str(pg_id))

    def _complete(self, args: dict, derived: dict, order: str) -> dict:
        """Kineto's eager keys, normalized and completed with lane and cross-rank key."""
        eager = {key: args[key] for key in KERNEL_EAGER_KEYS if key in args}
        pg_name = self._pg_name(args)
        if pg_name and PG_NAME_KEY not in eager:  # an older torch's "Process Group ID"
            eager[PG_NAME_KEY] = pg_name
        group = self.groups.get(pg_name)
        if group is None:
            ranks = parse_rank_list(str(args.get(PG_RANKS_KEY, "[]"))) or []
            group = group_info(pg_name, str(args.get(PG_DESC_KEY, "")), ranks, "nccl")
            self.groups[pg_name] = group
            self.by_uid[group.uid] = group
        p2p = eager[COLLECTIVE_NAME_KEY] in P2P_COLLECTIVES or DST_RANK_KEY in eager or SRC_RANK_KEY in eager
        if SEQ_KEY not in eager:
            n = derived[(pg_name, p2p)] = derived.get((pg_name, p2p), 0) + 1
            eager[SEQ_KEY] = n
            eager[ANN_SEQ_FROM] = order
        eager.update({
            ANN_LANE_ID: group.lane_id, ANN_LANE: group.lane_name,
            ANN_PG_UID: group.uid, ANN_P2P: p2p,
        })
        return eager

    # -- graph replays -----------------------------------------------------
    def _graph_replays(self) -> None:
        captures = self.sidecar.captures if self.sidecar else []
        if not captures:
            return
        kernels = [e for _, _, e in self.kernels]
        result = graphs.match(kernels, self.launches, captures, self.base - self.offset)
        matches = result.matches
        self.notes += result.notes
        reasons = Counter(unmatched.reason for unmatched in result.unmatched)
        self.notes += [f"{n} graph replay(s) carrying captured collectives left unannotated: {reason}"
                       for reason, n in reasons.items()]
        grouped: dict[tuple[int, int, int], list[graphs.ReplayMatch]] = {}
        for m in matches:
            grouped.setdefault((m.capture_id, m.collective, m.replay), []).append(m)
        sites: dict[tuple[int, int, str], dict] = {}
        for (cap_id, ci, replay), group in sorted(grouped.items(), key=lambda item: item[0]):
            annotation = group[0].capture.collectives[ci].annotation
            own = own_args(annotation, **{ANN_REPLAY: replay})
            spans = [event_ns(m.event, self.base) for m in group]
            for m in group:
                self.taken.add(id(m.event))
                site = sites.get((cap_id, ci, m.method))
                if site is None:
                    site = sites[(cap_id, ci, m.method)] = self.interner.split(
                        {**annotation.eager_dict(), ANN_MATCH: m.method})[0]
                self._annotate(m.event, (site, own))
            first = group[min(zip(spans, range(len(group))))[1]]
            self.instances.append(_instance(
                self.interner, self.rank, (sites[(cap_id, ci, first.method)], own),
                min(s[0] for s in spans), max(s[1] for s in spans),
                "graph-replay", self.by_uid.get(annotation.pg_uid), self.flows.source(first.event), self.members,
            ))

    # -- kernels with no metadata -----------------------------------------
    def _unattributed(self) -> None:
        counts: dict[str, int] = {}
        world = (self.trace.get("distributedInfo") or {}).get("world_size") or 1
        for start, end, e in self.kernels:
            if id(e) in self.taken:
                continue
            kind = nccl_kind(e.get("name", ""))
            if kind is None:
                continue
            self.taken.add(id(e))
            n = counts[kind] = counts.get(kind, 0) + 1
            eager = {
                COLLECTIVE_NAME_KEY: kind, SEQ_KEY: n,
                ANN_LANE_ID: UNATTRIBUTED_LANE_ID, ANN_LANE: UNATTRIBUTED_LANE,
                ANN_PG_UID: f"{UNATTRIBUTED_UID}:{kind}", ANN_P2P: kind in P2P_FAMILIES,
                ANN_INFERRED: "collective from the kernel name; group unknown; Seq = order on this rank",
            }
            inst = _instance(self.interner, self.rank, self.interner.split(eager), start, end, "nccl-kernel", None, self.flows.source(e),
                             self.members)
            inst.group_size = int(world)
            self.instances.append(inst)


def attach(rank: int, trace: dict, sidecar: Optional[Sidecar], flows: RankFlows, *,
           offset_ns: int = 0, interner: Optional[Interner] = None,
           annotated: Optional[dict[int, tuple[dict, dict]]] = None,
           notes: Optional[list[str]] = None) -> list[CollectiveInstance]:
    """Annotate one trace file's events in place; return its collective instances.

    ``notes``: where to say what the file's events are left without (graph replays that
    could not be matched, copies of captured collectives not placed).

    ``annotated``: instead of merging each annotation into its event's args,
    map ``id(event)`` to its ``(common, own)`` args there (Kineto's copies of
    eager keys are dropped from the args): the writer encodes a call site's
    common args once, not per event. ``interner``: the merge's, which its instances share
    equal values through (a new one when omitted).
    """
    return _RankAttacher(rank, trace, sidecar, offset_ns, flows, interner or Interner(), annotated,
                         [] if notes is None else notes).run()


def settle_inferred(instances: Sequence[CollectiveInstance]) -> None:
    """Keep cross-rank links of metadata-less kernels only where every rank agrees.

    Their Seq is a per-rank count per collective kind, which names the same
    instance on every rank only if all ranks saw the same kernels; otherwise
    each rank's get a rank-private uid so that nothing matches them.
    """
    seqs: dict[str, dict[int, int]] = {}
    for inst in instances:
        if inst.pg_uid.startswith(UNATTRIBUTED_UID + ":"):
            per_rank = seqs.setdefault(inst.pg_uid, {})
            per_rank[inst.rank] = max(per_rank.get(inst.rank, 0), inst.seq)
    agreed = {uid for uid, per_rank in seqs.items() if len(set(per_rank.values())) == 1}
    for inst in instances:
        if inst.pg_uid in seqs and inst.pg_uid not in agreed:
            inst.pg_uid = f"{inst.pg_uid}:rank{inst.rank}"
            inst.args[ANN_PG_UID] = inst.pg_uid
            inst.args[ANN_CROSS_RANK] = False
