"""Flight Recorder dumps read: torch's pickle (through a restricted unpickler) and JSON forms, and commtag's.

A dump is found by its name, as torch names it (``<prefix><rank>``: no extension, the rank last), and
by its first byte (a pickle's protocol mark, or ``{``). A pickle is read by :class:`PlainUnpickler`,
which builds plain containers, strings and numbers and refuses every class: a dump that needs one
is refused in one line, never run.
"""

from __future__ import annotations

import io
import operator
import os
import pickle
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import orjson

from commtag.merge.collector import collector_paused
from commtag.merge.errors import MergeInputError
from commtag.vocab import flight_recorder as fr

#: A dump's name: anything, then the rank (torch's ``<prefix><rank>``), no extension.
DUMP_NAME = re.compile(r"^(?P<prefix>[^.]*?)(?P<rank>\d+)$")
#: The first byte of a pickle of protocol 2 or later (PROTO), and of a JSON object.
_PICKLE_MARK = 0x80
_JSON_MARK = ord("{")


class DumpError(MergeInputError):
    """A dump that cannot be read: names the file and the problem (one line, exit 2)."""


class PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, strings, bytes, numbers, None and booleans, and nothing else:
    any class or function the pickle names is refused, so reading a dump runs no code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it needs the class {module}.{name}, and a dump holds only plain data")

    # persistent_load is left undefined: the C unpickler then refuses a persistent id itself.


def load_plain_pickle(data: bytes) -> Any:
    """The plain data a pickle holds (pickle.UnpicklingError: one that needs more)."""
    return PlainUnpickler(io.BufferedReader(io.BytesIO(data))).load()


@dataclass(slots=True)
class FrEntry:
    """One collective or p2p call of a rank's ring, in the terms diagnosis needs."""

    group: str  # the group's name (process_group[0])
    desc: str
    seq: int  # collective_seq_id (0 for p2p)
    p2p_seq: int
    backend: str
    op: str  # "all_reduce", "send", ...
    peer: Optional[int]  # global rank of a p2p op's peer, where known
    pair_seq: Optional[int]  # commtag's per-peer ordinal of a p2p op
    state: str
    ended: bool  # completed, or retired (gloo: ended, successfully or not)
    created_ns: int
    ended_ns: Optional[int]
    input_sizes: list
    output_sizes: list
    input_dtypes: list
    output_dtypes: list
    is_p2p: bool
    record_id: int
    pg_id: Optional[int]
    input_splits: Optional[list] = None
    output_splits: Optional[list] = None
    replay: Optional[int] = None
    name: str = ""  # the profiling name as written
    error: Optional[str] = None  # what the call raised (commtag's dumps)
    #: On a group whose collectives CUDA-graph replays ran (seq then numbers its calls in time order):
    #: the call's own Seq, a replay's its capture's (commtag's dumps).
    capture_seq: Optional[int] = None


@dataclass(slots=True)
class FrDump:
    """One rank's dump: its entries in record order, its groups' members where it says them."""

    path: Path
    rank: int
    version: str
    entries: list[FrEntry]
    #: Group name -> its global ranks, from pg_config (empty where the dump does not say them).
    members: dict[str, tuple[int, ...]]
    #: The dump's own time (commtag's dumps), else None.
    dump_ns: Optional[int]
    by_commtag: bool
    world_size: Optional[int] = None
    #: Entries of the ring left out, by why (unknown op names, missing keys).
    left_out: dict[str, int] = field(default_factory=dict)
    #: Group name -> its entries, in record order: the diagnosis reads each group's alone.
    by_group: dict[str, list[FrEntry]] = field(default_factory=dict)
    #: The dumps of its folder not read (one list, shared by the folder's dumps).
    folder_not_read: list[NotRead] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NotRead:
    """A dump in the folder that is not read, said in the summary: its rank's commtag dump is read
    (``read``), which holds every call commtag saw whatever the backend, or the folder's torch dumps read
    are another prefix's: each torch recorder numbers its own Seq, so two are never mixed."""

    path: Path
    rank: int
    prefix: str
    #: The file read for this rank instead; None where the rank has none of the prefix read.
    read: Optional[Path]
    beside_commtag: bool

    def why(self) -> str:
        if self.beside_commtag:
            return "commtag's dump of the rank is read: it holds every call commtag saw, whatever the backend"
        return "the folder's torch dumps read are another prefix's: each recorder numbers its own Seq, never mixed"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "file": str(self.path), "read_instead": None if self.read is None else str(self.read),
                "why": self.why()}


def find_dumps(folder: Path) -> dict[int, Path]:
    """The FR dumps directly in ``folder`` that are read, by rank (see :func:`survey_dumps`)."""
    return survey_dumps(folder)[0]


def survey_dumps(folder: Path) -> tuple[dict[int, Path], list[NotRead]]:
    """The FR dumps directly in ``folder``: the one read per rank, and the others. A rank's commtag dump is
    read where it has one; the other ranks' are torch's of one prefix, the one most of them have (the
    first in name order on a tie: torch's default recorder, ``torch_fr_``, before a backend's)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise DumpError(folder, f"cannot list: {exc.strerror or exc}") from None
    by_rank: dict[int, list[tuple[str, bool, str]]] = {}
    for name in names:
        match = DUMP_NAME.match(name)
        path = folder / name
        if match is None or not path.is_file():
            continue
        head = _head(path)
        if head is not None:
            by_rank.setdefault(int(match["rank"]), []).append((match["prefix"], head[1], name))
    counts: dict[str, int] = {}
    for files in by_rank.values():
        if not any(by_commtag for _, by_commtag, _ in files):
            for prefix, _, _ in files:
                counts[prefix] = counts.get(prefix, 0) + 1
    chosen = min(counts, key=lambda prefix: (-counts[prefix], prefix)) if counts else None
    found: dict[int, Path] = {}
    not_read: list[NotRead] = []
    for rank, files in sorted(by_rank.items()):
        commtags = [name for _, by_commtag, name in files if by_commtag]
        read = commtags[0] if commtags else next((name for prefix, _, name in files if prefix == chosen), None)
        if read is not None:
            found[rank] = folder / read
        not_read.extend(NotRead(folder / name, rank, prefix, None if read is None else folder / read, bool(commtags))
                        for prefix, _, name in files if name != read)
    return found, not_read


#: A JSON dump names one of these keys near its start (quoted, as JSON writes them).
_JSON_KEYS = tuple(f'"{key}"'.encode() for key in (fr.FR_ENTRIES, fr.FR_VERSION, fr.FR_PG_CONFIG))


def _head(path: Path) -> Optional[tuple[str, bool]]:
    """("pickle" or "json", whether commtag wrote it) for a file that starts as a dump, else None."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(4096)
    except OSError:
        return None
    if not start:
        return None
    if start[0] == _PICKLE_MARK:
        return "pickle", fr.CT_DUMP_NS.encode() in start or fr.CT_RANK.encode() in start
    if start[0] == _JSON_MARK and any(key in start for key in _JSON_KEYS):
        return "json", fr.CT_RANK.encode() in start
    return None


def read_dump(path: Path, rank: int) -> FrDump:
    """One dump, pickle or JSON (DumpError: unreadable, not plain data, or not a dump)."""
    try:
        with open(path, "rb") as handle:  # read through its buffer: 3x faster than a pickle's bytes in BytesIO
            if handle.peek(1)[:1] == bytes([_PICKLE_MARK]):
                doc = _plain_pickle(path, handle)
            else:
                try:
                    doc = orjson.loads(handle.read())
                except orjson.JSONDecodeError as exc:
                    raise DumpError(path, f"not valid JSON: {exc}") from None
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    # torch's JSON leaves the entries out where the ring is empty (FlightRecorderDetail.hpp dump_json).
    if not isinstance(doc, dict) or not isinstance(doc.get(fr.FR_ENTRIES, [] if fr.FR_VERSION in doc else None), list):
        raise DumpError(path, "not a Flight Recorder dump (no list of entries)")
    return _dump(path, rank, doc)


def _plain_pickle(path: Path, handle: Any) -> Any:
    try:
        return PlainUnpickler(handle).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise DumpError(path, f"not a Flight Recorder dump commtag reads: {' '.join(str(exc).split())}") from None


def _dump(path: Path, rank: int, doc: dict) -> FrDump:
    said_rank = doc.get(fr.CT_RANK)
    if isinstance(said_rank, int) and said_rank != rank:
        raise DumpError(path, f"named for rank {rank} but written by rank {said_rank}")
    dump = FrDump(path=path, rank=rank, version=str(doc.get(fr.FR_VERSION, "")), entries=[],
                  members=_members(doc.get(fr.FR_PG_CONFIG)),
                  dump_ns=_int(doc.get(fr.CT_DUMP_NS)), by_commtag=fr.CT_RANK in doc,
                  world_size=_int(doc.get(fr.CT_WORLD_SIZE)))
    for raw in doc.get(fr.FR_ENTRIES, ()):
        entry = _entry(raw, dump.members, dump.by_commtag)
        if isinstance(entry, str):
            dump.left_out[entry] = dump.left_out.get(entry, 0) + 1
        else:
            dump.entries.append(entry)
    dump.entries.sort(key=_record_id)
    for entry in dump.entries:
        group = dump.by_group.get(entry.group)
        if group is None:
            group = dump.by_group[entry.group] = []
        group.append(entry)
    return dump


def _members(config: Any) -> dict[str, tuple[int, ...]]:
    """pg_config's ranks per group name; a group that names no ranks (gloo's) is left out."""
    members: dict[str, tuple[int, ...]] = {}
    if not isinstance(config, dict):
        return members
    for name, group in config.items():
        ranks = group.get("ranks") if isinstance(group, dict) else None
        if isinstance(ranks, str):
            ranks = [int(r) for r in re.findall(r"-?\d+", ranks)]
        if isinstance(ranks, (list, tuple)) and ranks and all(isinstance(r, int) for r in ranks) and name != "":
            members[str(name)] = tuple(sorted(ranks))
    return members


def _int(value: Any) -> Optional[int]:
    return value if type(value) is int else None


#: The keys of torch's entry the diagnosis reads, fetched in one call where all are there (torch writes
#: every one); an entry that lacks some is read key by key.
_TORCH_KEYS = (fr.E_PROCESS_GROUP, fr.E_PROFILING_NAME, fr.E_SEQ, fr.E_STATE, fr.E_IS_P2P, fr.E_COMPLETED_NS,
               fr.E_CREATED_NS, fr.E_P2P_SEQ, fr.E_RECORD_ID, fr.E_PG_ID, fr.E_INPUT_SIZES, fr.E_OUTPUT_SIZES,
               fr.E_INPUT_DTYPES, fr.E_OUTPUT_DTYPES, fr.E_RETIRED)
_torch_fields = operator.itemgetter(*_TORCH_KEYS)


def _entry(raw: Any, members: dict[str, tuple[int, ...]], by_commtag: bool) -> FrEntry | str:
    """An entry, or why it is left out (read on every entry of every ring: one call fetches torch's keys,
    commtag's are looked up only in commtag's dumps, the shared values are found once per distinct value)."""
    if type(raw) is not dict:
        return "an entry that is not a mapping"
    try:
        (group, name, seq, state, is_p2p, completed_ns, created, p2p_seq, record_id, pg_id,
         in_sizes, out_sizes, in_dtypes, out_dtypes, retired) = _torch_fields(raw)
    except KeyError:
        (group, name, seq, state, is_p2p, completed_ns, created, p2p_seq, record_id, pg_id,
         in_sizes, out_sizes, in_dtypes, out_dtypes, retired) = map(raw.get, _TORCH_KEYS)
        state = raw.get(fr.E_STATE, "")
    if (type(group) not in (list, tuple) or len(group) != 2 or type(name) is not str or type(seq) is not int):
        return "an entry without a process_group, profiling_name or collective_seq_id as torch writes them"
    known = _CALLS.get((name, group)) if type(group) is tuple else None
    if known is None:
        known = _call_names(name, group)
        if type(group) is tuple and type(group[0]) is str and type(group[1]) is str and len(_CALLS) < _SHARED_MAX:
            _CALLS[(name, group)] = known
    backend, op, meta, group_name, desc, name = known
    state = sys.intern(state) if type(state) is str else str(state)
    is_p2p = op in fr.FR_P2P_OPS or is_p2p is True
    completed_ns = completed_ns if type(completed_ns) is int and completed_ns else None
    peer = pair_seq = end_ns = in_splits = out_splits = replay = error = capture_seq = None
    if by_commtag:
        get = raw.get
        peer, pair_seq, error = _int(get(fr.CT_PEER)), _int(get(fr.CT_PAIR_SEQ)), get(fr.CT_ERROR)
        if get(fr.CT_CAPTURE_SEQ) is not None:
            capture_seq, replay = _int(get(fr.CT_CAPTURE_SEQ)), _int(get(fr.CT_REPLAY))
        if get(fr.CT_END_NS) is not None or get(fr.CT_IN_SPLITS) is not None:
            end_ns = _int(get(fr.CT_END_NS))
            in_splits, out_splits = _list(get(fr.CT_IN_SPLITS)) or None, _list(get(fr.CT_OUT_SPLITS)) or None
    if peer is None and is_p2p:
        group_peer = fr.p2p_peer(op, meta)
        ranks = members.get(group_name)
        if group_peer is not None and ranks and 0 <= group_peer < len(ranks):
            peer = ranks[group_peer]
    in_sizes, out_sizes, in_dtypes, out_dtypes = _shape((in_sizes, out_sizes, in_dtypes, out_dtypes))
    return FrEntry(
        group_name, desc, seq, p2p_seq if type(p2p_seq) is int else 0, backend, op, peer, pair_seq, state,
        state == fr.STATE_COMPLETED or retired is True or completed_ns is not None,
        created if type(created) is int else 0, end_ns or completed_ns,
        in_sizes, out_sizes, in_dtypes, out_dtypes,
        is_p2p, record_id if type(record_id) is int else 0, pg_id if type(pg_id) is int else None,
        in_splits, out_splits, replay, name, error if type(error) is str else None, capture_seq,
    )


#: (profiling name, process_group) as read -> what :func:`_call_names` makes of them: a ring repeats a
#: few calls on a few groups, each read once.
_CALLS: dict[tuple, tuple[str, str, Optional[str], str, str, str]] = {}


def _call_names(name: str, group: Any) -> tuple[str, str, Optional[str], str, str, str]:
    """The backend, op and p2p detail of a profiling name, the group's name and description, and the
    name itself, strings interned."""
    backend, op, meta = fr.split_profiling_name(name)
    return backend, op, meta, _text(group[0]), _text(group[1]), sys.intern(name)


#: The recent distinct shapes (sizes and dtypes, in and out) as read and as kept: a ring repeats a few.
_RECENT_SHAPES: list[tuple[tuple, tuple[list, list, list, list]]] = []


def _shape(raw: tuple) -> tuple[list, list, list, list]:
    """An entry's four size and dtype values as shared lists (:func:`_shared`); the recent shapes are
    compared whole first (tuple equality, in C), so a repeated shape costs one comparison."""
    for seen, kept in _RECENT_SHAPES:
        if seen == raw:
            return kept
    kept = (_shared(raw[0]), _shared(raw[1]), _shared(raw[2]), _shared(raw[3]))
    if len(_RECENT_SHAPES) >= _RECENT_MAX:
        _RECENT_SHAPES.pop()
    _RECENT_SHAPES.insert(0, (raw, kept))
    return kept


_record_id = operator.attrgetter("record_id")

#: One object per distinct size or dtype list across every dump read: a 1,024-rank job's rings hold
#: millions of entries of a few shapes. The recent distinct values are compared first (list equality,
#: in C), the rest found by their text; both bounded (cleared past _SHARED_MAX).
_SHARED: dict[str, list] = {}
_RECENT: list[list] = []
_RECENT_MAX = 8
_SHARED_MAX = 100_000


def _shared(value: Any) -> list:
    """``value`` as lists (:func:`_list`), one object per distinct value."""
    if type(value) is list:
        for known in _RECENT:
            if known == value:
                return known
    key = repr(value)
    found = _SHARED.get(key)
    if found is None:
        if len(_SHARED) > _SHARED_MAX:
            _SHARED.clear()
        found = _SHARED[key] = _list(value)
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.pop(0)
    _RECENT.append(found)  # a miss of the recent ones: the next calls of this shape find it there
    return found


def _text(value: Any) -> str:
    return sys.intern(value) if type(value) is str else str(value)


def _list(value: Any) -> list:
    """Sizes as lists (a pickle's tuples and a JSON's lists compare alike)."""
    if isinstance(value, (list, tuple)):
        return [_list(v) if isinstance(v, (list, tuple)) else v for v in value]
    return []


def read_dumps(folder: Path) -> list[FrDump]:
    """Every dump of ``folder`` that is read (:func:`survey_dumps`), in rank order, each holding the list of
    the folder's dumps not read (DumpError at the first that cannot be read)."""
    found, not_read = survey_dumps(folder)
    try:
        with collector_paused():
            dumps = [read_dump(path, rank) for rank, path in found.items()]
    finally:
        _SHARED.clear()
        _RECENT.clear()
        _RECENT_SHAPES.clear()
        _CALLS.clear()
    for dump in dumps:
        dump.folder_not_read = not_read
    return dumps
