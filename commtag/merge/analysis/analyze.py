"""Cross-rank analysis: each collective matched across its group, then measured and checked.

Pure functions over :class:`~commtag.merge.records.CollectiveInstance` lists; the one driver
that matches the instances and calls them is :mod:`commtag.merge.engine.shards` (whatever the
number of merge workers; ``commtag summary`` runs it in a world of one), so the Perfetto
writer, the ``summary`` report, the plot and ``--strict`` all read one result
(:class:`~commtag.merge.analysis.results.Analysis`) and never disagree.

Matching
    :func:`~commtag.merge.records.match_groups`, the rule the merged trace's
    flows follow too: a collective instance is the same on every member rank
    when its :attr:`CollectiveInstance.key` ``(pg uid, p2p, Seq, replay)`` is (a Seq
    the merge numbered by order meets only Seqs numbered so).
    p2p is the exception: its Seq counter is per rank (like NCCL's ``seqP2P``),
    so a rank that talks to two peers numbers its sends 1, 2 while each peer
    sees 1. A send is therefore matched with its receive the way MPI orders
    messages: the k-th send from a to b in a group (and graph replay) is the
    k-th receive at b from a. The pair is one transfer, named ``send/recv``
    (:data:`P2P_LABEL`) whichever end arrived last.

Figures (per matched instance whose member ranks all recorded it; an
instance some member lacks is incomplete: the absent rank may be the late
one, so neither skew nor bandwidth is computed for it)
    skew
        last start minus first start; the last-arriving rank is the one that
        made the others wait, each rank's wait is ``last start - own start``.
    transfer time
        the last-arriving rank's own duration: it never waited for a peer, and
        it is measured on one clock, so cross-host clock error cannot distort it.
        Bandwidth uses this time.
    bytes
        ``S x element size`` (``vocab.SCALAR_TYPE_BYTES``), ``S`` chosen as
        nccl-tests does (``busbw_size`` in :data:`commtag.vocab.COLLECTIVES`), the largest over the
        matched ranks (they agree unless the instance is a desync or an uneven
        all_to_allv, where the busiest rank bounds the time).
    algbw / busbw
        ``algbw = bytes / transfer time`` in GB/s (1e9 bytes/s, as nccl-tests);
        ``busbw = algbw x factor(n)`` with NCCL's factors. None for instances
        timed by their CPU op (:data:`~commtag.merge.records.CPU_OP_SOURCE`).

Desync checks (what PyTorch's Flight Recorder analyzer checks)
    ``op_mismatch`` (Collective name differs), ``dtype_mismatch``,
    ``size_mismatch`` (In/Out msg nelems differ where the op requires equality,
    all_gather out != in x n, reduce_scatter in != out x n, all_to_all total in
    != total out, a send's size != its receive's), ``missing_ranks`` (a member
    rank has no such instance although one of its trace windows covers the
    collective's time; ranks with no trace, or not profiled then, are not
    blamed, as the analyzer skips ranks without a dump) and ``seq_gap`` (a
    rank's Seq numbers for a group jump inside one of its windows; a graph
    replay is not counted, its Seq was issued at capture, nor a Seq numbered by
    the merge). Seq numbers
    jump between a scheduled profiler's windows on every rank: that is no
    finding. A gap is reported only where every member rank was profiled; one
    that every member shares is not a desync (the ranks agree; the calls were
    made where commtag could not see them, e.g. from C++), so it is a warning.

Stragglers
    The last rank to arrive is named a straggler when its lead over the first
    is at least the largest of: ``straggler_min_skew_us`` (1 ms), the
    collective's own transfer time, and :data:`STRAGGLER_NOISE_FACTOR` times
    the noise. The noise is the median skew of the run's other complete
    instances of the same kind (collectives, or p2p transfers) at which that
    rank did not arrive last (0 when there are fewer than
    :data:`NOISE_MIN_SAMPLES`): the skew the run shows anyway, without that
    rank holding anyone up. A rank late to every collective is therefore still
    named; scheduling jitter of a shared machine is not. The late rank's own
    trace must cover the time it was late: a lead it took before its profiler
    started (the first collective of a window) is measured, not named. Nor is
    a lead between NCCL kernels that carried no metadata: they are paired
    across ranks by their order on each rank (``commtag inferred``), which is
    a guess, not the identity a straggler claim needs.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Optional

from commtag.merge.records import (
    CPU_OP_SOURCE,
    CollectiveInstance,
    Coverage,
    Marker,
)
from commtag.merge.batches import batch_ranks, is_batch
from commtag.merge.analysis.checks import Seqs
from commtag.merge.analysis.explain import explain
from commtag.merge.analysis.results import MatchedCollective, to_us
from commtag.vocab import (
    ANN_DESYNC, ANN_INFERRED, ANN_LANE, ANN_MARKER, ANN_PG_UID, ANN_SKEW_US, BUSBW_FACTORS, COLLECTIVES,
    COLLECTIVE_NAME_KEY, SCALAR_TYPE_BYTES, SEND, SEQ_KEY,
)

#: What a matched p2p instance is called: one transfer is a send and its receive, whichever
#: end arrived last (each rank's lane slice keeps its own direction).
P2P_LABEL = "send/recv"

#: A rank arriving this much later than the first one, and later by at least the
#: collective's own transfer time and the noise (see the module docstring), is a straggler.
DEFAULT_STRAGGLER_MIN_SKEW_US = 1000.0
#: How many times the run's noise a straggler's skew must be.
STRAGGLER_NOISE_FACTOR = 10.0
#: Fewer skews than this are no estimate of the noise.
NOISE_MIN_SAMPLES = 3

_GB = 1e9


#: Ops that move no data: their size is nothing, not unknown (catalogue rows with no busbw size).
NO_PAYLOAD = frozenset(row.name for row in COLLECTIVES.values() if row.busbw_size is None)


def element_bytes(dtype: str) -> Optional[float]:
    """Byte size of one element of a c10 ScalarType name, None when unknown."""
    return SCALAR_TYPE_BYTES.get(dtype)


def busbw_factor(collective: str, n: int) -> Optional[float]:
    """NCCL's bus-bandwidth factor for ``collective`` on ``n`` ranks (None: not a data op)."""
    row = COLLECTIVES.get(collective)
    return BUSBW_FACTORS[row.busbw_factor](n) if row and row.busbw_factor and n >= 1 else None


def message_bytes(inst: CollectiveInstance) -> Optional[int]:
    """nccl-tests' size S in bytes for one rank's instance (None for barrier/unknown dtype)."""
    size = element_bytes(inst.dtype)
    row = COLLECTIVES.get(inst.collective)
    if size is None or row is None or row.busbw_size is None:
        return None
    nelems = inst.in_nelems if row.busbw_size == "in" else inst.out_nelems
    return int(nelems * size)


def bandwidth_gbps(collective: str, nbytes: Optional[int], seconds: float, n: int) -> tuple[Optional[float], Optional[float]]:
    """(algbw, busbw) in GB/s; None where bytes, time or the factor is unknown."""
    if nbytes is None or seconds <= 0:
        return None, None
    algbw = nbytes / seconds / _GB
    factor = busbw_factor(collective, n)
    return algbw, (algbw * factor if factor is not None else None)


def _expected(members: list[CollectiveInstance]) -> set[int]:
    first = members[0]
    if is_batch(first):
        return batch_ranks(members)
    if first.is_p2p:
        return set(first.p2p_ends or (first.rank,))
    # Members of one group share one interned rank list: each distinct list is walked once, not once per
    # member (that was group size squared per collective: 1 M inserts for each call of a 1,024-rank group).
    lists = {id(inst.group_ranks): inst.group_ranks for inst in members}
    ranks: set[int] = set()
    for group_ranks in lists.values():
        ranks.update(group_ranks)
    return ranks


def _unnamed_missing(members: list[CollectiveInstance]) -> int:
    """How many members an instance of an unknown group lacks (0 for a known group).

    An NCCL kernel without metadata names no group: a collective's spans the
    world (``group_size``, from distributedInfo), a transfer's two ranks. Seen
    on fewer ranks (one rank of a larger world traced), it is measured only as
    far as it is known: a skew over the ranks present would call it on time.
    """
    first = members[0]
    if first.group_ranks or (first.is_p2p and first.p2p_ends):
        return 0
    return max(0, (2 if first.is_p2p else first.group_size) - len({i.rank for i in members}))


def measure(members: list[CollectiveInstance], coverage: Coverage, seqs: Seqs) -> MatchedCollective[CollectiveInstance]:
    by_rank = {i.rank: i for i in members}
    if len(members) == 1:  # its own first, last and end
        first = last = members[0]
        end = first.end_ns
    else:
        first = min(members, key=lambda i: (i.start_ns, i.rank))
        last = max(members, key=lambda i: (i.start_ns, -i.rank))
        end = max(i.end_ns for i in members)
    sizes = [b for b in map(message_bytes, members) if b is not None]
    nbytes = max(sizes) if sizes else None
    missing = tuple(sorted(_expected(members) - by_rank.keys()))
    # A missing member is a desync only where its trace shows it ran on without this collective
    # (by time, or by its Seqs on both sides; every replay of a graph has the same Seq).
    by_seq = not last.is_p2p and last.replay is None
    blamed = tuple(r for r in missing if coverage.covers(r, first.start_ns, end)
                   or (by_seq and seqs.passed(last.pg_uid, r, last.seq))) if missing else ()
    unnamed = _unnamed_missing(members)
    complete = not missing and not unnamed
    skew = last.start_ns - first.start_ns if complete else None
    transfer = last.duration_ns if complete else None
    group_size = 2 if last.is_p2p else last.group_size
    algbw, busbw = (bandwidth_gbps(last.collective, nbytes, transfer / 1e9, group_size)
                    if transfer is not None else (None, None))
    if last.source == CPU_OP_SOURCE:
        algbw = busbw = None  # the host time of a call that only enqueued the transfer
    if len({i.group_size for i in members}) > 1:
        busbw = None  # members disagree on the group's size, so on the bus factor (a size_mismatch)
    matched = MatchedCollective(
        pg_uid=last.pg_uid,
        lane_name=last.lane_name,
        is_p2p=last.is_p2p,
        seq=_display_seq(members, last),
        replay=last.replay,
        collective=P2P_LABEL if last.is_p2p and not is_batch(last) else last.collective,
        dtype=last.dtype,
        group_size=last.group_size,
        members=by_rank,
        missing_ranks=missing,
        unnamed_missing=unnamed,
        blamed_ranks=blamed,
        first_rank=first.rank,
        last_rank=last.rank if complete else None,
        first_start_ns=first.start_ns,
        last_start_ns=last.start_ns,
        skew_ns=skew,
        span_ns=end - first.start_ns,
        transfer_ns=transfer,
        bytes=nbytes,
        algbw_gbps=algbw,
        busbw_gbps=busbw,
    )
    explain(matched, coverage)
    return matched


def skews(matched: list[MatchedCollective]) -> list[tuple[bool, int, int]]:
    """``(p2p, last rank, skew)`` of each measured instance: what the straggler noise is made of
    (merge workers analysing parts of the job pool theirs, :mod:`commtag.merge.engine.shards`)."""
    return [(m.is_p2p, m.last_rank, m.skew_ns) for m in matched
            if m.skew_ns is not None and m.last_rank is not None and m.transfer_ns is not None and len(m.members) > 1]


def flag_stragglers(matched: list[MatchedCollective], coverage: Coverage, min_skew_us: float,
                    measured: Optional[list[tuple[bool, int, int]]] = None) -> None:
    """Name the late rank where its lead clears the floor, its transfer time and the noise,
    and its own trace covers the time it was late (see the module docstring). ``measured``:
    the whole job's :func:`skews` (default: those of ``matched``)."""
    if measured is None:
        measured = skews(matched)
    floor = min_skew_us * 1000
    candidates = [(m, m.skew_ns, m.last_rank) for m in matched
                  if m.skew_ns is not None and m.last_rank is not None and m.transfer_ns is not None
                  and len(m.members) > 1 and m.skew_ns >= max(floor, m.transfer_ns)
                  and coverage.covers(m.last_rank, m.first_start_ns, m.last_start_ns)
                  and not any(i.arg(ANN_INFERRED) for i in m.members.values())]
    noise: dict[tuple[bool, int], float] = {}
    for m, skew_ns, last_rank in candidates:
        key = (m.is_p2p, last_rank)
        if key not in noise:
            others = [skew for p2p, last, skew in measured if p2p == m.is_p2p and last != last_rank]
            noise[key] = statistics.median(others) if len(others) >= NOISE_MIN_SAMPLES else 0.0
        m.straggler = skew_ns >= STRAGGLER_NOISE_FACTOR * noise[key]


def _display_seq(members: list[CollectiveInstance], last: CollectiveInstance) -> int:
    """The instance's Seq; for p2p, whose two ends may number it differently, the sender's."""
    senders = [i.seq for i in members if i.is_p2p and i.collective == SEND]
    return senders[0] if senders else last.seq


def busbw_edges(matched: list[MatchedCollective]) -> dict[str, list[tuple[int, float]]]:
    """Per group, where each measured transfer adds its busbw and where it takes it off."""
    edges: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for m in matched:
        if m.busbw_gbps is None or m.transfer_ns is None:
            continue
        edges[m.pg_uid].append((m.last_start_ns, m.busbw_gbps))
        edges[m.pg_uid].append((m.last_start_ns + m.transfer_ns, -m.busbw_gbps))
    return edges


def busbw_series(edges: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """:func:`busbw_edges` as step series (edges of one group in any order: they are sorted)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for pg, pg_edges in edges.items():
        level = 0.0
        points: list[tuple[int, float]] = []
        for ts, delta in sorted(pg_edges):
            level = max(0.0, level + delta)
            value = round(level, 6) if level > 1e-9 else 0.0
            if points and points[-1][0] == ts:
                points[-1] = (ts, value)
            else:
                points.append((ts, value))
        series[pg] = points
    return series


def markers(matched: list[MatchedCollective]) -> list[Marker]:
    """A straggler marker on the late rank; a desync marker on every member rank."""
    out: list[Marker] = []
    for m in matched:
        where = {ANN_PG_UID: m.pg_uid, ANN_LANE: m.lane_name, COLLECTIVE_NAME_KEY: m.collective, SEQ_KEY: m.seq}
        if m.straggler and m.last_rank is not None and m.skew_ns is not None:
            out.append(Marker(
                m.last_rank, m.members[m.last_rank].start_ns,
                f"straggler: rank {m.last_rank} {m.skew_ns / 1e6:.3f} ms late ({m.collective} Seq {m.seq})",
                {**where, ANN_MARKER: "straggler", ANN_SKEW_US: to_us(m.skew_ns)},
            ))
        desyncs = [f for f in m.findings if f.desync]
        if desyncs:
            kinds = ", ".join(sorted({f.kind for f in desyncs}))
            for rank, inst in sorted(m.members.items()):
                out.append(Marker(
                    rank, inst.start_ns, f"desync: {kinds} ({m.collective} Seq {m.seq})",
                    {**where, ANN_MARKER: "desync", ANN_DESYNC: "\n".join(f.message for f in desyncs)},
                ))
    out.sort(key=lambda mk: (mk.ts_ns, mk.rank))
    return out
