"""Attach collective annotations to a rank's trace events; make CollectiveInstances.

:func:`is_candidate` is the one rule for which events attach reads (the
converter keeps only those); :func:`attach` indexes them once
(:class:`commtag.merge.rank.events.FileEvents`) and runs one pass per source,
in this order (an event gets at most one annotation):

gloo (sidecar records; :mod:`commtag.merge.rank.gloo`)
    A recorded call is joined to the ``c10d::*`` CPU op of its family that
    starts within it on its thread, then to the ``gloo:*`` work event(s) that
    ran it, by identity (see :class:`commtag.merge.rank.gloo.GlooCall`): p2p works start inside the
    op on the calling thread; an async work is the event on the worker thread
    that the runtime saw complete it, holding that moment; any other work is
    the one of its family inside the call on a worker of its group, taken only
    when no other event could be it. A call whose work is not identified keeps
    its op and says ``"commtag gloo work": "not identified"``. The slice's time
    is its works' span, else the op's, else the recorded span.
eager NCCL kernels (:mod:`commtag.merge.rank.eager`)
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
graph-replayed kernels (:mod:`commtag.merge.rank.replays`, run before the eager pass)
    Joined to the captured collectives of the sidecar exactly where the
    kernel's ids allow (torch's own annotation, tools ids, node ids), then
    replay by replay (order confirmed by kernel names); the replay index
    comes from the sidecar's replay log. A graphed kernel is never taken for
    an eager one, even with eager keys torch baked into it: its Seq is its
    capture's, the same on every replay.
NCCL kernels with no metadata at all (old traces)
    Still shown on a lane "NCCL kernels (no metadata)" (:data:`commtag.identity.UNATTRIBUTED_LANE`): collective from the
    kernel name, Seq by order per collective on the rank; linked across ranks
    only if every rank saw the same sequence (:func:`settle_inferred`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from commtag.identity import UNATTRIBUTED_LANE, UNATTRIBUTED_LANE_ID, UNATTRIBUTED_UID
from commtag.merge.rank.eager import comms_ops, kernel_calls, pair_calls
from commtag.merge.rank.events import FileEvents, RankFlows, make_instance
from commtag.merge.rank.gloo import join_recorded
from commtag.merge.rank.captures import CapturedKernels
from commtag.merge.rank.replays import attach_replays
from commtag.merge.records import CPU_OP_SOURCE, CollectiveInstance, Interner
from commtag.vocab import (
    ANN_CROSS_RANK, ANN_INFERRED, ANN_LANE, ANN_LANE_ID, ANN_P2P, ANN_PG_UID, C10D_OP_PREFIX, COLLECTIVE_NAME_KEY,
    COMMS_OP, GLOO_WORK_PREFIX, GRAPH_NODE_ID_KEY, KERNEL_CATEGORY, LAUNCH_CATEGORIES, P2P_FAMILIES, SEQ_KEY, is_graph_launch, nccl_kind,
)

if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import Sidecar


def args_decide(name: str, cat: Optional[str]) -> bool:
    """Can an event's args change what :func:`is_candidate` says of it? Only a kernel's (its eager keys,
    its graph node id) and a record_param_comms op's: of any other, its name and category decide, so
    the converter asks once per name and category."""
    return cat == KERNEL_CATEGORY or name == COMMS_OP


def is_candidate(name: str, cat: Optional[str], args: Optional[dict], captured: CapturedKernels) -> bool:
    """Might attach annotate this slice? The one rule for which events the passes below read.

    ``captured``: the kernels the file's sidecar saw collectives capture into graphs
    (:class:`commtag.merge.rank.captures.CapturedKernels`): a one-rank communicator's are not
    named like NCCL's. ``args`` is read only where :func:`args_decide`.
    """
    if cat == KERNEL_CATEGORY:
        return (bool(args and (COLLECTIVE_NAME_KEY in args or args.get(GRAPH_NODE_ID_KEY))) or nccl_kind(name) is not None
                or bool(captured) and name in captured)
    if cat in LAUNCH_CATEGORIES:
        return is_graph_launch(name)
    if name == COMMS_OP:
        return bool(args and COLLECTIVE_NAME_KEY in args)
    return name.startswith(C10D_OP_PREFIX) or name.startswith(GLOO_WORK_PREFIX)


def attach(rank: int, trace: dict, sidecar: Optional[Sidecar], flows: RankFlows, *,
           offset_ns: int = 0, interner: Optional[Interner] = None,
           annotated: Optional[dict[int, tuple[dict, dict]]] = None,
           notes: Optional[list[str]] = None, source: str = "its trace",
           blind: Optional[list[tuple[int, int]]] = None) -> list[CollectiveInstance]:
    """Annotate one trace file's events in place; return its collective instances.

    ``notes``: where to say what the file's events are left without (graph replays that
    could not be matched, copies of captured collectives not placed, records it cannot read);
    ``source``: the file, as those notes name it; ``blind``: where to put the times (ns) of the
    records it cannot read.

    ``annotated``: instead of merging each annotation into its event's args,
    map ``id(event)`` to its ``(common, own)`` args there (Kineto's copies of
    eager keys are dropped from the args): the writer encodes a call site's
    common args once, not per event. ``interner``: the merge's, which its instances share
    equal values through (a new one when omitted).
    """
    events = FileEvents(rank, trace, sidecar, offset_ns, flows, interner or Interner(), annotated,
                        [] if notes is None else notes)
    leftover = join_recorded(events) if sidecar else []
    attach_replays(events)
    records = [call.rec for call in leftover]
    eager = kernel_calls(events)
    if eager:
        paired = pair_calls(events, eager, records, "kernel order")
    else:
        paired = pair_calls(events, comms_ops(events), records, f"{COMMS_OP} order")
    for call in leftover:  # an NCCL call no kernel joined: one rank's broadcast launches none, a copy is none
        if id(call.rec.annotation) not in paired:
            events.host_timed(call, events.record_parts(call.rec.annotation), CPU_OP_SOURCE)
    _unattributed(events)
    events.say_unreadable(source)
    if blind is not None:
        blind += events.blind
    return events.instances


def _unattributed(events: FileEvents) -> None:
    """The last pass: NCCL kernels no source claimed, on the no-metadata lane, Seq by order per kind."""
    counts: dict[str, int] = {}
    world = (events.trace.get("distributedInfo") or {}).get("world_size") or 1
    for start, end, e in events.kernels:
        if id(e) in events.taken:
            continue
        kind = nccl_kind(e.get("name", ""))
        if kind is None:
            continue
        events.taken.add(id(e))
        n = counts[kind] = counts.get(kind, 0) + 1
        eager = {
            COLLECTIVE_NAME_KEY: kind, SEQ_KEY: n,
            ANN_LANE_ID: UNATTRIBUTED_LANE_ID, ANN_LANE: UNATTRIBUTED_LANE,
            ANN_PG_UID: f"{UNATTRIBUTED_UID}:{kind}", ANN_P2P: kind in P2P_FAMILIES,
            ANN_INFERRED: "collective from the kernel name; group unknown; Seq = order on this rank",
        }
        inst = make_instance(events.interner, events.rank, events.interner.split(eager), start, end, "nccl-kernel", None, events.flows.source(e),
                         events.members)
        inst.group_size = int(world)
        events.instances.append(inst)


def settle_inferred(instances: Sequence[CollectiveInstance],
                    seqs: Optional[dict[str, dict[int, int]]] = None) -> None:
    """Keep cross-rank links of metadata-less kernels only where every rank agrees.

    Their Seq is a per-rank count per collective kind, which names the same
    instance on every rank only if all ranks saw the same kernels; otherwise
    each rank's get a rank-private uid so that nothing matches them. ``seqs``:
    every rank's :func:`inferred_seqs` where ``instances`` are only some ranks' (a merge worker's).
    """
    if seqs is None:
        seqs = inferred_seqs(instances)
    agreed = {uid for uid, per_rank in seqs.items() if len(set(per_rank.values())) == 1}
    for inst in instances:
        if inst.pg_uid in seqs and inst.pg_uid not in agreed:
            inst.pg_uid = f"{inst.pg_uid}:rank{inst.rank}"
            inst.args[ANN_PG_UID] = inst.pg_uid
            inst.args[ANN_CROSS_RANK] = False


def inferred_seqs(instances: Iterable[CollectiveInstance]) -> dict[str, dict[int, int]]:
    """Per metadata-less kernel uid, each rank's last Seq of it (what :func:`settle_inferred` compares)."""
    seqs: dict[str, dict[int, int]] = {}
    for inst in instances:
        if inst.pg_uid.startswith(UNATTRIBUTED_UID + ":"):
            per_rank = seqs.setdefault(inst.pg_uid, {})
            per_rank[inst.rank] = max(per_rank.get(inst.rank, 0), inst.seq)
    return seqs
