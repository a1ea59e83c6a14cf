"""Why a matched collective took its time, and which hosts it crossed.

The cause (:data:`CAUSES`), per complete instance of at least two ranks, from its span (first
start to last end), its arrival skew (last start minus first start), its transfer (the last
arrival's own duration: it never waited) and, where every member's CPU call start is known
(``commtag launch us``: its device work started that long after its call), its call skew (last
call minus first call):

- arrival skew: the skew is at least half the span, and the calls were as far apart as the work
  (call skew above half the skew, or the calls unknown): the last rank came late;
- launch skew: the skew is at least half the span, but the calls came together (call skew at most
  half the skew): the device work of some rank started late after its call (a busy stream);
- transfer: the transfer is at least half the span: the members started together;
- mixed: neither is half the span;
- inconclusive: the data cannot tell: an incomplete instance (a rank missing), one rank, an
  instance timed by its CPU op (no kernel or work), or an empty span.

Hosts: each rank's (:attr:`Coverage.hosts`); an instance spans as many hosts as its ranks ran on
(None when a member's is unknown), a group is intra-node when all of its instances span one.
A busbw above :data:`commtag.vocab.MAX_PLAUSIBLE_BUSBW_GBPS` is left out and flagged.
"""

from __future__ import annotations

from typing import Iterable, Optional

from commtag.merge.records import CPU_OP_SOURCE, Coverage
from commtag.merge.analysis.results import MatchedCollective
from commtag.vocab import (
    ANN_LAUNCH_US, ANN_NCCL_ALGBW, ANN_NCCL_BUSBW, ANN_NCCL_EXEC_US, ANN_NCCL_SOURCE, MAX_PLAUSIBLE_BUSBW_GBPS,
)

TRANSFER = "transfer"
ARRIVAL_SKEW = "arrival skew"
LAUNCH_SKEW = "launch skew"
MIXED = "mixed"
INCONCLUSIVE = "inconclusive"
CAUSES = (TRANSFER, ARRIVAL_SKEW, LAUNCH_SKEW, MIXED, INCONCLUSIVE)
#: The share of the span a part must reach to be the cause.
DOMINANT_SHARE = 0.5

INTRA_NODE = "intra-node"
INTER_NODE = "inter-node"


def explain(m: MatchedCollective, coverage: Coverage) -> None:
    """Set ``m``'s hosts, cause and the plausibility of its busbw (in place)."""
    if m.missing_ranks or m.unnamed_missing:  # some hosts not known
        m.nodes = None
    else:
        hosts = {coverage.hosts.get(r) for r in m.members}
        m.nodes = None if None in hosts else len(hosts)
    if m.busbw_gbps is not None and m.busbw_gbps > MAX_PLAUSIBLE_BUSBW_GBPS:
        m.busbw_implausible = True
        m.busbw_gbps = m.algbw_gbps = None
    m.cause = cause(m)
    m.nccl = nccl_view(m)


def nccl_view(m: MatchedCollective) -> Optional[dict[str, object]]:
    """NCCL Inspector's figures for ``m`` (commtag.merge.inputs.inspector), as the rank commtag measures
    its busbw on saw them (the last arrival), else its lowest member with a record; None without one."""
    for rank in ([m.last_rank] if m.last_rank is not None else []) + sorted(m.members):
        inst = m.members[rank]
        busbw = inst.arg(ANN_NCCL_BUSBW)
        if busbw is not None:
            return {"busbw_gbps": busbw, "algbw_gbps": inst.arg(ANN_NCCL_ALGBW),
                    "exec_time_us": inst.arg(ANN_NCCL_EXEC_US), "source": inst.arg(ANN_NCCL_SOURCE), "rank": rank}
    return None


def cause(m: MatchedCollective) -> str:
    """The cause of one matched instance (see the module docstring)."""
    if (not m.complete or len(m.members) < 2 or m.skew_ns is None or m.transfer_ns is None or m.span_ns <= 0
            or any(i.source == CPU_OP_SOURCE for i in m.members.values())):
        return INCONCLUSIVE
    if m.skew_ns >= DOMINANT_SHARE * m.span_ns:
        calls = call_skew_ns(m)
        return LAUNCH_SKEW if calls is not None and calls <= DOMINANT_SHARE * m.skew_ns else ARRIVAL_SKEW
    if m.transfer_ns >= DOMINANT_SHARE * m.span_ns:
        return TRANSFER
    return MIXED


def call_skew_ns(m: MatchedCollective) -> Optional[int]:
    """Last CPU call start minus the first, where every member's is known (None otherwise)."""
    calls = []
    for inst in m.members.values():
        launch = inst.arg(ANN_LAUNCH_US)
        if not isinstance(launch, (int, float)) or isinstance(launch, bool):
            return None
        calls.append(inst.start_ns - round(launch * 1000))
    return max(calls) - min(calls)


def node_scope(ms: Iterable[MatchedCollective]) -> Optional[str]:
    """A group's (or op's) scope: intra-node when every instance spans one host, inter-node when
    every one spans more, None when some instance's hosts are unknown or the two mix."""
    spans = {m.nodes for m in ms}
    if None in spans or not spans:
        return None
    if spans == {1}:
        return INTRA_NODE
    return INTER_NODE if 1 not in spans else None


def time_by_cause(ms: Iterable[MatchedCollective]) -> dict[str, float]:
    """Each cause's share of the instances' summed span (causes that took no time left out)."""
    spans: dict[str, int] = {}
    for m in ms:
        spans[m.cause or INCONCLUSIVE] = spans.get(m.cause or INCONCLUSIVE, 0) + m.span_ns
    total = sum(spans.values())
    return {c: round(spans[c] / total, 4) for c in CAUSES if spans.get(c)} if total else {}
