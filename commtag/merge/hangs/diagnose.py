"""A hung job diagnosed from its ranks' Flight Recorder dumps: per group, where each member got to,
the first collective some members entered and others never did, and what the members disagree on.

Nothing is guessed: a group whose members the dumps do not say is taken as the ranks that recorded
it, and said so; a rank whose ring no longer holds a group's entries has no place there, and is said.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Iterable, Optional

from commtag.merge.collector import collector_paused
from commtag.merge.hangs.dumps import DUMP_NAME, FrDump, FrEntry, NotRead
from commtag.merge.hangs.matching import Mismatch, mismatches
from commtag.vocab import flight_recorder as fr


@dataclass(slots=True)
class Position:
    """Where one member last was on one group: its last entry there."""

    seq: int
    collective: str
    state: str
    ended: bool
    error: Optional[str] = None
    #: A CUDA-graph replay's capture Seq and replay index (``seq`` is then its place on the group).
    capture_seq: Optional[int] = None
    replay: Optional[int] = None

    @property
    def outcome(self) -> str:
        """"failed", "completed", "ended" (gloo's torch dumps cannot say how) or "in flight"."""
        if self.error:
            return "failed"
        return "completed" if self.state == fr.STATE_COMPLETED else ("ended" if self.ended else fr.FR_IN_FLIGHT)

    def to_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "collective": self.collective, "state": self.state, "ended": self.ended,
                "error": self.error, "capture_seq": self.capture_seq, "replay": self.replay}


@dataclass(slots=True)
class Hang:
    """A call some members entered and others never did: the missing ones are where to look."""

    pg: str
    desc: str
    seq: int
    collective: str
    entered: list[int]
    missing: list[int]
    last: dict[int, Position]
    is_p2p: bool = False
    #: Where the call is a CUDA-graph replay: its capture Seq and replay index (``seq`` its place).
    capture_seq: Optional[int] = None
    replay: Optional[int] = None

    @property
    def call(self) -> str:
        """The call as a person names it: a replay with its index and capture Seq."""
        return self.collective if self.replay is None else (
            f"{self.collective} replay {self.replay} of capture Seq {self.capture_seq}")

    @property
    def message(self) -> str:
        kind = "p2p " if self.is_p2p else ""
        side = "its side of it" if self.is_p2p else "it"
        return (f"hang in group {_group_label(self.pg, self.desc)} {kind}Seq {self.seq} ({self.call}): "
                f"{plural_ranks(self.missing)} never entered {side}; {plural_ranks(self.entered)} "
                f"entered it and {'waits' if len(self.entered) == 1 else 'wait'}")

    def to_dict(self) -> dict[str, object]:
        return {"pg": self.pg, "desc": self.desc, "seq": self.seq, "collective": self.collective,
                "capture_seq": self.capture_seq, "replay": self.replay,
                "p2p": self.is_p2p, "entered": self.entered, "missing": self.missing,
                "last": {str(rank): position.to_dict() for rank, position in sorted(self.last.items())}}


@dataclass(slots=True)
class GroupProgress:
    """One group: its members (and where that list comes from), each one's last entered and ended Seq."""

    pg: str
    desc: str
    members: tuple[int, ...]
    members_from: str  # "pg_config", "every dump (the default group)", "the ranks that recorded it"
    entered: dict[int, int]
    ended: dict[int, int]
    unknown: list[int] = field(default_factory=list)  # members whose dump says nothing of this group

    def to_dict(self) -> dict[str, object]:
        return {"pg": self.pg, "desc": self.desc, "members": list(self.members), "members_from": self.members_from,
                "last_entered": {str(r): s for r, s in sorted(self.entered.items())},
                "last_ended": {str(r): s for r, s in sorted(self.ended.items())},
                "unknown": self.unknown}


@dataclass(slots=True)
class Diagnosis:
    """Every group's progress, the hangs (first per group), the disagreements, and what could not be judged."""

    ranks: list[int]
    groups: list[GroupProgress]
    hangs: list[Hang]
    mismatches: list[Mismatch]
    notices: list[str]
    #: Per rank: its latest entry of any group, for the stuck ranks' whereabouts.
    latest: dict[int, FrEntry]
    #: The dumps of the folders read that were not read (each said in a notice).
    not_read: list[NotRead] = field(default_factory=list)

    def stuck(self) -> list[int]:
        """The ranks that others wait on and that wait on no one: missing from a hang, entered in none."""
        waiting = {r for h in self.hangs for r in h.entered}
        return sorted({r for h in self.hangs for r in h.missing} - waiting)


@collector_paused()
def diagnose(dumps: list[FrDump]) -> Diagnosis:
    """Every group of ``dumps`` diagnosed (the dumps of one job, one per rank)."""
    by_rank = {d.rank: d for d in dumps}
    notices = _version_notices(dumps)
    not_read = [n for folder in {id(d.folder_not_read): d.folder_not_read for d in dumps}.values() for n in folder]
    notices.extend(_not_read_notices(not_read))
    for dump in dumps:
        for why, count in sorted(dump.left_out.items()):
            notices.append(f"{dump.path}: {count} entries left out: {why}")
    world = set(by_rank)
    for dump in dumps:
        if dump.world_size:
            world |= set(range(dump.world_size))
    absent = sorted(world - set(by_rank))
    if absent:
        notices.append(f"no dump of ranks {describe_ranks(absent)}: their places are unknown")
    recorded: dict[str, set[int]] = {}
    for dump in dumps:
        for group in dump.by_group:
            recorded.setdefault(group, set()).add(dump.rank)
    groups = [_progress(name, desc, by_rank, world, sorted(recorded[name]), notices)
              for name, desc in _group_names(dumps)]
    hangs = [h for g in groups if (h := _collective_hang(g, by_rank)) is not None]
    hangs.extend(_p2p_hangs(by_rank, notices))
    latest = {d.rank: max(d.entries, key=lambda e: e.created_ns) for d in dumps if d.entries}
    return Diagnosis(ranks=sorted(by_rank), groups=groups, hangs=hangs,
                     mismatches=mismatches(groups_entries(dumps), {g.pg: len(g.members) for g in groups}),
                     notices=notices, latest=latest, not_read=not_read)


def _not_read_notices(not_read: list[NotRead]) -> list[str]:
    """One notice per prefix not read and what was read instead, the ranks as ranges."""
    said: dict[tuple[str, bool, Optional[str]], list[int]] = {}
    for dump in not_read:
        read = DUMP_NAME.match(dump.read.name) if dump.read is not None else None
        said.setdefault((dump.prefix, dump.beside_commtag, read["prefix"] if read else None), []).append(dump.rank)
    notices = []
    for (prefix, beside_commtag, read_prefix), ranks in said.items():
        head = f"{len(ranks)} dump{'' if len(ranks) == 1 else 's'} not read ({prefix}* of {plural_ranks(ranks)}): "
        if beside_commtag:
            why = (f"commtag's dumps of those ranks ({read_prefix}*) are read, which hold every call commtag saw, "
                   "whatever the backend")
        elif read_prefix is not None:
            why = f"the torch dumps read are {read_prefix}*: each recorder numbers its own Seq, and two are never mixed"
        else:
            why = "those ranks have none of the prefix read: each recorder numbers its own Seq, and two are never mixed"
        notices.append(f"{head}{why} (torch's analyzer: fr_trace -p {prefix})")
    return notices


def _version_notices(dumps: list[FrDump]) -> list[str]:
    versions = sorted({d.version for d in dumps} - set(fr.FR_KNOWN_VERSIONS))
    newest = fr.version_number(fr.FR_KNOWN_VERSIONS[-1])
    return [f"Flight Recorder dump version {v!r} ({describe_ranks([d.rank for d in dumps if d.version == v])}) "
            f"is {'newer than any' if fr.version_number(v) > newest else 'not one'} commtag knows "
            f"({', '.join(fr.FR_KNOWN_VERSIONS)}): read by the keys it knows" for v in versions]


def _group_names(dumps: list[FrDump]) -> list[tuple[str, str]]:
    names: dict[str, str] = {}
    for dump in dumps:
        for group, entries in dump.by_group.items():
            names.setdefault(group, entries[0].desc)
    return sorted(names.items(), key=lambda item: (len(item[0]), item[0]))


def groups_entries(dumps: list[FrDump]) -> dict[str, dict[int, dict[int, FrEntry]]]:
    """Group -> rank -> Seq -> its collective entry (p2p left out)."""
    table: dict[str, dict[int, dict[int, FrEntry]]] = {}
    for dump in dumps:
        for group, entries in dump.by_group.items():
            seqs = {e.seq: e for e in entries if not e.is_p2p}  # a replay's seq is its place (see FrEntry)
            if seqs:
                table.setdefault(group, {})[dump.rank] = seqs
    return table


def _progress(name: str, desc: str, by_rank: dict[int, FrDump], world: set[int], recorded: list[int],
              notices: list[str]) -> GroupProgress:
    """One group's members and where each got to (``recorded``: the ranks whose rings hold it)."""
    said = {by_rank[r].members[name] for r in recorded if name in by_rank[r].members}
    if said:
        members, source = max(said, key=len), "pg_config"
        if len(said) > 1:
            notices.append(f"group {_group_label(name, desc)}: the dumps disagree on its members; "
                           f"the largest list is taken ({describe_ranks(list(members))})")
    elif desc == fr.FR_DEFAULT_PG_DESC:
        members, source = tuple(sorted(world)), "every rank (the default group)"
    else:
        members, source = tuple(recorded), "the ranks that recorded it"
        notices.append(f"group {_group_label(name, desc)}: the dumps do not name its members (gloo's pg_config "
                       f"is empty); taken as the ranks that recorded it: {describe_ranks(recorded)}")
    progress = GroupProgress(pg=name, desc=desc, members=members, members_from=source, entered={}, ended={})
    for rank in members:
        dump = by_rank.get(rank)
        if dump is None:
            continue
        # The ring's entries, not pg_status: gloo counts its unrecorded send/recv there too.
        entries = [e for e in dump.by_group.get(name, ()) if not e.is_p2p]
        if entries:
            progress.entered[rank] = max(map(_seq_of, entries))
            progress.ended[rank] = max((e.seq for e in entries if e.ended), default=0)
        elif whole_ring(dump):
            progress.entered[rank] = progress.ended[rank] = 0  # the whole ring is here: it never entered
        else:
            progress.unknown.append(rank)
    return progress


_seq_of = operator.attrgetter("seq")


def whole_ring(dump: FrDump) -> bool:
    """Whether the ring never wrapped (its first record is record 0): what it lacks never happened."""
    return not dump.entries or dump.entries[0].record_id == 0


def _collective_hang(group: GroupProgress, by_rank: dict[int, FrDump]) -> Optional[Hang]:
    """The first Seq some members entered and others never did (the later ones follow from it)."""
    if len(group.entered) < 2 or min(group.entered.values()) == max(group.entered.values()):
        return None
    low = min(group.entered.values())
    seq = low + 1
    entered = sorted(r for r, s in group.entered.items() if s >= seq)
    missing = sorted(r for r, s in group.entered.items() if s == low)
    first = next((e for r in entered for e in by_rank[r].by_group.get(group.pg, ()) if e.seq == seq and not e.is_p2p),
                 None)
    return Hang(pg=group.pg, desc=group.desc, seq=seq, collective="not in the rings" if first is None else first.op,
                entered=entered, missing=missing, last={r: _last(by_rank[r], group.pg) for r in sorted(group.entered)},
                capture_seq=None if first is None or first.replay is None else first.capture_seq,
                replay=None if first is None else first.replay)


def _last(dump: FrDump, group: str, p2p: bool = False) -> Position:
    entries = [e for e in dump.by_group.get(group, ()) if e.is_p2p == p2p]
    if not entries:
        return Position(seq=0, collective="none in the ring", state="", ended=True)
    return position_of(entries[-1])


def position_of(entry: FrEntry) -> Position:
    """Where a call left its rank."""
    return Position(seq=entry_seq(entry), collective=call_name(entry), state=entry.state, ended=entry.ended,
                    error=entry.error, capture_seq=entry.capture_seq if entry.replay is not None else None,
                    replay=entry.replay)


def entry_seq(entry: FrEntry) -> int:
    """A collective's Seq; a send/recv's per-peer ordinal (commtag's) or p2p Seq (torch's)."""
    return (entry.pair_seq or entry.p2p_seq) if entry.is_p2p else entry.seq


def call_name(entry: FrEntry) -> str:
    """A call as a person names it: a send/recv with its peer, a replay with its index and capture Seq."""
    if entry.is_p2p:
        return f"{entry.op} {'to' if entry.op == 'send' else 'from'} {entry.peer}"
    if entry.replay is not None:
        return f"{entry.op} replay {entry.replay} of capture Seq {entry.capture_seq}"
    return entry.op


def _p2p_hangs(by_rank: dict[int, FrDump], notices: list[str]) -> list[Hang]:
    """A send or recv still in flight whose peer never made the matching call (by commtag's per-pair
    ordinal; torch's dumps have none, and their p2p calls are not judged)."""
    hangs = []
    unjudged = 0
    for rank, dump in sorted(by_rank.items()):
        for entry in dump.entries:
            if not entry.is_p2p or entry.state == fr.STATE_COMPLETED:  # failed (a timeout) or in flight
                continue
            peer_dump = by_rank.get(entry.peer) if entry.peer is not None else None
            if entry.pair_seq is None or peer_dump is None:
                unjudged += 1
                continue
            wanted = "recv" if entry.op == "send" else "send"
            ordinals = [e.pair_seq for e in peer_dump.by_group.get(entry.group, ()) if e.is_p2p and e.op == wanted
                        and e.peer == rank and e.pair_seq is not None]
            if entry.pair_seq in ordinals:
                continue
            if not ordinals and not whole_ring(peer_dump):
                unjudged += 1
                continue
            pair = f"send {rank}->{entry.peer}" if entry.op == "send" else f"recv {rank}<-{entry.peer}"
            hangs.append(Hang(pg=entry.group, desc=entry.desc, seq=entry.pair_seq, collective=pair,
                              entered=[rank], missing=[peer_dump.rank], is_p2p=True,
                              last={rank: _last(dump, entry.group, True),
                                    peer_dump.rank: _last(peer_dump, entry.group, True)}))
    if unjudged:
        notices.append(f"{unjudged} send/recv calls in flight not judged: their peer's dump or its per-peer "
                       "order is missing (torch's dumps do not record it)")
    return hangs


def _group_label(name: str, desc: str) -> str:
    return f"{name} ({desc})" if desc and desc != "undefined" else name


def plural_ranks(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {describe_ranks(ranks)}"


def describe_ranks(ranks: Iterable[int]) -> str:
    """Ranks as short ranges: ``0-3,7``."""
    values = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for value in values:
        if prev is not None and value == prev + 1:
            prev = value
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = value
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts) or "none"
