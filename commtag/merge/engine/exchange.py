"""The exchange between merge workers: every worker gets every rank's records.

:func:`exchange` gives every worker every rank's :class:`RankSummary` and
:func:`all_done` runs one step on all of them, an error on any stopping all;
both travel as JSON bytes over the workers' :class:`commtag.merge.engine.worlds.World`,
never pickle (:func:`to_wire`, :func:`from_wire`).
"""

from __future__ import annotations

from dataclasses import asdict, astuple, fields
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Callable, Optional

import orjson

from commtag.merge.errors import MergeInputError
from commtag.merge.account import EventAccount
from commtag.merge.records import CollectiveInstance, FileSpan, GroupLane, Interner, RankSummary
from commtag.merge.engine.worlds import NotSent

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World


def exchange(world: World, produce: Callable[[], list[RankSummary]], interner: Interner,
             skipped: Optional[list[MergeInputError]] = None,
             notices: Optional[list[str]] = None) -> list[RankSummary]:
    """Every worker's summaries (``produce`` makes this worker's), in rank order; an input
    error anywhere stops all workers.

    ``skipped`` (--skip-bad-ranks) becomes every worker's skipped files, and
    ``notices`` every worker's notices (those ``produce`` added while reading
    its ranks too), each once, in worker order. A worker keeps its own
    summaries as they are and decodes only the others'.
    """
    if world.size == 1:
        # Nothing to exchange: a JSON round trip of every instance would cost more than the merge.
        return sorted(produce(), key=lambda s: s.rank)
    mine: list[RankSummary] = []
    batches: list[list[RankSummary]] = [[]]

    def step() -> dict:
        nonlocal mine, batches
        mine = produce()
        batches = _rounds(mine)
        return {**to_wire(batches[0]), "rounds": len(batches),
                "skipped": [[str(e.path), e.problem] for e in skipped or ()], "notices": list(notices or ())}

    parts = all_done(world, step)
    if notices is not None:
        notices[:] = dict.fromkeys(n for part in parts for n in (notices if part is None else part["notices"]))
    if skipped is not None:
        every = [[[str(e.path), e.problem] for e in skipped] if part is None else part["skipped"] for part in parts]
        union = dict.fromkeys((path, problem) for listed in every for path, problem in listed)
        skipped[:] = [MergeInputError(path, problem) for path, problem in union]
    rounds = max([len(batches)] + [part["rounds"] for part in parts if part is not None])
    others = [s for part in parts if part is not None for s in from_wire(part, interner)]
    del parts
    for r in range(1, rounds):
        batch = batches[r] if r < len(batches) else []
        for part in all_done(world, lambda: to_wire(batch)):
            if part is not None:
                others += from_wire(part, interner)
    return sorted(mine + others, key=lambda s: s.rank)


#: Collective instances a merge worker sends per exchange round. orjson parses a whole document
#: into a tree of its own before it makes the Python objects: a 512-rank torchrun-2 worker's part
#: (11.5 MB of JSON) took 69 MB at once. Rounds of this many keep that peak a few MB.
EXCHANGE_ROUND_INSTANCES = 8192


def _rounds(summaries: list[RankSummary]) -> list[list[RankSummary]]:
    """Consecutive summaries, each round at most EXCHANGE_ROUND_INSTANCES instances (a rank
    with more goes alone); at least one round, maybe empty."""
    rounds: list[list[RankSummary]] = [[]]
    count = 0
    for summary in summaries:
        if rounds[-1] and count + len(summary.instances) > EXCHANGE_ROUND_INSTANCES:
            rounds.append([])
            count = 0
        rounds[-1].append(summary)
        count += len(summary.instances)
    return rounds


def all_done(world: World, step: Callable[[], Optional[dict]]) -> list[Optional[dict]]:
    """Run ``step`` on every worker and gather what each returned (None in this worker's own
    place); an input or output error on any worker stops all of them, each naming the first."""
    if world.size == 1:
        step()
        return [None]
    blobs, error = _gathered(world, lambda: orjson.dumps(step() or {}))
    # Each part parsed, then its bytes dropped: every worker's records are in memory once at a time, not twice.
    parts: list[Optional[dict]] = []
    for i in range(len(blobs)):
        blob, blobs[i] = blobs[i], b""
        parts.append(None if i == world.index else orjson.loads(blob))
        del blob
    _raise_first(parts, error)
    return parts


def addressed(world: World, pieces: dict[int, dict]) -> tuple[list[Optional[dict]], bool]:
    """Send each worker ``w`` the piece ``pieces[w]`` (some workers none): the piece each worker sent
    this one (None: none, and in this worker's own place), and whether any worker sent any piece.
    Errors stop every worker as in :func:`all_done`.

    Every worker's part still reaches every worker (a :class:`World` gathers), but each piece is its
    own JSON document behind a line of their sizes, so a worker parses only its own: parsing whole
    parts, each worker parsed what every other was sent too, the worker count times its share."""
    me = world.index
    assert me not in pieces, "a worker hands its own pieces over itself: they never travel"
    if world.size == 1:
        return [None], False

    def framed() -> bytes:
        blobs = [orjson.dumps(pieces[w]) if w in pieces else b"" for w in range(world.size)]
        return b"".join([orjson.dumps({"sizes": [len(blob) for blob in blobs]}), b"\n", *blobs])  # one copy

    blobs, error = _gathered(world, framed)
    heads: list[Optional[dict]] = []
    mine: list[Optional[dict]] = []
    busy = bool(pieces)
    for i in range(len(blobs)):
        blob, blobs[i] = blobs[i], b""
        if i == me:
            heads.append(None)
            mine.append(None)
            continue
        head, piece = piece_of(blob, me)
        heads.append(head)
        busy = busy or any(head.get("sizes", ()))
        mine.append(None if piece is None else orjson.loads(piece))
        del piece, blob
    _raise_first(heads, error)
    return mine, busy


def piece_of(part: bytes, index: int) -> tuple[dict, Optional[memoryview]]:
    """The line of sizes that starts a part :func:`addressed` sent (an error's part is that error
    alone) and the bytes of worker ``index``'s piece in it, unparsed (None: it has none)."""
    end = part.find(b"\n")  # JSON text holds no raw newline: the first ends the sizes
    view = memoryview(part)
    head = orjson.loads(view[:end] if end >= 0 else view)
    sizes = head.get("sizes")
    if not sizes or not sizes[index]:
        return head, None
    at = end + 1 + sum(sizes[:index])
    return head, view[at:at + sizes[index]]


def _gathered(world: World, payload: Callable[[], bytes]) -> tuple[list[bytes], Optional[MergeInputError]]:
    """Every worker's ``payload()`` bytes of this round, and this worker's own error: an input error
    raised making the payload goes out in its place, as does the error of a payload the world
    could not send (:class:`NotSent`)."""
    error: Optional[MergeInputError] = None
    try:
        data = payload()
    except MergeInputError as exc:
        error = exc
        data = _error_payload(exc)
    try:
        blobs = world.all_gather_bytes(data)
    except NotSent as exc:  # a full disk took this worker's data: it sends why it stops in its place
        error = error or exc
        blobs = world.all_gather_bytes(_error_payload(error))
    return blobs, error


def _raise_first(parts: list[Optional[dict]], error: Optional[MergeInputError]) -> None:
    """Raise the first error in worker order (this worker's own, in its None place): every worker
    names the same one."""
    for part in parts:
        if part is None and error is not None:
            raise error
        if part is not None and "error" in part:
            raise MergeInputError(*part["error"])


def from_everyone(world: World, step: Callable[[], dict]) -> list[dict]:
    """What ``step`` returned on every worker, this one's included (:func:`all_done`)."""
    mine: dict = {}

    def run() -> dict:
        nonlocal mine
        mine = step()
        return mine

    return [mine if part is None else part for part in all_done(world, run)]


def _error_payload(error: MergeInputError) -> bytes:
    return orjson.dumps({"error": [str(error.path), error.problem]})


_FIELDS = [f.name for f in fields(CollectiveInstance)]
_READERS = [attrgetter(name) for name in _FIELDS]


_COMMON_AT = _FIELDS.index("common_args")


_RANKS_AT = _FIELDS.index("group_ranks")


#: Fields sent as an index into a table of texts: a lane name holds the group's ranks.
_TEXTS_AT = [_FIELDS.index(name) for name in ("pg_uid", "collective", "dtype", "source", "lane_name")]


#: Numbers that many instances repeat (a rank, a call site's sizes): after decoding, one object each
#: (those of the call sites' args where they hold them), as where the instances were made, not
#: 28 bytes per instance each (an int above 256 is a new object each time orjson reads it).
_REPEATED_AT = [_FIELDS.index(name) for name in ("rank", "in_nelems", "out_nelems", "group_size", "lane_id")]


_ARGS_AT = _FIELDS.index("args")


def to_wire(summaries: list[RankSummary]) -> dict:
    """Summaries as JSON data: a rank's instances as one column per field (not a list per
    instance: on both ends those were most of what the exchange added to a worker's peak), their
    ``common_args``, texts and member ranks (theirs and their groups') indexes into tables, so
    that what many instances and ranks share travels once (a group's members listed in every
    member's summary grew with the square of the ranks). Shared objects are found by identity
    (member tuples are interned), not hashed again for every instance. Each column is read in one
    C call (``attrgetter``), and numbered without a Python step per instance."""
    index: dict[int, int] = {}
    table: list[dict] = []
    texts: dict[str, int] = {}
    rank_lists: dict[int, tuple[int, tuple]] = {}
    out = []
    for s in summaries:
        columns = [list(map(read, s.instances)) for read in _READERS]
        # Each distinct object or text numbered in the order first met (dict.fromkeys keeps it), the
        # columns then mapped to the numbers: C loops, a Python step per distinct value only.
        ids = list(map(id, columns[_COMMON_AT]))
        for key, common in dict(zip(ids, columns[_COMMON_AT])).items():
            if key not in index:
                index[key] = len(table)
                table.append(common)
        columns[_COMMON_AT] = list(map(index.__getitem__, ids))
        named = [columns[at] for at in _TEXTS_AT]
        for text in dict.fromkeys(chain.from_iterable(zip(*named))):  # instance by instance, field by field
            texts.setdefault(text, len(texts))
        for at in _TEXTS_AT:
            columns[at] = list(map(texts.__getitem__, columns[at]))
        ids = list(map(id, columns[_RANKS_AT]))
        for key, ranks in dict(zip(ids, columns[_RANKS_AT])).items():
            if key not in rank_lists:  # held with its number, so that its id stays its own
                rank_lists[key] = (len(rank_lists), ranks)
        columns[_RANKS_AT] = [rank_lists[key][0] for key in ids]
        groups = []
        for name, lane_id, uid, ranks in s.groups:  # a group's members travel once, not once per rank
            found = rank_lists.get(id(ranks))
            if found is None:
                found = rank_lists[id(ranks)] = (len(rank_lists), ranks)
            groups.append([name, lane_id, uid, found[0]])
        out.append({"rank": s.rank, "host": s.host, "first_ns": s.first_ns, "groups": groups,
                    "lane_kernels": s.lane_kernels, "windows": s.windows, "world_size": s.world_size,
                    "files": [astuple(f) for f in s.files], "instances": columns, "notes": s.notes, "steps": s.steps,
                    "step_seqs": s.step_seqs,
                    "account": None if s.account is None else asdict(s.account)})
    return {"common": table, "texts": list(texts), "ranks": [ranks for _, ranks in rank_lists.values()],
            "summaries": out}


def from_wire(data: dict, interner: Interner) -> list[RankSummary]:
    """The summaries :func:`to_wire` sent, their shared args and rank lists interned again (by the merge's ``interner``)."""
    # Rebuilt key by key, texts shared: orjson sizes a dict's table for more keys than it holds (a
    # 21-key call site's args took 1,168 bytes against 464) and gives every dict its own copy of a
    # text that many call sites repeat (a group's ranks); these are kept for the whole merge.
    table = [interner.common({key: interner.shared(value) if value.__class__ is str else value
                              for key, value in args.items()}) for args in data["common"]]
    texts = [interner.shared(text) for text in data["texts"]]  # the same objects as the args' (a pg uid, a lane)
    rank_lists = [interner.shared(tuple(ranks)) for ranks in data["ranks"]]
    # The call sites' numbers first, for the instance fields that repeat them (sizes, lane id).
    same = {value: value for args in table for value in args.values() if value.__class__ is int}
    summaries = []
    for s in data["summaries"]:
        columns = s.pop("instances")
        for at in _REPEATED_AT:
            columns[at] = [same.setdefault(value, value) for value in columns[at]]
        columns[_ARGS_AT] = [{key: same.setdefault(value, value) if value.__class__ is int else value
                              for key, value in own.items()} for own in columns[_ARGS_AT]]
        columns[_COMMON_AT] = list(map(table.__getitem__, columns[_COMMON_AT]))
        columns[_RANKS_AT] = list(map(rank_lists.__getitem__, columns[_RANKS_AT]))
        for at in _TEXTS_AT:
            columns[at] = list(map(texts.__getitem__, columns[at]))
        instances = list(map(CollectiveInstance, *columns))  # row by row in one C loop
        s["groups"] = [GroupLane(name, lane_id, uid, rank_lists[ranks]) for name, lane_id, uid, ranks in s["groups"]]
        s["windows"] = [tuple(w) for w in s["windows"]]
        s["steps"] = [tuple(step) for step in s["steps"]]
        s["step_seqs"] = [tuple(found) for found in s["step_seqs"]]
        s["account"] = None if s["account"] is None else EventAccount(**s["account"])
        s["files"] = [FileSpan(*f) for f in s["files"]]
        summaries.append(RankSummary(**s, instances=instances))
    return summaries
