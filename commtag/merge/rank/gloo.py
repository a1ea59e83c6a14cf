"""gloo collectives: a sidecar's recorded calls joined to their c10d ops and gloo work events.

A recorded call is joined to the ``c10d::*`` CPU op of its family that starts
within it on its thread (:func:`_take_op`), then to the ``gloo:*`` work
event(s) that ran it, by identity (see :class:`GlooCall`). A call of an NCCL
group takes the kernels its op launched (:func:`commtag.merge.rank.eager.launched`);
one none joined is left to the eager pass. The slice of a gloo call is timed
by its works' span, else its op's, else the recorded span; a call whose work
is not identified keeps its op and says ``"commtag gloo work": "not identified"``.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from typing import TYPE_CHECKING, Callable, Optional

from commtag.identity import GroupRow
from commtag.merge.rank.eager import kernel_timed, launched
from commtag.merge.rank.events import FileEvents
from commtag.vocab import (
    ANN_GLOO_WORK, ANN_UNFINISHED, C10D_OPS_WITHOUT_GLOO_WORK, GLOO_CALLER_FAMILIES, GLOO_SHAPED_FAMILIES,
    GLOO_WORK_END_LAG_NS, GLOO_WORK_FAMILY, GLOO_WORK_PER_MEMBER, INPUT_DIMS_KEY, SPAN_TOLERANCE_NS, UNFINISHED_END,
    family,
)

if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import RecordedCollective


class GlooCall:
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
                 "done_on_worker", "bounded", "settled", "sizes")

    def __init__(self, rec: RecordedCollective, group: Optional[GroupRow], op: Optional[tuple], offset: int) -> None:
        ann = rec.annotation
        self.rec = rec
        self.group = group
        self.op = op
        self.uid = ann.pg_uid
        fam = family(ann.collective_name)
        self.family = GLOO_WORK_FAMILY.get(fam, fam)
        self.need = ann.group_size if ann.collective_name in GLOO_WORK_PER_MEMBER else 1
        #: The element counts each of its works may show (complex tensors show half the recorded
        #: count): the input for a call of one work, one member's chunk (the output) for a list
        #: reduce_scatter's; None where a work's shapes do not tell (see GLOO_SHAPED_FAMILIES).
        shown = ann.out_msg_nelems if ann.collective_name in GLOO_WORK_PER_MEMBER else \
            ann.in_msg_nelems if self.need == 1 else None
        self.sizes = (shown, shown / 2) if self.family in GLOO_SHAPED_FAMILIES and shown is not None else None
        if op is not None and op[2].get("name") in C10D_OPS_WITHOUT_GLOO_WORK:
            self.need = 0  # its own work is the op's inner gloo:send/recv: a worker event is another call's
        self.works: list[tuple] = []
        #: The call on the trace's clock: from its op's start (or its recorded start) to its recorded end.
        self.lo = op[0] if op is not None else rec.start_ns + offset
        self.hi = rec.end_ns + offset
        self.on_caller = self.family in GLOO_CALLER_FAMILIES
        self.done_on_worker = rec.done_tid is not None and rec.done_tid != rec.tid
        #: Its work ended by ``hi``: a sync call waited for it; an async one saw it complete.
        self.bounded = (not ann.async_op or rec.done_tid is not None) and not rec.unfinished
        #: Unbounded only: when all its works had surely started (see _settle_times).
        self.settled: Optional[int] = None


class _Claims:
    """Which bounded gloo calls still waiting for their works could have run each work: a work
    more than one of them could have run is contested. Counted once per work, so asking costs
    what the works asked about cost, not a comparison of each call with every call of its span."""

    def __init__(self, calls: list[GlooCall], inside: Callable[[GlooCall], list[tuple]]) -> None:
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

    def settle(self, call: GlooCall) -> None:
        """``call`` has its works: it waits for none any more."""
        self._waiting.subtract(self._of.pop(id(call), ()))


def _settle_times(calls: list[GlooCall], unbounded: list[GlooCall]) -> None:
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


def _pending(bounded: list[GlooCall], unbounded: list[GlooCall]) -> dict[int, tuple[int, int]]:
    """For each bounded call that unbounded calls of its group and family were queued before
    and may not have settled by its start: the earliest of their starts and the works they
    need. One sweep by start time (not each call against every unbounded one)."""
    out: dict[int, tuple[int, int]] = {}
    families: dict[tuple[str, str], list[GlooCall]] = {}
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


def join_recorded(events: FileEvents) -> list[GlooCall]:
    """Join sidecar records to their c10d ops and gloo works, or to the NCCL kernels their
    op launched; return the calls of NCCL groups left for the kernel join (:func:`commtag.merge.rank.eager.pair_calls`)."""
    calls = []
    recorded = events.sidecar.collectives if events.sidecar is not None else []  # no sidecar: nothing recorded
    for rec in sorted(recorded, key=lambda r: r.start_ns):
        group = events.by_uid.get(rec.annotation.pg_uid)
        calls.append(GlooCall(rec, group, _take_op(events, rec), events.offset))
    _gloo_works(events, calls)
    leftover = []
    for call in calls:
        op, works, ann = call.op, call.works, call.rec.annotation
        backend = call.group.backend if call.group is not None else ""
        kernels = launched(events, op) if op is not None and not works and "nccl" in backend else []
        if kernels:
            kernel_timed(events, call, kernels)
            continue
        if not works and call.group is not None and "gloo" not in backend:
            leftover.append(call)  # NCCL: paired with its kernel by Seq or order, else timed on the host (run)
            continue
        site, own = events.record_parts(ann)
        if call.need and "gloo" in backend and "nccl" not in backend:  # a gloo work not identified: no guess
            site = events.interner.common({**site, ANN_GLOO_WORK: "not identified"})
        if call.rec.unfinished:
            site = events.interner.common({**site, ANN_UNFINISHED: UNFINISHED_END})
        events.host_timed(call, (site, own), "gloo")
    return leftover


def _take_op(events: FileEvents, rec: RecordedCollective) -> Optional[tuple]:
    """The call's ``c10d::`` op: the first of its family on the calling thread that starts
    within the call. (The recorded end of an async call is its completion, which can come
    before the op returns: only the op's start is compared.)"""
    ops = events.c10d.get(rec.tid, ())
    fam = family(rec.annotation.collective_name)
    lo, hi = rec.start_ns + events.offset - SPAN_TOLERANCE_NS, rec.end_ns + events.offset + SPAN_TOLERANCE_NS
    # Ops are sorted by start: skip those starting before the call (a scan from the first would be quadratic).
    for op in ops[bisect.bisect_left(ops, lo, key=lambda o: o[0]):]:
        if op[0] > hi:
            break
        if id(op[2]) not in events.taken and family(op[2].get("name", "")) == fam:
            events.taken.add(id(op[2]))
            return op
    return None


def _gloo_works(events: FileEvents, calls: list[GlooCall]) -> None:
    """Find each call's ``gloo:`` work events, by identity first (see :class:`GlooCall`)."""
    if not events.gloo:  # a file of NCCL groups only: no call has a work to find, nothing to weigh
        return
    owner: dict[int, str] = {}  # worker thread -> the group it serves (each group has its own)
    by_tid: dict[int, list[tuple]] = {}
    for g in events.gloo:
        by_tid.setdefault(g[4], []).append(g)
    for call in calls:
        if call.on_caller and call.op is not None:
            # p2p runs on the calling thread and starts inside its op: nesting on one thread.
            op_start, op_end = call.op[0], call.op[1]
            mine = by_tid.get(call.rec.tid, [])
            for g in mine[bisect.bisect_left(mine, op_start, key=lambda g: g[0]):]:
                if g[0] > op_end:
                    break
                if g[3] == call.family and id(g[2]) not in events.taken:
                    _take_work(events, call, g, None)
                    break
        elif call.done_on_worker and call.rec.done_tid is not None:  # (done_on_worker: it is)
            # Its completion was seen on a worker thread, inside the work's event there: a
            # worker runs one work at a time, so that is the last one starting before it
            # (two looked at, for the clocks' rounding).
            t = call.hi
            theirs = by_tid.get(call.rec.done_tid, [])
            last = bisect.bisect_right(theirs, t + SPAN_TOLERANCE_NS, key=lambda g: g[0])
            near = [g for g in theirs[max(0, last - 2):last]
                    if g[3] == call.family and id(g[2]) not in events.taken and g[0] >= call.lo
                    and t <= g[1] + SPAN_TOLERANCE_NS]
            if near:
                _take_work(events, call, min(near, key=lambda g: max(g[0] - t, t - g[1], 0)), owner)
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
    claims = _Claims(bounded, lambda call: _inside(events, call, {}))
    pending = _pending(bounded, unbounded)
    for owned_only in (False, True):
        progress = True
        while progress and bounded:
            progress = False
            waiting = []
            for call in bounded:
                found = _inside(events, call, owner)
                if owned_only:
                    found = [g for g in found if owner.get(g[4]) == call.uid]
                if (len(found) != call.need or claims.contested(found)
                        or _queued_before(events, call, pending.get(id(call)), owner)):
                    waiting.append(call)
                    continue
                for g in found:
                    _take_work(events, call, g, owner)
                claims.settle(call)
                progress = True
            bounded = waiting


def _queued_before(events: FileEvents, call: GlooCall, pending: Optional[tuple[int, int]],
                   owner: dict[int, str]) -> bool:
    """Were works of unbounded calls of its group queued before ``call`` (``pending``: the
    earliest of their starts, and how many works they need) still unstarted when it was?"""
    if pending is None:
        return False
    since, need = pending
    started = 0
    for g in events.gloo[bisect.bisect_left(events.gloo, since, key=lambda g: g[0]):
                         bisect.bisect_left(events.gloo, call.lo, key=lambda g: g[0])]:
        if (g[3] == call.family and id(g[2]) not in events.taken and g[4] != call.rec.tid
                and owner.get(g[4], call.uid) == call.uid):
            started += 1
            if started >= need:
                return False
    return True


def _inside(events: FileEvents, call: GlooCall, owner: dict[int, str]) -> list[tuple]:
    """Untaken works of the call's family that start inside it (a sync call's also end by
    :data:`GLOO_WORK_END_LAG_NS` after it) on a worker thread that serves its group or no known group."""
    found = []
    start_at = bisect.bisect_left(events.gloo, call.lo, key=lambda g: g[0])
    for g in events.gloo[start_at:]:
        if g[0] > call.hi + SPAN_TOLERANCE_NS:
            break
        if (g[3] == call.family and g[4] != call.rec.tid and id(g[2]) not in events.taken
                and owner.get(g[4], call.uid) == call.uid
                and (call.rec.annotation.async_op or g[1] <= call.hi + GLOO_WORK_END_LAG_NS)
                and (call.sizes is None or _shown_nelems(g[2]) in (None, *call.sizes))):
            found.append(g)
    return found


def _shown_nelems(event: dict) -> Optional[int]:
    """The elements of all inputs a work event shows in its "Input Dims"; None where it shows none."""
    dims = (event.get("args") or {}).get(INPUT_DIMS_KEY)
    if not isinstance(dims, list) or not dims:
        return None
    total = 0
    for shape in dims:
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            return None
        count = 1
        for d in shape:
            count *= d
        total += count
    return total


def _take_work(events: FileEvents, call: GlooCall, work: tuple, owner: Optional[dict[int, str]]) -> None:
    events.taken.add(id(work[2]))
    call.works.append(work)
    call.need -= 1
    if owner is not None:
        owner.setdefault(work[4], call.uid)
