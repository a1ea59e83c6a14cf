"""One trace file's events as attach reads them, and what attaching one annotation does.

:class:`FileEvents` indexes the file's candidate events once (kernels, gloo
works, c10d ops, record_param_comms ops, graph launches) and holds what the
per-source passes share: the events ``taken`` (an event gets at most one
annotation), the instances made, the groups, the flows. Each source is a
module of functions over it: :mod:`commtag.merge.rank.gloo`,
:mod:`commtag.merge.rank.eager`, :mod:`commtag.merge.rank.replays`; the
order they run in is :func:`commtag.merge.rank.attach.attach`'s.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence

from commtag.identity import GroupRow, format_list, group_info
from commtag.merge.batches import counts
from commtag.merge.ids import FLOW_LAUNCH, FLOW_SOURCE, flow_id
from commtag.merge.inputs.clock import base_ns, event_ns
from commtag.merge.records import CollectiveInstance, Interner, ranks_of, whole
from commtag.vocab import (
    ANN_LAUNCH_US,
    ANN_CROSS_RANK, ANN_P2P_PAIR_SEQ, ANN_PEER, ANN_RANK, ANN_RECORD_FORMAT, ANN_RECV_PEERS, ANN_REPLAY,
    ANN_SEND_PEERS, ANN_SEQ_PART, C10D_OP_PREFIX, COLLECTIVE_NAME_KEY, COMMS_OP, CORRELATION_KEY, EXTERNAL_ID_KEY,
    GRAPH_NODE_ID_KEY, IN_SPLIT_KEY, KERNEL_CATEGORY, LAUNCH_CATEGORIES, NCCL2_BATCH_P2P, NCCL2_FORMAT, NCCL2_P2P_NAMES,
    NON_COLLECTIVE_NAMES, OUT_SPLIT_KEY, PG_NAME_KEY, GLOO_WORK_PREFIX, PG_RANKS_KEY, RANK_KEY, SEQ_KEY,
    content_format, family, is_graph_launch,
)

if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import CollectiveAnnotation, RecordedCollective, Sidecar

#: How many unreadable records a file's note names (it counts them all).
_SHOWN = 3


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


@functools.lru_cache(maxsize=None)
def _site_fields(model: type[CollectiveAnnotation]) -> Callable[[dict], tuple]:
    """The values of a call site's fields (all but its own) from an annotation's ``__dict__``, in one
    C call: read for every record of a sidecar (a model's fields are all in its ``__dict__``)."""
    return operator.itemgetter(*(name for name in model.model_fields if name not in _OWN_FIELD_NAMES))


def own_args(annotation: CollectiveAnnotation, **more: object) -> dict:
    """A sidecar annotation's own keys (Seq, Rank, ...), as its eager dict has them."""
    own = {}
    for name, key in _OWN_FIELDS:
        value = getattr(annotation, name)
        if value is not None:
            own[key] = value
    own.update(more)
    return own


def make_instance(interner: Interner, rank: int, parts: tuple[dict, dict], start: int, end: int, source: str,
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
        source_flow=flow, reading=interner.reading(common_args, len(ranks)))


def with_launch(inst: CollectiveInstance, call_ns: Optional[int]) -> CollectiveInstance:
    """``inst`` saying how long after its CPU call (``call_ns``) its device work started
    (:data:`ANN_LAUNCH_US`, what tells launch skew from arrival skew); unsaid where the call is unknown
    or started after it (clocks of another source)."""
    if call_ns is not None and call_ns <= inst.start_ns:
        inst.args[ANN_LAUNCH_US] = round((inst.start_ns - call_ns) / 1000, 3)
    return inst


def mark_nccl2(eager: dict, seq_parts: dict[tuple[str, int], int], group_ranks: Sequence[int]) -> None:
    """Mark an nccl2 record so the merge reads it in legacy terms (vocab.legacy_view), and keep
    apart what its Seq does not (docs/nccl2.md §4): the k records of one coalesced call share
    a Seq (each its part, counted in call order in ``seq_parts``); a send/recv carries the last
    collective's (it pairs by its own order, its global peer from "Rank" and ``group_ranks``); a
    batch_op_issue pairs with its peers' batches (:mod:`commtag.merge.batches`) where its peers are
    known: commtag's runtime records them, and in a group of two they are the other member; else
    it stays alone on its rank."""
    eager[ANN_RECORD_FORMAT] = NCCL2_FORMAT
    name = eager[COLLECTIVE_NAME_KEY]
    peer = eager.get(RANK_KEY)
    if name == NCCL2_BATCH_P2P:
        if ANN_SEND_PEERS not in eager and len(group_ranks) == 2 and isinstance(peer, int) and 0 <= peer < 2:
            sends, recvs = counts(eager.get(IN_SPLIT_KEY)), counts(eager.get(OUT_SPLIT_KEY))
            if sends is not None and recvs is not None:
                other = group_ranks[1 - peer]
                eager[ANN_SEND_PEERS] = format_list([other] * len(sends))
                eager[ANN_RECV_PEERS] = format_list([other] * len(recvs))
        if ANN_SEND_PEERS not in eager or ANN_RECV_PEERS not in eager:
            eager[ANN_CROSS_RANK] = False
    elif name in NCCL2_P2P_NAMES:
        if isinstance(peer, int) and 0 <= peer < len(group_ranks):
            eager[ANN_PEER] = group_ranks[peer]
    elif SEQ_KEY in eager:
        key = (str(eager.get(PG_NAME_KEY, "")), whole(eager[SEQ_KEY], -1))
        part = seq_parts[key] = seq_parts.get(key, -1) + 1
        if part:
            eager[ANN_SEQ_PART] = part


class FormatConflict(str):
    """A note that a sidecar's stated record format and a trace's records disagree: the stage that
    knows the file turns it into a warning naming it (:func:`commtag.merge.inputs.runs.warnings`)."""


class HostCall(Protocol):
    """A recorded call as :meth:`FileEvents.host_timed` times it (:class:`commtag.merge.rank.gloo.GlooCall`)."""

    rec: RecordedCollective
    group: Optional[GroupRow]
    op: Optional[tuple]
    works: list[tuple]
    lo: int
    hi: int


class FileEvents:
    """One trace file's candidate events, indexed once, and the state attach's passes share."""

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
        #: Each group's record format as its sidecar states it, by uid and by name (a sidecar that
        #: predates the field states none), and the names of the groups whose records disagree with it.
        self.stated: dict[str, str] = {}
        for pg in sidecar.process_groups if sidecar is not None else ():
            if "record_format" in pg.model_fields_set:
                self.stated[pg.uid] = self.stated[pg.name] = pg.record_format
        self.disagreed: set[str] = set()
        #: The file's collective records it cannot read, each as "event: field problem" (see :meth:`say_unreadable`),
        #: and the time each ran (ns): there, the rank's record of a call is not known (see RankConverter._window).
        self.unreadable: list[str] = []
        self.blind: list[tuple[int, int]] = []
        self.groups = group_table(rows)
        self.by_uid = {g.uid: g for g in rows}
        #: Each group's member ranks as the merge's one tuple (see :func:`_instance`).
        self.members: dict[tuple, tuple[int, ...]] = {}
        self.instances: list[CollectiveInstance] = []
        self.taken: set[int] = set()
        #: A call's first kernel -> the other kernels of its record (the same "External id").
        self.siblings: dict[int, list[dict]] = {}
        #: nccl2 records seen per (group name, Seq), and a sidecar nccl2 annotation's parts (see :func:`mark_nccl2`).
        self.seq_parts: dict[tuple[str, int], int] = {}
        self.nccl2_parts: dict[int, tuple[dict, dict]] = {}
        #: record_param_comms ops' "Rank" by "External id", made when an nccl2 p2p kernel needs it.
        self.op_ranks: Optional[dict[object, object]] = None
        #: record_param_comms ops' starts by "External id", made when an eager kernel's call is asked for.
        self.op_starts: Optional[dict[object, int]] = None
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
            elif name.startswith(GLOO_WORK_PREFIX):
                self.gloo.append((*event_ns(e, self.base), e, family(name), e.get("tid")))
            elif name.startswith(C10D_OP_PREFIX):
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

    def say_unreadable(self, source: str) -> None:
        """One note naming the file's unreadable records (the first few) and counting them all."""
        if self.unreadable:
            shown = "; ".join(self.unreadable[:_SHOWN])
            more = f"; and {len(self.unreadable) - _SHOWN} more" if len(self.unreadable) > _SHOWN else ""
            self.notes.append(f"{source}: {len(self.unreadable)} collective record(s) it cannot read, left out of "
                              f"the matching (no finding rests on them): {shown}{more}")

    def annotate(self, event: dict, parts: tuple[dict, dict]) -> None:
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

    def site(self, annotation: CollectiveAnnotation) -> dict:
        """The common args of a sidecar annotation's call site (its eager dict is made once per site)."""
        key = _site_fields(annotation.__class__)(annotation.__dict__)
        found = self.sites.get(key)
        if found is None:
            found = self.sites[key] = self.interner.split(annotation.eager_dict())[0]
        return found

    def reads_nccl2(self, name: object, in_split: object, out_split: object, group: str, where: str) -> bool:
        """Is this record read as nccl2's? As its group's sidecar entry says, where it says and the
        record's own content (vocab.content_format) does not tell otherwise; where they disagree,
        by the content (legacy_view on the wrong format would misread sizes), and the file is
        warned of once per group. ``group``: its pg uid or name; ``where``: "trace" or "sidecar"."""
        content = content_format(name, in_split, out_split)
        stated = self.stated.get(group)
        if stated is None or content is None or content == stated:
            return (content or stated) == NCCL2_FORMAT
        shown = group.split(":")[0]  # a uid starts with its group's name
        if shown not in self.disagreed:
            self.disagreed.add(shown)
            self.notes.append(FormatConflict(
                f"its sidecar says process group {shown!r} writes {stated} records, but the {where}'s {name!r} record "
                f"of that group is {content}'s (split sizes {in_split} / {out_split}): read as {content}'s"))
        return content == NCCL2_FORMAT

    def record_parts(self, annotation: CollectiveAnnotation) -> tuple[dict, dict]:
        """A sidecar annotation as an event's (common, own) args (an nccl2 one's marked once, see
        :func:`mark_nccl2`)."""
        if not self.reads_nccl2(annotation.collective_name, annotation.in_split_size, annotation.out_split_size,
                                annotation.pg_uid, "sidecar"):
            return self.site(annotation), own_args(annotation)
        found = self.nccl2_parts.get(id(annotation))
        if found is None:
            group = self.by_uid.get(annotation.pg_uid)
            eager = {**self.site(annotation), **own_args(annotation)}
            mark_nccl2(eager, self.seq_parts, group.ranks if group else ())
            found = self.nccl2_parts[id(annotation)] = self.interner.split(eager)
        return found

    def host_timed(self, call: HostCall, parts: tuple[dict, dict], source: str) -> None:
        """The instance of a call timed on the host: by its gloo works, else its c10d op, else its
        record; its op and works carry ``parts``."""
        op, works = call.op, call.works
        for hit in (op, *works):
            if hit is not None:
                self.annotate(hit[2], parts)
        if works:
            timing = (min(w[0] for w in works), max(w[1] for w in works))
        else:
            timing = op[:2] if op is not None else (call.lo, call.hi)
        first = min(works, key=lambda w: w[0]) if works else None
        origin = op if op is not None and (first is None or op[0] <= first[0]) else first
        flow = self.flows.source(origin[2]) if origin is not None else None
        inst = make_instance(self.interner, self.rank, parts, timing[0], timing[1], source, call.group, flow, self.members)
        self.instances.append(with_launch(inst, call.lo) if works else inst)
