"""Cross-rank analysis: match each collective across its group, then measure and check it.

Pure functions over :class:`~commtag.merge.records.CollectiveInstance` lists,
so the Perfetto writer, the ``summary`` report, the plot and ``--strict`` all
read one result (:class:`Analysis`) and never disagree.

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

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from commtag.merge.records import (
    ALL_TIME,
    CPU_OP_SOURCE,
    WINDOW_MARKER,
    CollectiveInstance,
    CounterSeries,
    Coverage,
    GroupLane,
    Marker,
    TraceAnnotations,
    describe_ranks,
    match_groups,
)
from commtag.vocab import (
    ANN_ALGBW, ANN_BUSBW, ANN_BYTES, ANN_DESYNC, ANN_INFERRED, ANN_LANE, ANN_LAST_RANK, ANN_MARKER,
    ANN_MEMBERS_NOT_FOUND, ANN_MISSING_RANKS, ANN_PG_UID, ANN_RANKS_MATCHED, ANN_SEQ_FROM, ANN_SKEW_US, ANN_STRAGGLER,
    ANN_WAIT_US, ANN_WINDOW_NS, ANN_WINDOW_RANK, ANN_WORLD_SIZE, BUSBW_FACTORS, COLLECTIVES, COLLECTIVE_NAME_KEY,
    DTYPE_KEY, IN_NELEMS_KEY, OUT_NELEMS_KEY, P2P_COLLECTIVES, RECV, SCALAR_TYPE_BYTES, SEND, SEQ_KEY,
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


@dataclass(slots=True)
class Finding:
    """One thing the ranks disagree on (or a warning), named so a user can find it."""

    #: op_mismatch, size_mismatch, dtype_mismatch, missing_ranks or seq_gap.
    kind: str
    pg_uid: str
    lane_name: str
    seq: int
    replay: Optional[int]
    is_p2p: bool
    #: Global ranks concerned (the odd ones out, the missing ones, the gapped one).
    ranks: tuple[int, ...]
    #: Eager keys that disagree (e.g. "In msg nelems", "dtype").
    fields: tuple[str, ...]
    detail: str
    #: False for a warning that no rank disagrees on (a shared Seq gap).
    desync: bool = True

    @property
    def message(self) -> str:
        """One line naming group, Seq, ranks and fields, for logs and --strict."""
        where = f"group {self.pg_uid}" + (f" ({self.lane_name})" if self.lane_name else "")
        seq = f"{'p2p ' if self.is_p2p else ''}Seq {self.seq}" + (
            f" replay {self.replay}" if self.replay is not None else ""
        )
        fields = f" [{', '.join(self.fields)}]" if self.fields else ""
        label = "desync" if self.desync else "warning"
        return f"{label} {self.kind} in {where} {seq}: ranks {list(self.ranks)}{fields}: {self.detail}"

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "pg": self.pg_uid,
            "seq": self.seq,
            "replay": self.replay,
            "p2p": self.is_p2p,
            "ranks": list(self.ranks),
            "fields": list(self.fields),
            "desync": self.desync,
            "message": self.message,
        }


@dataclass(slots=True)
class MatchedCollective:
    """One collective instance across the ranks that ran it, with its figures."""

    pg_uid: str
    lane_name: str
    is_p2p: bool
    seq: int
    replay: Optional[int]
    collective: str
    dtype: str
    group_size: int
    #: Rank -> that rank's instance (global ranks).
    members: dict[int, CollectiveInstance]
    #: Member ranks that have no such instance (no trace, not profiled then, or a desync).
    missing_ranks: tuple[int, ...]
    #: Of those, the ones whose trace covers the collective's time: a desync.
    blamed_ranks: tuple[int, ...]
    first_rank: int
    #: The last arrival; None when incomplete (an absent rank may have been later).
    last_rank: Optional[int]
    first_start_ns: int
    last_start_ns: int
    #: None when incomplete.
    skew_ns: Optional[int]
    #: First start to last end, over the members that recorded it.
    span_ns: int
    #: The last arrival's own duration (see the module docstring); None when incomplete.
    transfer_ns: Optional[int]
    bytes: Optional[int]
    algbw_gbps: Optional[float]
    busbw_gbps: Optional[float]
    straggler: bool = False
    findings: list[Finding] = field(default_factory=list)
    #: Members of an unknown group (an NCCL kernel without metadata) that no rank's trace
    #: matched: there are this many, but which ranks is not known (so not in missing_ranks).
    unnamed_missing: int = 0

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.members))

    @property
    def waits_ns(self) -> dict[int, int]:
        """Rank -> how long it waited for the last arrival (empty when incomplete). Made when asked:
        kept, a dict per collective of every member was a tenth of a 512-rank merge's peak."""
        if self.last_rank is None:
            return {}
        return {rank: self.last_start_ns - inst.start_ns for rank, inst in self.members.items()}

    @property
    def desync(self) -> bool:
        return any(f.desync for f in self.findings)

    @property
    def complete(self) -> bool:
        """Every member rank recorded it: only then are skew and bandwidth measured."""
        return not self.missing_ranks and not self.unnamed_missing

    def to_dict(self) -> dict[str, object]:
        """The JSON record of ``commtag summary --format json``."""
        return {
            "pg": self.pg_uid,
            "lane": self.lane_name,
            "seq": self.seq,
            "replay": self.replay,
            "p2p": self.is_p2p,
            "collective": self.collective,
            "dtype": self.dtype,
            "group_size": self.group_size,
            "ranks": list(self.ranks),
            "missing_ranks": list(self.missing_ranks),
            "unnamed_missing": self.unnamed_missing,
            "first_rank": self.first_rank,
            "last_rank": self.last_rank,
            "start_ns": self.first_start_ns,
            "skew_us": _us(self.skew_ns) if self.skew_ns is not None else None,
            "wait_us": {str(r): _us(w) for r, w in sorted(self.waits_ns.items())},
            "duration_us": {str(r): _us(i.duration_ns) for r, i in sorted(self.members.items())},
            "span_us": _us(self.span_ns),
            "transfer_us": _us(self.transfer_ns) if self.transfer_ns is not None else None,
            "bytes": self.bytes,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "straggler": self.straggler,
            "desync": [f.to_dict() for f in self.findings],
        }


@dataclass(slots=True)
class Analysis:
    """Everything the analysis found, for the trace, the report and --strict."""

    collectives: list[MatchedCollective]
    #: All findings, including Seq gaps that belong to no recorded instance.
    findings: list[Finding]
    #: pg uid -> busbw step series ``(ts_ns, GB/s)``, time ordered (sum over overlapping transfers).
    busbw: dict[str, list[tuple[int, float]]]
    #: Straggler and desync instants, each on a rank's marker track.
    markers: list[Marker]
    #: The ranks read, their profiled windows, the world size.
    coverage: Coverage = field(default_factory=lambda: Coverage({}))

    @property
    def desyncs(self) -> list[Finding]:
        return [f for f in self.findings if f.desync]


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


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


def analyze(
    instances: Iterable[CollectiveInstance],
    *,
    coverage: Optional[Coverage] = None,
    loaded_ranks: Optional[Iterable[int]] = None,
    straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US,
) -> Analysis:
    """Match, measure and check every collective instance.

    ``coverage``: the ranks read and when each was profiled (see
    :class:`~commtag.merge.records.Coverage`). Without it, ``loaded_ranks``
    (default: every rank seen) are taken as profiled all the time; a rank
    outside them is never blamed.
    """
    instances = list(instances)
    if coverage is None:
        coverage = Coverage.unknown_windows(loaded_ranks if loaded_ranks is not None else {i.rank for i in instances})
    measured = measure(instances, coverage)
    return conclude(measured, coverage, straggler_min_skew_us)


@dataclass(slots=True)
class Measured:
    """The first half of :func:`analyze`: every instance matched and measured, stragglers not named yet."""

    matched: list[MatchedCollective]
    seqs: _SeqIndex

    def skews(self) -> list[tuple[bool, int, int]]:
        """``(is_p2p, last rank, skew ns)`` of each measured collective: what the straggler noise is taken
        from, over the whole run (a merge worker analysing some groups adds every worker's)."""
        return [(m.is_p2p, m.last_rank, m.skew_ns) for m in _measured(self.matched)]


#: What the Seq-gap checks keep of a rank's instances of a group: runs of consecutive Seqs in one
#: window, each (pg uid, rank, first Seq, last Seq, window index, first's start ns, last's end ns).
SeqRun = tuple[str, int, int, int, Optional[int], int, int]


def seq_issued(inst: CollectiveInstance) -> bool:
    """Whether ``inst``'s Seq is one its backend issued in the window it ran in (see :class:`_SeqIndex`)."""
    return not inst.is_p2p and inst.replay is None and inst.arg(ANN_SEQ_FROM) is None


def seq_runs(instances: Iterable[CollectiveInstance], coverage: Coverage) -> list[SeqRun]:
    """The Seq runs of ``instances`` (each rank's all of them, in their order: a Seq recorded twice
    counts where it was first), by rank."""
    found: dict[tuple[str, int], dict[int, tuple[int, int]]] = defaultdict(dict)
    for i in instances:
        if seq_issued(i):
            found[(i.pg_uid, i.rank)].setdefault(i.seq, (i.start_ns, i.end_ns))
    runs: list[SeqRun] = []
    for (pg, rank), seqs in found.items():
        run: Optional[list] = None
        for seq, (start, end) in sorted(seqs.items()):
            window = coverage.window_of(rank, start)
            if run is not None and seq == run[3] + 1 and window == run[4]:
                run[3], run[6] = seq, end
                continue
            if run is not None:
                runs.append(tuple(run))  # type: ignore[arg-type]
            run = [pg, rank, seq, seq, window, start, end]
        if run is not None:
            runs.append(tuple(run))  # type: ignore[arg-type]
    return sorted(runs, key=lambda r: r[1])


def measure(instances: list[CollectiveInstance], coverage: Coverage, runs: Optional[list[SeqRun]] = None,
            groups: Optional[dict[str, GroupLane]] = None) -> Measured:
    """Match and measure ``instances`` (every instance of a collective must be among them). The Seq
    checks see ``runs`` (:func:`seq_runs`) and ``groups`` (pg -> its lane and members, as its first
    instance names them) where they are of more instances than these (a merge worker matching
    some Seqs of a group)."""
    seqs = _SeqIndex.of(instances, coverage) if runs is None else _SeqIndex(runs, groups or {})
    matched = [
        _measure(members, coverage, seqs)
        for members in match_groups(sorted(instances, key=lambda i: (i.rank, i.start_ns, i.seq)))
    ]
    matched.sort(key=lambda m: (m.first_start_ns, m.pg_uid, m.seq))
    return Measured(matched, seqs)


def conclude(measured: Measured, coverage: Coverage, straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US,
             skews: Optional[list[tuple[bool, int, int]]] = None,
             gap_of: Callable[[str, int], bool] = lambda pg, seq: True) -> Analysis:
    """Name stragglers, check and find Seq gaps: the rest of :func:`analyze`. ``skews``: every measured
    collective's of the run (:meth:`Measured.skews`; default: those of ``measured``); ``gap_of(pg, Seq)``:
    whether a gap at that Seq is this analysis's to report (default: all)."""
    matched, seqs = measured.matched, measured.seqs
    _flag_stragglers(matched, coverage, straggler_min_skew_us, measured.skews() if skews is None else skews)
    for m in matched:
        m.findings.extend(_check(m))
    by_key = {(m.pg_uid, m.is_p2p, m.seq, m.replay): m for m in matched if not m.is_p2p}
    gaps = [gap for gap in _seq_gaps(seqs, coverage) if gap_of(gap.pg_uid, gap.seq)]
    for gap in gaps:
        target = by_key.get((gap.pg_uid, False, gap.seq, gap.replay))
        if target is not None:
            target.findings.append(gap)
    findings = [f for m in matched for f in m.findings]
    findings.extend(g for g in gaps if (g.pg_uid, False, g.seq, g.replay) not in by_key)
    return Analysis(matched, findings, _busbw_series(matched), markers(matched), coverage)


def _expected(members: list[CollectiveInstance]) -> set[int]:
    first = members[0]
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


class _SeqIndex:
    """Each rank's Seq numbers per group (collectives) issued in its windows, with the window each ran in.

    A graph replay is left out: it carries the Seq its call took at capture time, which was
    issued then, not in the window the replay ran in (between two captured calls, others may
    run outside any capture and any window). So is a Seq the merge numbered itself (a kernel
    that named none and no record claimed: ``"commtag seq from"``): it is no Seq the backend issued.
    """

    def __init__(self, runs: Iterable[SeqRun], groups: dict[str, GroupLane]) -> None:
        #: pg -> its lane and members, as its first instance (in rank order) names them.
        self.groups = groups
        #: (pg, rank) -> [(first Seq, last Seq, window index, first's start, last's end)]: runs of
        #: consecutive Seqs in one window, in Seq order (between runs a rank skipped some).
        self.by_rank: dict[tuple[str, int], list[tuple[int, int, Optional[int], int, int]]] = {}
        for pg, rank, first, last, window, start, end in sorted(runs, key=lambda run: run[1]):
            self.by_rank.setdefault((pg, rank), []).append((first, last, window, start, end))
        for found in self.by_rank.values():
            found.sort()

    @classmethod
    def of(cls, instances: list[CollectiveInstance], coverage: Coverage) -> _SeqIndex:
        groups: dict[str, GroupLane] = {}
        for inst in instances:
            if seq_issued(inst) and inst.pg_uid not in groups:
                groups[inst.pg_uid] = GroupLane(inst.lane_name, inst.lane_id, inst.pg_uid, inst.group_ranks)
        return cls(seq_runs(instances, coverage), groups)

    def holes(self) -> dict[tuple[str, int], dict[int, tuple[int, int]]]:
        """(pg, Seq) -> rank -> (end of the Seq before, start of the Seq after): Seqs a rank
        skipped between two it recorded in one window (between windows nothing is known)."""
        out: dict[tuple[str, int], dict[int, tuple[int, int]]] = defaultdict(dict)
        for (pg, rank), runs in self.by_rank.items():
            for (_, a, wa, _, end_a), (b, _, wb, start_b, _) in zip(runs, runs[1:]):
                if wa is not None and wa == wb:
                    for s in range(a + 1, b):
                        out[(pg, s)][rank] = (end_a, start_b)
        return out

    def _around(self, pg: str, rank: int, seq: int) -> tuple[list, int]:
        """The rank's runs of ``pg`` and the index of the last one starting at or before ``seq``."""
        runs = self.by_rank.get((pg, rank), [])
        return runs, bisect.bisect_right(runs, (seq, 1 << 62)) - 1

    def recorded(self, pg: str, rank: int, seq: int) -> bool:
        runs, at = self._around(pg, rank, seq)
        return at >= 0 and runs[at][1] >= seq

    def passed(self, pg: str, rank: int, seq: int) -> bool:
        """Whether ``rank`` recorded ``seq`` of ``pg``, or Seqs on both sides of it in one window."""
        runs, at = self._around(pg, rank, seq)
        if at >= 0 and runs[at][1] >= seq:
            return True
        return 0 <= at < len(runs) - 1 and runs[at][2] is not None and runs[at][2] == runs[at + 1][2]


def _measure(members: list[CollectiveInstance], coverage: Coverage, seqs: _SeqIndex) -> MatchedCollective:
    by_rank = {i.rank: i for i in members}
    first = min(members, key=lambda i: (i.start_ns, i.rank))
    last = max(members, key=lambda i: (i.start_ns, -i.rank))
    end = max(i.end_ns for i in members)
    sizes = [b for b in (message_bytes(i) for i in members) if b is not None]
    nbytes = max(sizes) if sizes else None
    missing = tuple(sorted(_expected(members) - set(by_rank)))
    # A missing member is a desync only where its trace shows it ran on without this collective
    # (by time, or by its Seqs on both sides; every replay of a graph has the same Seq).
    blamed = tuple(r for r in missing if coverage.covers(r, first.start_ns, end)
                   or (not last.is_p2p and last.replay is None and seqs.passed(last.pg_uid, r, last.seq)))
    unnamed = _unnamed_missing(members)
    complete = not missing and not unnamed
    skew = last.start_ns - first.start_ns if complete else None
    transfer = last.duration_ns if complete else None
    group_size = 2 if last.is_p2p else last.group_size
    algbw, busbw = (bandwidth_gbps(last.collective, nbytes, transfer / 1e9, group_size)
                    if transfer is not None else (None, None))
    if last.source == CPU_OP_SOURCE:
        algbw = busbw = None  # the host time of a call that only enqueued the transfer
    return MatchedCollective(
        pg_uid=last.pg_uid,
        lane_name=last.lane_name,
        is_p2p=last.is_p2p,
        seq=_display_seq(members, last),
        replay=last.replay,
        collective=P2P_LABEL if last.is_p2p else last.collective,
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


def _measured(matched: Iterable[MatchedCollective]) -> list[MatchedCollective]:
    """The collectives with a skew and a transfer time, of more than one member."""
    return [m for m in matched if m.skew_ns is not None and m.transfer_ns is not None and len(m.members) > 1]


def _flag_stragglers(matched: list[MatchedCollective], coverage: Coverage, min_skew_us: float,
                     skews: list[tuple[bool, int, int]]) -> None:
    """Name the late rank where its lead clears the floor, its transfer time and the noise (from
    ``skews``, the run's), and its own trace covers the time it was late (see the module docstring)."""
    floor = min_skew_us * 1000
    candidates = [m for m in _measured(matched) if m.skew_ns >= max(floor, m.transfer_ns)
                  and coverage.covers(m.last_rank, m.first_start_ns, m.last_start_ns)
                  and not any(i.arg(ANN_INFERRED) for i in m.members.values())]
    noise: dict[tuple[bool, int], float] = {}
    for m in candidates:
        key = (m.is_p2p, m.last_rank)
        if key not in noise:
            others = [skew for is_p2p, last, skew in skews if is_p2p == m.is_p2p and last != m.last_rank]
            noise[key] = statistics.median(others) if len(others) >= NOISE_MIN_SAMPLES else 0.0
        m.straggler = m.skew_ns >= STRAGGLER_NOISE_FACTOR * noise[key]


def _display_seq(members: list[CollectiveInstance], last: CollectiveInstance) -> int:
    """The instance's Seq; for p2p, whose two ends may number it differently, the sender's."""
    senders = [i.seq for i in members if i.is_p2p and i.collective == SEND]
    return senders[0] if senders else last.seq


def _check(m: MatchedCollective) -> list[Finding]:
    """The Flight Recorder checks on one matched instance."""
    found: list[Finding] = []

    def add(kind: str, ranks: Iterable[int], fields: tuple[str, ...], detail: str) -> None:
        found.append(
            Finding(kind, m.pg_uid, m.lane_name, m.seq, m.replay, m.is_p2p, tuple(sorted(ranks)), fields, detail)
        )

    if m.blamed_ranks:
        add("missing_ranks", m.blamed_ranks, (), f"{m.collective} ran on ranks {list(m.ranks)} only")
    insts = list(m.members.values())
    if m.is_p2p:
        _check_p2p(insts, add)
        return found
    for kind, key, attr in (("op_mismatch", COLLECTIVE_NAME_KEY, "collective"), ("dtype_mismatch", DTYPE_KEY, "dtype")):
        odd, detail = _odd_ones(insts, lambda i: getattr(i, attr))
        if odd:
            add(kind, odd, (key,), detail)
    if any(f.kind == "op_mismatch" for f in found):
        return found  # sizes of different ops are not comparable
    op = m.collective
    row = COLLECTIVES.get(op)
    shape = row.shape if row else None
    checked = [(key, attr) for key, attr, equal in (
        (IN_NELEMS_KEY, "in_nelems", row.equal_in if row else True),
        (OUT_NELEMS_KEY, "out_nelems", row.equal_out if row else True),
    ) if equal]
    differing = [(key, attr) for key, attr in checked if len({getattr(i, attr) for i in insts}) > 1]
    if differing:
        odd, detail = _odd_ones(insts, lambda i: _show(getattr(i, attr) for _, attr in differing))
        add("size_mismatch", odd, tuple(key for key, _ in differing), detail)
    n = m.group_size
    for inst in insts:
        if shape == "out = in x n" and inst.out_nelems != inst.in_nelems * n:
            add("size_mismatch", [inst.rank], (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"rank {inst.rank} gathers {inst.in_nelems} x {n} ranks into {inst.out_nelems}")
        if shape == "in = out x n" and inst.in_nelems != inst.out_nelems * n:
            add("size_mismatch", [inst.rank], (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"rank {inst.rank} scatters {inst.in_nelems} over {n} ranks into {inst.out_nelems}")
    if shape == "sum in = sum out" and not m.missing_ranks:
        total_in, total_out = sum(i.in_nelems for i in insts), sum(i.out_nelems for i in insts)
        if total_in != total_out:
            add("size_mismatch", m.ranks, (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"ranks send {total_in} elements in total but receive {total_out}")
    return found


def _check_p2p(insts: list[CollectiveInstance], add: Callable[..., None]) -> None:
    if any(i.collective not in P2P_COLLECTIVES for i in insts):
        return  # e.g. NCCL SendRecv kernels without metadata: both ends send and receive
    sends = [i for i in insts if i.collective == SEND]
    recvs = [i for i in insts if i.collective == RECV]
    if len(insts) == 2 and (len(sends), len(recvs)) != (1, 1):
        add("op_mismatch", [i.rank for i in insts], (COLLECTIVE_NAME_KEY,),
            f"expected a send and a recv, found {sorted(i.collective for i in insts)}")
        return
    if len(sends) == 1 and len(recvs) == 1:
        s, r = sends[0], recvs[0]
        if s.dtype != r.dtype:
            add("dtype_mismatch", [s.rank, r.rank], (DTYPE_KEY,), f"send is {s.dtype}, recv is {r.dtype}")
        if s.in_nelems != r.out_nelems:
            add("size_mismatch", [s.rank, r.rank], (IN_NELEMS_KEY, OUT_NELEMS_KEY),
                f"rank {s.rank} sends {s.in_nelems} elements, rank {r.rank} receives {r.out_nelems}")


def _show(values: Iterable[object]) -> str:
    """One value as is, several as 'a/b' (In/Out msg nelems)."""
    return "/".join(str(v) for v in values)


def _odd_ones(insts: list[CollectiveInstance], value: Callable[[CollectiveInstance], object]) -> tuple[list[int], str]:
    """Ranks whose value differs from the most common one, and a detail line."""
    by_value: dict[object, list[int]] = defaultdict(list)
    for inst in insts:
        by_value[value(inst)].append(inst.rank)
    if len(by_value) < 2:
        return [], ""
    # The majority is taken as right; on a tie, the value of the lowest rank.
    common = max(by_value, key=lambda v: (len(by_value[v]), -min(by_value[v])))
    odd = sorted(r for v, ranks in by_value.items() if v != common for r in ranks)
    detail = "; ".join(f"{v!s} on ranks {sorted(r)}" for v, r in sorted(by_value.items(), key=lambda kv: min(kv[1])))
    return odd, detail


def _seq_gaps(seqs: _SeqIndex, coverage: Coverage) -> list[Finding]:
    """Seq numbers a rank skipped inside one of its windows, where every member was profiled."""
    found = []
    for (pg, s), gapped in sorted(seqs.holes().items()):
        ref = seqs.groups[pg]
        members = (set(ref.ranks) or {r for (p, r) in seqs.by_rank if p == pg}) & set(coverage.windows)
        start, end = next(iter(gapped.values()))
        if not all(r in gapped or seqs.passed(pg, r, s) or coverage.covers(r, start, end) for r in members):
            continue  # some member was not profiled then: nothing to compare with
        shared = not any(seqs.recorded(pg, r, s) for r in members)
        ranks = tuple(sorted(gapped))
        detail = (
            f"no rank recorded Seq {s} (issued where commtag could not see it?)"
            if shared
            else f"Seq {s} is missing on {describe_ranks(ranks)} between their neighbouring Seqs"
        )
        found.append(Finding("seq_gap", pg, ref.lane_name, s, None, False, ranks, (SEQ_KEY,), detail, desync=not shared))
    return found


def _busbw_series(matched: list[MatchedCollective]) -> dict[str, list[tuple[int, float]]]:
    """Per group, a step counter: the summed busbw of the transfers running at each moment."""
    return busbw_series(busbw_edges(matched))


def busbw_edges(matched: Iterable[MatchedCollective]) -> dict[str, list[tuple[int, float]]]:
    """Per group, where each transfer's busbw starts (+) and ends (-): what :func:`busbw_series` adds up."""
    edges: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for m in matched:
        if m.busbw_gbps is None:
            continue
        edges[m.pg_uid].append((m.last_start_ns, m.busbw_gbps))
        edges[m.pg_uid].append((m.last_start_ns + m.transfer_ns, -m.busbw_gbps))
    return edges


def busbw_series(edges: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """Per group, the step counter of its :func:`busbw_edges` (in any order: they are sorted here)."""
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
        if m.straggler:
            out.append(Marker(
                m.last_rank, m.members[m.last_rank].start_ns,
                f"straggler: rank {m.last_rank} {m.skew_ns / 1e6:.3f} ms late ({m.collective} Seq {m.seq})",
                {**where, ANN_MARKER: "straggler", ANN_SKEW_US: _us(m.skew_ns)},
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


def trace_annotations(analysis: Analysis, lane_names: Optional[dict[str, str]] = None) -> TraceAnnotations:
    """Counters and markers for the Perfetto writer.

    One busbw counter per process group, under the lowest member rank's lanes
    (one track per group, not one copy per member). Each rank's profiled
    windows become instants too, so that the merged file alone can be analyzed.
    """
    owner: dict[str, int] = {}
    names: dict[str, str] = dict(lane_names or {})
    for m in analysis.collectives:
        owner[m.pg_uid] = min(owner.get(m.pg_uid, m.first_rank), *m.members)
        names.setdefault(m.pg_uid, m.lane_name or m.pg_uid)
    counters = [busbw_counter(owner[pg], names[pg], points) for pg, points in sorted(analysis.busbw.items())]
    return TraceAnnotations(counters=counters, markers=[*analysis.markers, *_window_markers(analysis.coverage)])


def busbw_counter(rank: int, lane_name: str, points: list[tuple[int, float]]) -> CounterSeries:
    """A group's busbw counter, on its lowest member ``rank``'s track, in the group's view."""
    return CounterSeries(rank, f"busbw {lane_name} (GB/s)", points, unit="GB/s", lane=lane_name)


def _window_markers(coverage: Coverage) -> list[Marker]:
    out = []
    for rank, windows in sorted(coverage.windows.items()):
        for k, (first, last) in enumerate(w for w in windows if w != ALL_TIME):
            args: dict[str, object] = {ANN_MARKER: WINDOW_MARKER, ANN_WINDOW_RANK: rank, ANN_WINDOW_NS: last - first}
            if coverage.world_size:
                args[ANN_WORLD_SIZE] = coverage.world_size
            out.append(Marker(rank, first, f"profiled window {k + 1} of {len(windows)} ({(last - first) / 1e6:.1f} ms)",
                              args))
    return out


def annotate(analysis: Analysis) -> None:
    """Write the figures into each member's annotations (its lane slice's): the collective's
    into one common dict its members share, each rank's wait into that rank's own args."""
    for m in analysis.collectives:
        figures: dict[str, object] = {ANN_RANKS_MATCHED: f"[{', '.join(map(str, m.ranks))}]"}
        if m.complete:
            figures[ANN_SKEW_US] = _us(m.skew_ns)
            figures[ANN_LAST_RANK] = m.last_rank
        else:
            figures[ANN_MISSING_RANKS] = f"[{', '.join(map(str, m.missing_ranks))}]"
            if m.unnamed_missing:
                figures[ANN_MEMBERS_NOT_FOUND] = m.unnamed_missing
        if m.bytes is not None:
            figures[ANN_BYTES] = m.bytes
        if m.algbw_gbps is not None:
            figures[ANN_ALGBW] = round(m.algbw_gbps, 6)
        if m.busbw_gbps is not None:
            figures[ANN_BUSBW] = round(m.busbw_gbps, 6)
        if m.findings:
            figures[ANN_DESYNC] = "\n".join(f.message for f in m.findings)
        joined: dict[int, dict] = {}
        waits = m.waits_ns
        for rank, inst in m.members.items():
            base = inst.common_args
            both = joined.get(id(base))
            if both is None:
                both = joined[id(base)] = {**base, **figures}
            inst.common_args = both
            if rank in waits:
                inst.args[ANN_WAIT_US] = _us(waits[rank])
            if m.straggler and rank == m.last_rank:
                inst.args[ANN_STRAGGLER] = True


def percentile(values: list[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (q in 0..100) of values; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


@dataclass(slots=True)
class GroupSummary:
    """One row of the summary table: one op in one process group."""

    pg_uid: str
    lane_name: str
    collective: str
    count: int
    #: Sum of the instances' bytes (nccl-tests' S); None when some instance's size is unknown.
    bytes: Optional[int]
    #: Sum over instances of the mean per-rank duration: the time a rank spends in the op, waits included.
    total_time_us: float
    skew_p50_us: Optional[float]
    skew_max_us: Optional[float]
    busbw_p50_gbps: Optional[float]
    busbw_p95_gbps: Optional[float]
    #: Global rank -> how many straggler instances it was the late rank of.
    stragglers: dict[int, int]
    desyncs: int
    #: Instances some member rank did not record (left out of skew and busbw).
    incomplete: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "pg": self.pg_uid,
            "lane": self.lane_name,
            "collective": self.collective,
            "count": self.count,
            "bytes": self.bytes,
            "total_time_us": self.total_time_us,
            "skew_p50_us": self.skew_p50_us,
            "skew_max_us": self.skew_max_us,
            "busbw_p50_gbps": self.busbw_p50_gbps,
            "busbw_p95_gbps": self.busbw_p95_gbps,
            "stragglers": {str(r): n for r, n in sorted(self.stragglers.items())},
            "desyncs": self.desyncs,
            "incomplete": self.incomplete,
        }


def summarize(analysis: Analysis) -> list[GroupSummary]:
    """The per process group and op table, ordered by group, then total time (largest first)."""
    rows: dict[tuple[str, str], list[MatchedCollective]] = defaultdict(list)
    for m in analysis.collectives:
        rows[(m.pg_uid, m.collective)].append(m)
    out = []
    for (pg, op), ms in rows.items():
        skews = [m.skew_ns / 1000.0 for m in ms if m.skew_ns is not None]
        bws = [m.busbw_gbps for m in ms if m.busbw_gbps is not None]
        stragglers: dict[int, int] = defaultdict(int)
        for m in ms:
            if m.straggler:
                stragglers[m.last_rank] += 1
        total = sum(statistics.fmean(i.duration_ns for i in m.members.values()) for m in ms) / 1000.0
        out.append(GroupSummary(
            pg_uid=pg,
            lane_name=ms[0].lane_name,
            collective=op,
            count=len(ms),
            bytes=None if any(m.bytes is None for m in ms) else sum(m.bytes for m in ms),
            total_time_us=round(total, 3),
            skew_p50_us=_round(median(skews)),
            skew_max_us=_round(max(skews, default=None)),
            busbw_p50_gbps=_significant(percentile(bws, 50)),
            busbw_p95_gbps=_significant(percentile(bws, 95)),
            stragglers=dict(stragglers),
            desyncs=sum(1 for m in ms if m.desync),
            incomplete=sum(1 for m in ms if not m.complete),
        ))
    out.sort(key=lambda g: (g.lane_name or g.pg_uid, -g.total_time_us, g.collective))
    return out


def _round(value: Optional[float]) -> Optional[float]:
    return round(value, 3) if value is not None else None


def _significant(value: Optional[float]) -> Optional[float]:
    """Four significant digits: gloo's MB/s and NVLink's hundreds of GB/s both stay readable."""
    return float(f"{value:.4g}") if value is not None else None


class MergeAnalysis:
    """The merge's analysis hook (``pipeline.merge(analysis=...)``).

    Puts the figures on every instance's args before the lanes are written,
    returns the busbw counters and the markers, and keeps the result so that
    ``merge --strict`` can fail on its desyncs.
    """

    def __init__(self, straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US) -> None:
        self.straggler_min_skew_us = straggler_min_skew_us
        self.result: Optional[Analysis] = None

    def __call__(self, instances: list[CollectiveInstance], coverage: Optional[Coverage] = None) -> TraceAnnotations:
        self.result = analyze(instances, coverage=coverage, straggler_min_skew_us=self.straggler_min_skew_us)
        annotate(self.result)
        return trace_annotations(self.result)
