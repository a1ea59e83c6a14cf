"""Flight Recorder entries joined to the profiled instances of the same job by (rank, group, Seq).

A dump and a profile see the same calls from two sides: the profile times them while it runs, the
dump holds each rank's last calls and their state when it was written. An entry joins the instance of
its rank with the same group name and Seq; one whose op differs from the instance's is not joined but
counted and named (never mixed). Entries outside the profile (before it started, after it stopped) and
instances the ring no longer holds are counted, as are the send/recv entries, which are not joined:
torch's dumps number them per group, commtag's profile per peer. A CUDA-graph replay joins the
profiled replay of its rank, group, capture Seq and replay index; on a group whose collectives replays
ran, commtag's dumps number the calls in time order, and each entry joins by its own Seq, kept beside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from commtag.merge.hangs.diagnose import call_name, position_of
from commtag.merge.hangs.dumps import FrDump, FrEntry
from commtag.merge.records import CollectiveInstance
from commtag.vocab import PG_NAME_KEY
from commtag.vocab import flight_recorder as fr

@dataclass(slots=True)
class JoinedCall:
    """One call seen by both: the instance's key and the dump's word on it."""

    rank: int
    pg: str
    seq: int
    collective: str
    state: str
    outcome: str
    fr_start_ns: int
    fr_end_ns: Optional[int]
    profiled_start_ns: int
    profiled_end_ns: int

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "pg": self.pg, "seq": self.seq, "collective": self.collective,
                "state": self.state, "outcome": self.outcome, "fr_start_ns": self.fr_start_ns,
                "fr_end_ns": self.fr_end_ns, "profiled_start_ns": self.profiled_start_ns,
                "profiled_end_ns": self.profiled_end_ns}


@dataclass(slots=True)
class FrJoin:
    """What joined, and what did not and why."""

    joined: list[JoinedCall] = field(default_factory=list)
    #: Collective entries of a profiled rank that join no instance (outside the profile).
    entries_outside_profile: int = 0
    #: Entries of ranks the profile does not have.
    entries_of_unprofiled_ranks: int = 0
    #: Send/recv entries: not joined (their numbering differs between dump and profile).
    p2p_entries_not_joined: int = 0
    #: Instances of a dumped rank that no entry joins (the ring wrapped, or the call is not in it).
    instances_without_entry: int = 0
    #: Same rank, group and Seq, different op: not joined.
    disagreements: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"joined": len(self.joined), "entries_outside_profile": self.entries_outside_profile,
                "entries_of_unprofiled_ranks": self.entries_of_unprofiled_ranks,
                "p2p_entries_not_joined": self.p2p_entries_not_joined,
                "instances_without_entry": self.instances_without_entry,
                "disagreements": self.disagreements, "calls": [c.to_dict() for c in self.joined]}

    def describe(self) -> str:
        """One line: how many joined, and every count of what did not."""
        return (f"Flight Recorder entries joined to profiled calls by (rank, group, Seq): {len(self.joined)} joined; "
                f"{self.entries_outside_profile} outside the profile, {self.entries_of_unprofiled_ranks} of ranks "
                f"not profiled, {self.p2p_entries_not_joined} send/recv not joined, "
                f"{len(self.disagreements)} disagreeing on the op; {self.instances_without_entry} profiled calls "
                f"of dumped ranks with no entry")


def group_name(instance: CollectiveInstance) -> str:
    """The c10d group name the trace recorded (the name a dump keys its entries by); the uid where none."""
    name = instance.common_args.get(PG_NAME_KEY, instance.args.get(PG_NAME_KEY))  # shared, or its own (read back)
    return str(name) if name not in (None, "") else instance.pg_uid


def same_call(entry: FrEntry, instance: CollectiveInstance) -> bool:
    """Whether the entry names the profiled call's op (as torch's recorder names it on that backend)."""
    backend = entry.backend or ("gloo" if instance.source == "gloo" else "nccl")
    return fr.fr_op(backend, instance.collective) == entry.op


def entry_key(entry: FrEntry) -> tuple[str, int, Optional[int]]:
    """(group name, Seq, replay index or None) of a dump's entry: a replay's Seq is its capture's, and an
    entry numbered in time order (a group that replayed) keeps its real Seq beside."""
    return entry.group, entry.seq if entry.capture_seq is None else entry.capture_seq, entry.replay


def instance_key(instance: CollectiveInstance) -> tuple[str, int, Optional[int]]:
    """The same key of a profiled call."""
    return group_name(instance), instance.seq, instance.replay


def join_fr(dumps: list[FrDump], instances: Iterable[CollectiveInstance]) -> FrJoin:
    """Join every dump's collective entries to ``instances`` (each instance at most once)."""
    profiled: dict[_Key, CollectiveInstance] = {}
    profiled_ranks: set[int] = set()
    for instance in instances:
        profiled_ranks.add(instance.rank)
        if not instance.is_p2p:
            profiled.setdefault((instance.rank, *instance_key(instance)), instance)
    result = FrJoin()
    matched: set[_Key] = set()
    dumped = {d.rank for d in dumps}
    for dump in dumps:
        for entry in dump.entries:
            if dump.rank not in profiled_ranks:
                result.entries_of_unprofiled_ranks += 1
            elif entry.is_p2p:
                result.p2p_entries_not_joined += 1
            else:
                _join_one(dump.rank, entry, profiled, matched, result)
    result.instances_without_entry = sum(1 for key in profiled if key[0] in dumped and key not in matched)
    return result


#: (rank, group name, Seq, replay index or None): a call's key in both sources (a replay's Seq: its capture's).
_Key = tuple[int, str, int, Optional[int]]


def _join_one(rank: int, entry: FrEntry, profiled: dict[_Key, CollectiveInstance],
              matched: set[_Key], result: FrJoin) -> None:
    key = (rank, *entry_key(entry))
    seq = key[2]
    instance = profiled.get(key)
    if instance is None or key in matched:
        result.entries_outside_profile += 1
        return
    if not same_call(entry, instance):
        matched.add(key)
        result.disagreements.append(f"rank {rank} group {entry.group} Seq {seq}: the dump says "
                                    f"{call_name(entry)}, the profile {instance.collective}")
        return
    matched.add(key)
    result.joined.append(JoinedCall(
        rank=rank, pg=entry.group, seq=seq, collective=instance.collective, state=entry.state,
        outcome=position_of(entry).outcome, fr_start_ns=entry.created_ns, fr_end_ns=entry.ended_ns,
        profiled_start_ns=instance.start_ns, profiled_end_ns=instance.end_ns))
