"""Eager NCCL collectives: kernels (or record_param_comms ops) with the metadata torch wrote.

A recorded call takes the kernels its ``c10d::`` op launched, by identity
(:func:`launched`: a kernel's "External id" is the op's, or that of the
record_param_comms inside it). Other kernels keep Kineto's own metadata
(:func:`pair_calls`); the sidecar record of the same group, collective and
Seq (by identity, not call order: a call recorded earlier on another thread
keeps its own kernel; k-th with k-th only where a kernel carries no Seq)
supplies the exact uid, else they are completed from distributedInfo's
pg_config and the kernel order per group (``"commtag seq from": "kernel
order"``). When no kernel of the file carries metadata, the
record_param_comms ops stand for the calls (:func:`comms_ops`), timed by
their NCCL kernel (the same "External id") where there is one, else by the
op (host time: :data:`commtag.merge.records.CPU_OP_SOURCE`). An older
torch's integer "Process Group ID" is read through pg_config's uid.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Optional

from commtag.constants import parse_rank_list
from commtag.identity import group_info
from commtag.merge.rank.checks import record_problem
from commtag.merge.rank.events import FileEvents, HostCall, make_instance, mark_nccl2, with_launch
from commtag.merge.records import CPU_OP_SOURCE, whole
from commtag.vocab import (
    ANN_LANE, ANN_LANE_ID, ANN_P2P, ANN_PG_UID, ANN_SEQ_FROM, COLLECTIVE_NAME_KEY, DST_RANK_KEY, EXTERNAL_ID_KEY,
    GRAPH_NODE_ID_KEY, IN_SPLIT_KEY, KERNEL_EAGER_KEYS, NCCL2_P2P_NAMES, OUT_SPLIT_KEY, P2P_COLLECTIVES, PG_DESC_KEY,
    PG_ID_KEY, PG_NAME_KEY, PG_RANKS_KEY, RANK_KEY, SEQ_KEY, SRC_RANK_KEY, nccl_kind,
)

if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import CollectiveAnnotation


def kernel_calls(events: FileEvents) -> list[tuple[int, int, dict, dict, str]]:
    """The file's eager kernels with metadata that no earlier pass took, as calls (see :func:`pair_calls`).
    An nccl2 record's several kernels (the list all_gather's broadcasts, the list reduce_scatter's
    reduces: docs/nccl2.md §3) are one call, its record's (the same "External id")."""
    calls: list[tuple[int, int, dict, dict, str]] = []
    first_of: dict[object, int] = {}
    for start, end, k in events.kernels:
        args = k.get("args") or {}
        if id(k) in events.taken or COLLECTIVE_NAME_KEY not in args or args.get(GRAPH_NODE_ID_KEY):
            continue
        link = args.get(EXTERNAL_ID_KEY)
        if link is not None and _is_nccl2(events, args):
            at = first_of.get(link)
            if at is not None:
                s, t, first, first_args, source = calls[at]
                calls[at] = (s, max(t, end), first, first_args, source)
                events.siblings.setdefault(id(first), []).append(k)
                events.taken.add(id(k))
                continue
            first_of[link] = len(calls)
            if args[COLLECTIVE_NAME_KEY] in NCCL2_P2P_NAMES and RANK_KEY not in args:
                args = {**args, RANK_KEY: _op_rank(events, link)}
        calls.append((start, end, k, args, "nccl-kernel"))
    return calls


def _call_start(events: FileEvents, kernel: dict) -> Optional[int]:
    """The start of the record_param_comms op that launched ``kernel`` (the same "External id"), if profiled."""
    if events.op_starts is None:
        events.op_starts = {(op.get("args") or {}).get(EXTERNAL_ID_KEY): start for start, _, op in events.comms_ops}
    return events.op_starts.get((kernel.get("args") or {}).get(EXTERNAL_ID_KEY))


def _op_rank(events: FileEvents, link: object) -> object:
    """The "Rank" of the record_param_comms op a kernel belongs to (Kineto does not copy it onto
    the kernel): an nccl2 p2p's peer, which it names nowhere else (docs/nccl2.md §2)."""
    if events.op_ranks is None:
        events.op_ranks = {(op.get("args") or {}).get(EXTERNAL_ID_KEY): (op.get("args") or {}).get(RANK_KEY)
                           for ops in events.comms_by_tid.values() for _, _, op in ops}
    return events.op_ranks.get(link)


def _is_nccl2(events: FileEvents, args: dict) -> bool:
    """Is a trace record nccl2's (by its group's stated format and its content: FileEvents.reads_nccl2)?"""
    return events.reads_nccl2(args.get(COLLECTIVE_NAME_KEY), args.get(IN_SPLIT_KEY), args.get(OUT_SPLIT_KEY),
                              _pg_name(events, args), "trace")


def launched(events: FileEvents, op: tuple) -> list[tuple]:
    """The collective kernels a c10d op launched, by identity: a kernel's "External id" is
    that of the CPU op around its launch, the c10d op or a record_param_comms inside it on
    its thread."""
    start, end, event = op
    inner = events.comms_by_tid.get(event.get("tid"), ())
    ids = [(event.get("args") or {}).get(EXTERNAL_ID_KEY)]
    for s, t, comms in inner[bisect.bisect_left(inner, start, key=lambda o: o[0]):]:
        if s > end:
            break
        if t <= end:
            ids.append((comms.get("args") or {}).get(EXTERNAL_ID_KEY))
    return sorted((k for x in ids if x is not None for k in events.by_external.get(x, ())
                   if id(k[2]) not in events.taken
                   and (COLLECTIVE_NAME_KEY in k[2]["args"] or nccl_kind(k[2].get("name", "")))),
                  key=lambda k: k[0])


def kernel_timed(events: FileEvents, call: HostCall, kernels: list[tuple]) -> None:
    """The instance of an NCCL call whose kernels its op launched: they carry its annotation."""
    parts = events.record_parts(call.rec.annotation)
    for kernel in kernels:
        events.taken.add(id(kernel[2]))
        events.annotate(kernel[2], parts)
    events.instances.append(with_launch(make_instance(
        events.interner, events.rank, parts, kernels[0][0], max(k[1] for k in kernels), "nccl-kernel", call.group,
        events.flows.source(kernels[0][2]), events.members), call.lo))


def pair_calls(events: FileEvents, calls: list[tuple[int, int, dict, dict, str]], records: list, order: str) -> set[int]:
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
    world = (events.trace.get("distributedInfo") or {}).get("world_size")
    named = any(PG_NAME_KEY in call[3] or PG_ID_KEY in call[3] for call in calls)
    for start, end, e, args, source in calls:
        events.taken.add(id(e))
        problem = record_problem(args, world, named)
        if problem is not None:  # left out of the matching: no finding may rest on a misread field
            events.unreadable.append(f"{e.get('name')!r} at ts {e.get('ts')}: {problem}")
            events.blind.append((start, end))
            continue
        pg_name = _pg_name(events, args)
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
            parts = events.record_parts(record)
        else:
            parts = events.interner.split(_complete(events, args, derived, order))
        events.annotate(e, parts)
        for sibling in events.siblings.get(id(e), ()):
            events.annotate(sibling, parts)
        group = events.by_uid.get(str(parts[0][ANN_PG_UID]))
        inst = make_instance(events.interner, events.rank, parts, start, end, source, group, events.flows.source(e), events.members)
        events.instances.append(with_launch(inst, _call_start(events, e)) if source != CPU_OP_SOURCE else inst)
    return paired


def comms_ops(events: FileEvents) -> list[tuple[int, int, dict, dict, str]]:
    """The record_param_comms ops as calls: each timed by its NCCL kernel (the same
    "External id") where one was profiled without the keys, else by the op itself."""
    calls = []
    for start, end, op in events.comms_ops:
        args = op["args"]
        kernel = next((k for k in events.by_external.get(args.get(EXTERNAL_ID_KEY), ())
                       if id(k[2]) not in events.taken and nccl_kind(k[2].get("name", ""))), None)
        calls.append((*kernel, args, "nccl-kernel") if kernel else (start, end, op, args, CPU_OP_SOURCE))
    return calls


def _pg_name(events: FileEvents, args: dict) -> str:
    """The group's name: "Process Group Name", else an older torch's integer "Process Group ID"."""
    if PG_NAME_KEY in args or PG_ID_KEY not in args:
        return str(args.get(PG_NAME_KEY, ""))
    pg_id = args[PG_ID_KEY]
    return events.pg_ids.get(pg_id, str(pg_id))


def _complete(events: FileEvents, args: dict, derived: dict, order: str) -> dict:
    """Kineto's eager keys, normalized and completed with lane and cross-rank key."""
    eager = {key: args[key] for key in KERNEL_EAGER_KEYS if key in args}
    pg_name = _pg_name(events, args)
    if pg_name and PG_NAME_KEY not in eager:  # an older torch's "Process Group ID"
        eager[PG_NAME_KEY] = pg_name
    group = events.groups.get(pg_name)
    if group is None:
        ranks = parse_rank_list(str(args.get(PG_RANKS_KEY, "[]"))) or []
        group = group_info(pg_name, str(args.get(PG_DESC_KEY, "")), ranks, "nccl")
        events.groups[pg_name] = group
        events.by_uid[group.uid] = group
    p2p = eager[COLLECTIVE_NAME_KEY] in P2P_COLLECTIVES or DST_RANK_KEY in eager or SRC_RANK_KEY in eager
    if _is_nccl2(events, eager):
        p2p = eager[COLLECTIVE_NAME_KEY] in NCCL2_P2P_NAMES
        if p2p and isinstance(args.get(RANK_KEY), int):
            eager[RANK_KEY] = args[RANK_KEY]
        mark_nccl2(eager, events.seq_parts, group.ranks)
    if SEQ_KEY not in eager:
        n = derived[(pg_name, p2p)] = derived.get((pg_name, p2p), 0) + 1
        eager[SEQ_KEY] = n
        eager[ANN_SEQ_FROM] = order
    eager.update({
        ANN_LANE_ID: group.lane_id, ANN_LANE: group.lane_name,
        ANN_PG_UID: group.uid, ANN_P2P: p2p,
    })
    return eager

