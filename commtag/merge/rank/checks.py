"""What a trace event must be for the merge to place it, and the one-line refusal of one that is not."""

from __future__ import annotations

import bisect
import functools
import time
from pathlib import Path
from typing import Iterable, Mapping, Optional, TypeGuard

from commtag.constants import MAX_AHEAD_NS, MAX_DUR_US, MAX_NELEMS, RANK_LIST, TIME_NS_LIMIT, parse_rank_list
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.sidecars import MAX_RANKS, check_world_size
from commtag.merge.inputs.clock import wall_clock
from commtag.vocab import (
    COLLECTIVE_NAME_KEY, CORRELATION_KEY, DST_RANK_KEY, EXTERNAL_ID_KEY, GROUP_SIZE_KEY, IN_NELEMS_KEY, IN_SPLIT_KEY,
    OUT_NELEMS_KEY, OUT_SPLIT_KEY, PG_ID_KEY, PG_NAME_KEY, PG_RANKS_KEY, RANK_KEY, SEQ_KEY, SEQ_LIMIT, SRC_RANK_KEY,
)

_INF = float("inf")


def _number(value: object) -> bool:
    return value.__class__ in (int, float) and value == value and abs(value) != _INF


def _count(value: object, least: int) -> bool:
    return value.__class__ is int and value >= least


def check_distributed_info(path: Path, info: object) -> None:
    """The fields of distributedInfo the merge reads must have their types (rank, world, groups)."""
    if not info:
        return
    if info.__class__ is not dict:
        raise MergeInputError(path, "distributedInfo is not an object")
    for key, least in (("rank", 0), ("world_size", 1)):
        if key in info and not _count(info[key], least):
            raise MergeInputError(path, f"distributedInfo.{key} {info[key]!r} is not an integer >= {least}")
    check_world_size(path, "distributedInfo.world_size", info.get("world_size", 0))
    if "rank" in info and "world_size" in info and info["rank"] >= info["world_size"]:
        raise MergeInputError(path, f"distributedInfo.rank {info['rank']} is outside world_size {info['world_size']}")
    groups = info.get("pg_config") or []
    if groups.__class__ is not list:
        raise MergeInputError(path, "distributedInfo.pg_config is not a list")
    for i, pg in enumerate(groups):
        if pg.__class__ is not dict:
            raise MergeInputError(path, f"distributedInfo.pg_config[{i}] is not an object")
        ranks = pg.get("ranks", [])
        if ranks.__class__ is not list or not all(_count(r, 0) for r in ranks):
            raise MergeInputError(path, f"distributedInfo.pg_config[{i}].ranks is not a list of ranks")


def check_ids(path: Path, i: int, e: dict) -> None:
    """pid and tid are numbers or names (Kineto writes both), args an object (or null)."""
    for key in ("pid", "tid"):
        if key in e and e[key].__class__ is not int and e[key].__class__ is not str:
            raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): {key} {e[key]!r} is not a number or name")
    if e.get("args") is not None and e["args"].__class__ is not dict:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): args is not an object")


def refuse(path: Path, i: int, e: dict, base: int) -> None:
    """Raise the error that says what is wrong with ``traceEvents[i]``, a slice or instant the loop refused."""
    ph = e.get("ph")
    ts = e.get("ts")
    if ts is None:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): missing 'ts'")
    if not _number(ts) or ts < 0:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): ts {ts!r} is not a finite non-negative number")
    dur = e.get("dur", 0) if ph == "X" else 0
    if not _number(dur) or not 0 <= dur <= MAX_DUR_US:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): dur {dur!r} is not a duration in [0, 1 day] (us)")
    for key in ("name", "cat"):
        if key in e and e[key].__class__ is not str:
            raise MergeInputError(path, f"traceEvents[{i}]: {key} {e[key]!r} is not a string")
    for key in ("pid", "tid"):
        if key not in e:
            raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): missing {key!r}")
    check_ids(path, i, e)
    start = round(ts * 1000) + base
    raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): time {start} ns is outside int64 nanoseconds")


def check_join_args(path: Path, events: Iterable[dict]) -> None:
    """The args attach joins by are what Kineto writes on every event that carries them: the names
    it compares ("Collective name", "Process Group Name") strings, the ids it looks up ("External
    id", "correlation") numbers or names; anything else is bad input, not a key. A message's element
    count is a whole number bounded as a sidecar's is (:data:`commtag.constants.MAX_NELEMS`): 8.5 is
    bad input, not 8; one that is no number
    (null, text) reads as unknown (:func:`commtag.merge.records.whole`)."""
    for e in events:
        args = e.get("args")
        if not args:
            continue
        get = args.get  # one quick pass that passes what Kineto writes; the rest is looked at closely
        n, m = get(IN_NELEMS_KEY), get(OUT_NELEMS_KEY)
        if (get(COLLECTIVE_NAME_KEY, "").__class__ is not str or get(PG_NAME_KEY, "").__class__ is not str
                or get(EXTERNAL_ID_KEY).__class__ not in _ID_CLASSES or get(CORRELATION_KEY).__class__ not in _ID_CLASSES
                or n.__class__ is float or m.__class__ is float
                or (n.__class__ is int and not 0 <= n <= MAX_NELEMS) or (m.__class__ is int and not 0 <= m <= MAX_NELEMS)):
            _check_join_args_of(path, e, args)


#: The classes an id attach looks up by may have (None: absent, or written as null).
_ID_CLASSES = frozenset({int, str, type(None)})


def _check_join_args_of(path: Path, e: dict, args: dict) -> None:
    """:func:`check_join_args` of one event the quick pass stopped at: the error, where there is one."""
    for key in (COLLECTIVE_NAME_KEY, PG_NAME_KEY):
        if key in args and args[key].__class__ is not str:
            raise MergeInputError(path, f"traceEvents ({e.get('name')!r}): {key!r} {args[key]!r} is not a string")
    for key in (EXTERNAL_ID_KEY, CORRELATION_KEY):
        if key in args and args[key] is not None and args[key].__class__ not in (int, str):
            raise MergeInputError(path, f"traceEvents ({e.get('name')!r}): {key!r} {args[key]!r} is not a number or name")
    for key in (IN_NELEMS_KEY, OUT_NELEMS_KEY):
        n = args.get(key)
        if n.__class__ in (int, float) and not (0 <= n <= MAX_NELEMS and n == int(n)):
            raise MergeInputError(path, f"traceEvents ({e.get('name')!r}): {key!r} {n!r} is not an element count "
                                        f"in [0, {MAX_NELEMS}]")


def check_clock(path: Path, last_ns: Optional[int]) -> None:
    """A trace cannot end long after the merging machine's clock: such times are bad input."""
    now = time.time_ns()
    if last_ns is not None and last_ns > now + MAX_AHEAD_NS:
        raise MergeInputError(path, f"its clock is absurd: it ends at {wall_clock(last_ns)}, "
                                    f"{(last_ns - now) / 86_400e9:.0f} days after this machine's clock "
                                    "(check its baseTimeNanoseconds and ts)")


def _whole(value: object, least: int, most: int) -> TypeGuard[int]:
    """An int (not a bool, not 8.0) in [least, most]."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


@functools.lru_cache(maxsize=4096)
def _is_rank_list(text: str) -> bool:
    """Cached: a group's rank list and a call site's split sizes repeat on every record of a rank
    (a world group's list is thousands of characters at a thousand ranks)."""
    return RANK_LIST.match(text) is not None


class _GroupRanks(frozenset[int]):
    """The distinct ranks a rank list names, with how many it lists and the highest."""

    listed: int
    highest: int


@functools.lru_cache(maxsize=1024)
def _group_ranks(text: str) -> Optional[_GroupRanks]:
    """A rank list's ranks (None: empty or cut short), parsed once per distinct list: every
    record of a group repeats it, so parsing it per record made a merge's cost per record grow
    with the group's size."""
    ranks = parse_rank_list(text)
    if not ranks:
        return None
    found = _GroupRanks(ranks)
    found.listed, found.highest = len(ranks), max(ranks)
    return found


def record_problem(args: Mapping[str, object], world_size: object, named: bool) -> Optional[str]:
    """Why a trace's collective record (its eager keys) cannot be read, or None: a field the
    matching would misread (a Seq that is no Seq, a rank list that lists no ranks, ranks outside
    the world or the group, negative split sizes). Such a record is left out of the matching,
    never guessed at: a guess would blame a rank for what the file got wrong. ``named``: whether
    the file's other records name their group (a record that alone names none cannot be placed)."""
    seq = args.get(SEQ_KEY)
    if SEQ_KEY in args and not _whole(seq, 0, SEQ_LIMIT):
        return f"{SEQ_KEY!r} {seq!r} is not a sequence number in [0, 2**63-1]"
    if named and PG_NAME_KEY not in args and PG_ID_KEY not in args:
        return f"no {PG_NAME_KEY!r} (the file's other records name their group)"
    for key in (IN_SPLIT_KEY, OUT_SPLIT_KEY, PG_RANKS_KEY):
        text = args.get(key)
        if key in args and (text.__class__ is not str or not _is_rank_list(text)):
            return f"{key!r} {text!r} is not a list of non-negative integers"
    ranks = _group_ranks(args[PG_RANKS_KEY]) if PG_RANKS_KEY in args else None
    size = args.get(GROUP_SIZE_KEY)
    if GROUP_SIZE_KEY in args and not _whole(size, 1, MAX_RANKS):
        return f"{GROUP_SIZE_KEY!r} {size!r} is not a group size"
    if ranks:
        if len(ranks) != ranks.listed:
            return f"{PG_RANKS_KEY!r} names a rank twice"
        if _count(world_size, 1) and ranks.highest >= world_size:  # type: ignore[operator]
            return f"{PG_RANKS_KEY!r} names rank {ranks.highest}, outside the world of {world_size}"
        if size.__class__ is int and size != ranks.listed:
            return f"{GROUP_SIZE_KEY!r} {size} but {PG_RANKS_KEY!r} lists {ranks.listed} ranks"
    for key in (DST_RANK_KEY, SRC_RANK_KEY):
        peer = args.get(key)
        if key in args and not (_whole(peer, 0, MAX_RANKS) and (not ranks or peer in ranks)):
            return f"{key!r} {peer!r} is not a global rank of the group"
    rank = args.get(RANK_KEY)
    if rank is not None and not (_whole(rank, 0, MAX_RANKS) and (not _whole(size, 1, MAX_RANKS) or rank < size)):
        return f"{RANK_KEY!r} {rank!r} is not a group rank of a group of {size}"
    return None


#: How far outside its trace's time span a sidecar's recorded call may start (rounding, the
#: profiler starting its first event late): beyond it the call is not in the trace.
PAIR_SLACK_NS = 10**9


def records_in_span(path: Path, sidecar, first: Optional[int], last: Optional[int], offset: int, notes: list[str],
                    blind: list[tuple[int, int]]):
    """The sidecar (a copy) without its recorded calls that start more than :data:`PAIR_SLACK_NS`
    outside its trace's span ``first``..``last`` (ns, with ``offset``), said in ``notes``: such a
    call did not run in the profiled window, and aligning it to the trace would invent its time.
    Where its call ran is not known: from its group's call before it to the one after goes to
    ``blind`` (see rows.without_blind), so the rank is not blamed for lacking it."""
    if sidecar is None or first is None or last is None:
        return sidecar
    calls = sidecar.collectives
    inside = [first - PAIR_SLACK_NS <= c.start_ns + offset <= last + PAIR_SLACK_NS for c in calls]
    if all(inside) or not any(inside):  # none inside: the two are of different runs (stage._check_pair)
        return sidecar
    outside = [i for i, ok in enumerate(inside) if not ok]
    by_group: dict[str, list[tuple[int, int, int]]] = {}
    for c, ok in zip(calls, inside):
        if ok:
            by_group.setdefault(c.annotation.pg_uid, []).append((c.annotation.seq, c.start_ns + offset, c.end_ns + offset))
    for seqs in by_group.values():
        seqs.sort()
    for i in outside:
        seqs = by_group.get(calls[i].annotation.pg_uid, [])
        at = bisect.bisect_left(seqs, (calls[i].annotation.seq,))
        after = bisect.bisect_right(seqs, (calls[i].annotation.seq, TIME_NS_LIMIT))
        blind.append((seqs[at - 1][2] if at else first, seqs[after][1] if after < len(seqs) else last))
    notes.append(f"{path}: {len(outside)} of its sidecar's recorded calls start more than {PAIR_SLACK_NS // 10**9} s "
                 f"outside the trace's {wall_clock(first - offset)} to {wall_clock(last - offset)} (collectives."
                 f"{outside[0]} at {wall_clock(calls[outside[0]].start_ns)}): left out, not placed on the trace")
    return sidecar.model_copy(update={"collectives": [c for c, ok in zip(calls, inside) if ok]})
