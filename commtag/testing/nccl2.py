"""One job's ``record_param_comms`` records, and its ranks' traces, in both formats: legacy
ProcessGroupNCCL's and nccl2's.

Why: no GPU here runs nccl2 (ProcessGroupNCCL2 refuses to start without a
CUDA device), so tests that need its records get them from here. A job is a
list of :class:`JobCall` (what the user called, on which group, with which
tensors); :func:`records` writes, for one rank, the args of every
``record_param_comms`` CPU op the backend would write, in order, and
:func:`kernel_args` the part Kineto copies onto the call's kernel, and
:func:`job_trace` a rank's whole Kineto trace of the job (the merge's input).

Every value cites its source: ``LEG`` = docs/eager-metadata.md
(legacy, torch 2.13), ``N§k`` = section k of docs/nccl2.md
(nccl2, torch 2.15). What neither says is not written: "Comms Id" (a hash
of the profiler's own, LEG) is left out of both formats.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from commtag.identity import format_list
from commtag.runtime.describe.nccl2 import nccl2_sizes
from commtag.vocab import (
    BARRIER_DTYPE, COLLECTIVE_NAME_KEY, COLLECTIVES, COMMS_OP, CORRELATION_KEY, EXTERNAL_ID_KEY, KERNEL_CATEGORY,
    NCCL2_COLLECTIVES, NCCL_REDUCING, DST_RANK_KEY, DTYPE_KEY, GROUP_SIZE_KEY, IN_NELEMS_KEY, IN_SPLIT_KEY,
    KERNEL_EAGER_KEYS, LEGACY_FORMAT, NCCL2_BATCH_P2P, NCCL2_FORMAT, NCCL2_GROUP_RANKS, NCCL2_PER_TENSOR,
    OUT_NELEMS_KEY, OUT_SPLIT_KEY, P2P_COLLECTIVES, PG_DESC_KEY, PG_NAME_KEY, PG_RANKS_KEY, RANK_KEY,
    RANK_START_KEY, RANK_STRIDE_KEY, RECV, SEND, SEQ_KEY, SRC_RANK_KEY,
)

#: "Is asynchronized op": a CPU-op key (LEG "Keys that stay on the CPU op only").
ASYNC_KEY = "Is asynchronized op"


@dataclass(frozen=True)
class JobGroup:
    """A process group: its name, description and global ranks in group-rank order."""

    name: str
    desc: str
    ranks: tuple[int, ...]

    @property
    def strided(self) -> Optional[tuple[int, int]]:
        """(start, stride) where the ranks are an arithmetic progression with a positive stride
        (LEG "Global rank start / stride": start only if >= 0, stride only if > 0)."""
        start = self.ranks[0]
        step = self.ranks[1] - start if len(self.ranks) > 1 else 0
        if step > 0 and all(r == start + i * step for i, r in enumerate(self.ranks)):
            return start, step
        return None


@dataclass(frozen=True)
class JobCall:
    """One call of the job, the same on every member rank.

    ``op``: the legacy "Collective name" (LEG per-collective table), or
    :data:`commtag.vocab.NCCL2_BATCH_P2P` for a ``batch_isend_irecv``.
    ``numels``: each tensor's numel on a rank (one for a single-tensor op, k
    for a coalesced one); for the list all_gather / reduce_scatter, the
    per-rank chunk. ``root``: group rank of the root (rooted ops). ``pairs``:
    the (src, dst) group ranks of a p2p message (``op`` SEND: its source
    records the send, its destination the recv), or of each op of a batch.
    ``splits``: all_to_all_single's dim-0 split lists (in, out), if given.
    """

    op: str
    group: JobGroup
    numels: tuple[int, ...]
    dtype: str = "Float"
    root: int = 0
    pairs: tuple[tuple[int, int], ...] = ()
    splits: Optional[tuple[tuple[int, ...], tuple[int, ...]]] = None

    def takes_part(self, rank: int) -> bool:
        """Does ``rank`` record this call (a member; for p2p, an end of one of its pairs)?"""
        if rank not in self.group.ranks:
            return False
        if self.pairs:
            me = self.group.ranks.index(rank)
            return any(me in pair for pair in self.pairs)
        return True


def _legacy_sizes(call: JobCall, me: int) -> tuple[str, int, int, str, str]:
    """(name, In / Out msg nelems, In / Out split size) as legacy writes them (LEG table)."""
    size, n = len(call.group.ranks), call.numels[0]
    total = sum(call.numels)
    op = call.op
    if op in ("allreduce", "broadcast", "reduce", SEND, RECV):
        return op, n, n, "[]", "[]"                     # LEG: numel / numel
    if op == "allreduce_coalesced":
        return op, total, total, "[]", "[]"             # LEG: total / total
    if op in ("all_gather", "gather"):
        return op, n, n * size, "[]", "[]"              # LEG: in.numel / in.numel x size
    if op == "_allgather_base":
        return op, n, n * size, "[]", "[]"              # LEG: in.numel / out.numel
    if op in ("reduce_scatter", "scatter"):
        return op, n * size, n, "[]", "[]"              # LEG: out.numel x size / out.numel
    if op == "_reduce_scatter_base":
        return op, n * size, n, "[]", "[]"              # LEG: in.numel / out.numel
    if op == "all_to_allv":                             # LEG: the dim-0 split lists or "[]"
        ins, outs = call.splits or ((), ())
        return op, n, n, format_list(list(ins)), format_list(list(outs))
    if op == "all_to_all":                              # LEG: sum / sum, per-tensor numels
        return op, total, total, format_list(list(call.numels)), format_list(list(call.numels))
    if op == "barrier":
        return op, 0, 0, "[]", "[]"                     # LEG: 0 / 0
    raise ValueError(f"no legacy record for {op!r}")


def _legacy_rank(call: JobCall, me: int) -> int:
    """LEG "Rank": the root for rooted ops, the peer for send/recv, else the own group rank."""
    if call.op in ("broadcast", "reduce", "gather", "scatter"):
        return call.root
    if call.op in P2P_COLLECTIVES:
        src, dst = call.pairs[0]
        return dst if call.op == SEND else src
    return me


class _Counters:
    """Seq per group, by each format's rule."""

    def __init__(self) -> None:
        self.collective: dict[str, int] = {}
        self.p2p: dict[str, int] = {}

    def next_collective(self, group: str) -> int:
        """LEG "Seq" / N§4: one per call, after the increment (the first collective is 1)."""
        self.collective[group] = self.collective.get(group, 0) + 1
        return self.collective[group]

    def next_p2p(self, group: str, fmt: str) -> int:
        """LEG: p2p has its own counter. N§4: send/recv/batch_op_issue never increment; they
        carry the group's last collective Seq, 0 before any."""
        if fmt == NCCL2_FORMAT:
            return self.collective.get(group, 0)
        self.p2p[group] = self.p2p.get(group, 0) + 1
        return self.p2p[group]


def _group_keys(group: JobGroup, fmt: str) -> dict[str, object]:
    """The keys a record takes from its group."""
    keys: dict[str, object] = {GROUP_SIZE_KEY: len(group.ranks), PG_NAME_KEY: group.name}  # LEG; N§2 same values
    if fmt == NCCL2_FORMAT:
        keys[PG_RANKS_KEY] = NCCL2_GROUP_RANKS          # N§2: "[]" (stride -1); no description, start, stride
        return keys
    keys[PG_DESC_KEY] = group.desc                      # LEG: pg.group_desc
    strided = group.strided                             # LEG: ranks listed only for a positive stride
    keys[PG_RANKS_KEY] = format_list(list(group.ranks)) if strided else "[]"
    if strided:
        keys[RANK_START_KEY], keys[RANK_STRIDE_KEY] = strided
    return keys


def _record(name: str, n_in: int, n_out: int, dtype: str, in_split: str, out_split: str, group: JobGroup,
            rank: int, seq: int, fmt: str, is_async: int) -> dict[str, object]:
    return {COLLECTIVE_NAME_KEY: name, IN_NELEMS_KEY: n_in, OUT_NELEMS_KEY: n_out, DTYPE_KEY: dtype,
            IN_SPLIT_KEY: in_split, OUT_SPLIT_KEY: out_split, **_group_keys(group, fmt), RANK_KEY: rank,
            SEQ_KEY: seq, ASYNC_KEY: is_async}


def _nccl2_parts(call: JobCall, me: int, seq: int) -> list[dict[str, object]]:
    """N§3: nccl2's record(s) of one call; coalesced calls give one record per tensor (pair),
    all with the call's Seq (N§4)."""
    group, size = call.group, len(call.group.ranks)
    parts = [(NCCL2_PER_TENSOR[call.op], (n,)) for n in call.numels] if call.op in NCCL2_PER_TENSOR \
        else [(call.op, call.numels)]
    out = []
    for op, numels in parts:
        one = JobCall(op, group, numels, call.dtype, call.root, call.pairs, call.splits)
        name, n_in, n_out, in_split, out_split = _legacy_sizes(one, me)
        sizes = nccl2_sizes(name, n_in, n_out, in_split, out_split, size, _legacy_rank(one, me), me)
        assert sizes is not None, f"{name}: each part is one tensor's call, which nccl2 records alone"
        dtype = BARRIER_DTYPE if op == "barrier" else call.dtype   # N§2: first tensor's, else Byte
        # N§2: "Is asynchronized op" 1 for every record; N§3: Rank as legacy (own, root or peer).
        out.append(_record(sizes.collective, sizes.in_nelems, sizes.out_nelems, dtype, sizes.in_split,
                           sizes.out_split, group, _legacy_rank(one, me), seq, NCCL2_FORMAT, 1))
    return out


def _batch(call: JobCall, me: int, seq: int, fmt: str) -> list[dict[str, object]]:
    """A batch_isend_irecv. N§3: one ``batch_op_issue``, Σsend / Σrecv, a split per send / per recv,
    own Rank. LEG: its kernels get no metadata, but each op is a send/recv record of its own."""
    n = call.numels[0]
    mine = [(src, dst) for src, dst in call.pairs if me in (src, dst)]
    if fmt == NCCL2_FORMAT:
        sends = [n for src, _ in mine if src == me]
        recvs = [n for _, dst in mine if dst == me]
        return [_record(NCCL2_BATCH_P2P, sum(sends), sum(recvs), call.dtype, format_list(sends), format_list(recvs),
                        call.group, me, seq, fmt, 1)]
    return [_p2p_legacy(SEND if src == me else RECV, call, (src, dst), me, seq) for src, dst in mine]


def _p2p_legacy(kind: str, call: JobCall, pair: tuple[int, int], me: int, seq: int) -> dict[str, object]:
    src, dst = pair
    peer = dst if kind == SEND else src
    record = _record(kind, call.numels[0], call.numels[0], call.dtype, "[]", "[]", call.group, peer, seq,
                     LEGACY_FORMAT, 1)
    # LEG: "Dst Rank"/"Src Rank" = the global peer.
    record[DST_RANK_KEY if kind == SEND else SRC_RANK_KEY] = call.group.ranks[peer]
    return record


def records(job: Sequence[JobCall], rank: int, fmt: str) -> list[dict[str, object]]:
    """The ``record_param_comms`` args ``rank`` writes for ``job`` in format ``fmt``
    (vocab.LEGACY_FORMAT or vocab.NCCL2_FORMAT), in call order."""
    counters = _Counters()
    out: list[dict[str, object]] = []
    for call in job:
        if not call.takes_part(rank):
            continue
        me = call.group.ranks.index(rank)
        if call.op == NCCL2_BATCH_P2P:
            out += _batch(call, me, counters.next_p2p(call.group.name, fmt), fmt)
        elif call.op in P2P_COLLECTIVES:
            # One message: its source records a send, its destination a recv.
            end = replace(call, op=SEND if call.pairs[0][0] == me else RECV)
            seq = counters.next_p2p(call.group.name, fmt)
            if fmt == NCCL2_FORMAT:
                out += _nccl2_parts(end, me, seq)
            else:
                out.append(_p2p_legacy(end.op, end, end.pairs[0], me, seq))
        else:
            seq = counters.next_collective(call.group.name)
            if fmt == NCCL2_FORMAT:
                out += _nccl2_parts(call, me, seq)
            else:
                name, n_in, n_out, in_split, out_split = _legacy_sizes(call, me)
                dtype = BARRIER_DTYPE if call.op == "barrier" else call.dtype   # LEG: barrier Byte
                # LEG: "Is asynchronized op" 1, but 0 for barrier.
                out.append(_record(name, n_in, n_out, dtype, in_split, out_split, call.group,
                                   _legacy_rank(call, me), seq, fmt, 0 if call.op == "barrier" else 1))
    return out


def kernel_args(record: dict[str, object]) -> dict[str, object]:
    """What Kineto copies from a record onto its NCCL kernel, in its order (LEG "Keys copied to
    the kernel"; N§5: nccl2 kernels get the same keys, with nccl2's values)."""
    return {key: record[key] for key in KERNEL_EAGER_KEYS if key in record}


#: Where the job's time starts on every rank (ns, CLOCK_REALTIME; floored as Kineto's
#: baseTimeNanoseconds is: LEG "Clocks"), and each call's slot, its op and its kernel (µs).
BASE_TIME_NS = 1_767_000_000_000_000_000
SLOT_US, OP_US, KERNEL_AT_US, KERNEL_US = 100.0, 10.0, 20.0, 30.0
#: The NCCL version torch 2.15 bundles (N "Sources": W15, NCCL 2.30.7).
NCCL_VERSION = "2.30.7"


def kernel_name(record: dict[str, object], fmt: str) -> str:
    """An NCCL kernel of the record's collective (N§3 / N§5 kernel families: the row's NCCL
    kernel), in NCCL 2.19+'s spelling; one kernel per record (N§8.2 leaves the count of a grouped
    call's kernels unverified)."""
    table = NCCL2_COLLECTIVES if fmt == NCCL2_FORMAT else COLLECTIVES
    kernel = table[str(record[COLLECTIVE_NAME_KEY])].nccl_kernel
    reduction = "_Sum_f32" if kernel in NCCL_REDUCING else ""
    return f"ncclDevKernel_{kernel}{reduction}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def job_trace(job: Sequence[JobCall], rank: int, world: int, fmt: str, skew_us: float = 0.0) -> dict:
    """Rank ``rank``'s Kineto trace of ``job`` in format ``fmt``: per record a ``record_param_comms``
    CPU op, its launch and its NCCL kernel, which carries :func:`kernel_args` and the op's External
    id (LEG "Where it lives"). Every call's kernel ends at the same instant on every rank; a rank's
    ops start ``skew_us`` later than the others'. A legacy batch's kernel gets no metadata and
    links to no record (LEG: its kernels launch after each op's scope closed)."""
    pid, device, stream = 1000 + rank, rank, 7
    events: list[dict] = []
    groups = {call.group.name: call.group for call in job if rank in call.group.ranks}
    per_call = records_per_call(job, rank, fmt)
    link = 0
    for slot, (call, recs) in enumerate(per_call):
        at = slot * SLOT_US
        unlinked = fmt == LEGACY_FORMAT and call.op == NCCL2_BATCH_P2P
        for record in recs:
            link += 1
            events.append({"ph": "X", "cat": "cpu_op", "name": COMMS_OP, "pid": pid, "tid": pid, "ts": at + skew_us,
                           "dur": OP_US, "args": {**record, EXTERNAL_ID_KEY: link}})
            if unlinked:
                continue
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
                           "ts": at + skew_us + 1.0, "dur": 2.0, "args": {CORRELATION_KEY: link,
                                                                          EXTERNAL_ID_KEY: link}})
            events.append({"ph": "X", "cat": KERNEL_CATEGORY, "name": kernel_name(record, fmt), "pid": device,
                           "tid": stream, "ts": at + KERNEL_AT_US, "dur": KERNEL_US,
                           "args": {EXTERNAL_ID_KEY: link, CORRELATION_KEY: link, "device": device,
                                    "stream": stream, **kernel_args(record)}})
        if unlinked and recs:
            events.append({"ph": "X", "cat": KERNEL_CATEGORY, "name": kernel_name({COLLECTIVE_NAME_KEY: SEND}, fmt),
                           "pid": device, "tid": stream, "ts": at + KERNEL_AT_US, "dur": KERNEL_US,
                           "args": {"device": device, "stream": stream}})
    info = {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": len(groups),
            "pg_config": [{"pg_name": g.name, "pg_desc": g.desc, "backend_config": "cuda:nccl",
                           "pg_size": len(g.ranks), "ranks": list(g.ranks)} for g in groups.values()],
            "nccl_version": NCCL_VERSION}  # LEG "distributedInfo"; N§1: "nccl" for nccl2 too
    return {"schemaVersion": 1, "distributedInfo": info, "baseTimeNanoseconds": BASE_TIME_NS,
            "displayTimeUnit": "ms", "traceEvents": events}


def records_per_call(job: Sequence[JobCall], rank: int, fmt: str) -> list[tuple[JobCall, list[dict[str, object]]]]:
    """Each call ``rank`` takes part in, with its records (as :func:`records` numbers them)."""
    mine = [call for call in job if call.takes_part(rank)]
    flat = records(mine, rank, fmt)
    out, at = [], 0
    for call in mine:
        count = _record_count(call, rank, fmt)
        out.append((call, flat[at:at + count]))
        at += count
    return out


def _record_count(call: JobCall, rank: int, fmt: str) -> int:
    """How many records one call writes on ``rank`` (N§3: per tensor when coalesced under nccl2,
    one batch_op_issue per batch; LEG: one per call, one per op of a batch)."""
    if call.op == NCCL2_BATCH_P2P:
        me = call.group.ranks.index(rank)
        return 1 if fmt == NCCL2_FORMAT else sum(me in pair for pair in call.pairs)
    if fmt == NCCL2_FORMAT and call.op in NCCL2_PER_TENSOR:
        return len(call.numels)
    return 1
