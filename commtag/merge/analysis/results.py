"""What the analysis finds: each collective matched across its ranks, and what the ranks disagree on."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from operator import attrgetter
from typing import Generic, Optional, Protocol, TypeVar

from commtag.merge.analysis.alltoall import AllToAll
from commtag.merge.analysis.impact import Impact
from commtag.merge.records import (
    Coverage,
    Marker,
)


class FindingKind(str, Enum):
    """What a :class:`Finding` says the ranks disagree on; its value is the name reports print."""

    OP_MISMATCH = "op_mismatch"
    SIZE_MISMATCH = "size_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    MISSING_RANKS = "missing_ranks"
    SEQ_GAP = "seq_gap"

    def __str__(self) -> str:
        return self.value


@dataclass(slots=True)
class Finding:
    """One thing the ranks disagree on (or a warning), named so a user can find it."""

    kind: FindingKind
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
            "kind": self.kind.value,
            "pg": self.pg_uid,
            "seq": self.seq,
            "replay": self.replay,
            "p2p": self.is_p2p,
            "ranks": list(self.ranks),
            "fields": list(self.fields),
            "desync": self.desync,
            "message": self.message,
        }


class MemberTimes(Protocol):
    """What a matched collective's figures, markers and report read of each member: its times, and
    its args (whether it was paired by order, for the straggler rule)."""

    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...

    @property
    def duration_ns(self) -> int: ...

    def arg(self, key: str, default: object = None) -> object: ...


#: A member as a matched collective holds it: its whole record
#: (:class:`commtag.merge.records.CollectiveInstance`), or
#: once matched and checked by a merge worker only its times (:class:`commtag.merge.analysis.parts.Member`).
M = TypeVar("M", bound=MemberTimes)
N = TypeVar("N", bound=MemberTimes)


@dataclass(slots=True)
class MatchedCollective(Generic[M]):
    """One collective instance across the ranks that ran it, with its figures."""

    pg_uid: str
    lane_name: str
    is_p2p: bool
    seq: int
    replay: Optional[int]
    collective: str
    dtype: str
    group_size: int
    #: Rank -> that rank's instance (global ranks), or what is kept of it (:data:`M`).
    members: dict[int, M]
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
    #: How many hosts its ranks ran on; None where a member's host is unknown (commtag.merge.analysis.explain).
    nodes: Optional[int] = None
    #: What its time went to (commtag.merge.analysis.explain.CAUSES); None before it is explained.
    cause: Optional[str] = None
    #: Its busbw came out above what any link carries: left out (``busbw_gbps`` and ``algbw_gbps`` None).
    busbw_implausible: bool = False
    #: NCCL Inspector's own figures for it (commtag.merge.analysis.explain.nccl_view); None without a record.
    nccl: Optional[dict[str, object]] = None

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.members))

    def keeping(self, members: dict[int, N]) -> MatchedCollective[N]:
        """The same collective with ``members`` in place of its members (what a merge worker keeps
        of each once it is measured and checked), its findings list shared."""
        values = _kept_values(self)  # positional: no dict of the fields per collective
        return MatchedCollective(*values[:_MEMBERS_AT], members, *values[_MEMBERS_AT:])  # type: ignore[call-arg]

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
            "skew_us": to_us(self.skew_ns) if self.skew_ns is not None else None,
            "wait_us": {str(r): to_us(w) for r, w in sorted(self.waits_ns.items())},
            "duration_us": {str(r): to_us(i.duration_ns) for r, i in sorted(self.members.items())},
            "span_us": to_us(self.span_ns),
            "transfer_us": to_us(self.transfer_ns) if self.transfer_ns is not None else None,
            "bytes": self.bytes,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "busbw_implausible": self.busbw_implausible,
            "nodes": self.nodes,
            "cause": self.cause,
            "nccl": self.nccl,
            "straggler": self.straggler,
            "desync": [f.to_dict() for f in self.findings],
        }


#: The fields :meth:`MatchedCollective.keeping` copies (all but the members), and their getter: read
#: once here, not by ``dataclasses.fields`` per collective (a merge keeps every collective it matches).
_KEPT_FIELDS = tuple(f.name for f in fields(MatchedCollective) if f.name != "members")
_kept_values = attrgetter(*_KEPT_FIELDS)
#: Where the members come among the fields, in order.
_MEMBERS_AT = [f.name for f in fields(MatchedCollective)].index("members")


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
    #: What each late rank cost the window (:mod:`commtag.merge.analysis.impact`).
    impact: Impact = field(default_factory=lambda: Impact([]))
    #: Each all_to_all(v) instance's rank-pair traffic (:mod:`commtag.merge.analysis.alltoall`).
    all_to_all: list[AllToAll] = field(default_factory=list)

    @property
    def desyncs(self) -> list[Finding]:
        return [f for f in self.findings if f.desync]


def to_us(ns: int) -> float:
    return round(ns / 1000.0, 3)
