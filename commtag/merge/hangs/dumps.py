"""Flight Recorder dumps read: torch's pickle (through a restricted unpickler) and JSON forms, and commtag's.

A dump is found by its name, as torch names it (``<prefix><rank>``: no extension, the rank last), and
by its first byte (a pickle's protocol mark, or ``{``). A pickle is read by :class:`PlainUnpickler`,
which builds plain containers, strings and numbers and refuses every class: a dump that needs one
is refused in one line, never run.
"""

from __future__ import annotations

import functools
import gc
import io
import os
import pickle
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import orjson

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


def find_dumps(folder: Path) -> dict[int, Path]:
    """The FR dumps directly in ``folder``, by rank; a rank's two dumps (torch's and commtag's, or pickle
    and JSON) keep commtag's, then the pickle: what commtag wrote says more than what torch did."""
    found: dict[int, tuple[tuple[int, str], Path]] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise DumpError(folder, f"cannot list: {exc.strerror or exc}") from None
    for name in names:
        match = DUMP_NAME.match(name)
        path = folder / name
        if match is None or not path.is_file():
            continue
        head = _head(path)
        if head is None:
            continue
        rank = int(match["rank"])
        preference = (0 if head[1] else 1, name)
        if rank not in found or preference < found[rank][0]:
            found[rank] = (preference, path)
    return {rank: path for rank, (_, path) in sorted(found.items())}


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
    if start[0] == _JSON_MARK and (b'"entries"' in start or b'"version"' in start or b'"pg_config"' in start):
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
    if not isinstance(doc, dict) or fr.FR_ENTRIES not in doc or not isinstance(doc.get(fr.FR_ENTRIES), list):
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
    for raw in doc[fr.FR_ENTRIES]:
        entry = _entry(raw, dump.members)
        if isinstance(entry, str):
            dump.left_out[entry] = dump.left_out.get(entry, 0) + 1
        else:
            dump.entries.append(entry)
    dump.entries.sort(key=lambda e: e.record_id)
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


def _entry(raw: Any, members: dict[str, tuple[int, ...]]) -> FrEntry | str:
    """An entry, or why it is left out (read on every entry of every ring: kept to plain lookups)."""
    if type(raw) is not dict:
        return "an entry that is not a mapping"
    get = raw.get
    group, name, seq = get(fr.E_PROCESS_GROUP), get(fr.E_PROFILING_NAME), get(fr.E_SEQ)
    if (type(group) not in (list, tuple) or len(group) != 2 or type(name) is not str or type(seq) is not int):
        return "an entry without a process_group, profiling_name or collective_seq_id as torch writes them"
    backend, op, meta = _split_name(name)
    state = _text(get(fr.E_STATE, ""))
    is_p2p = op in fr.FR_P2P_OPS or get(fr.E_IS_P2P) is True
    peer = _int(get(fr.CT_PEER))
    if peer is None and is_p2p:
        group_peer = fr.p2p_peer(op, meta)
        ranks = members.get(str(group[0]))
        if group_peer is not None and ranks and 0 <= group_peer < len(ranks):
            peer = ranks[group_peer]
    completed_ns = _int(get(fr.E_COMPLETED_NS)) or None
    extra = get(fr.CT_END_NS) is not None or get(fr.CT_IN_SPLITS) is not None or get(fr.CT_REPLAY) is not None
    error = get(fr.CT_ERROR)
    return FrEntry(
        _text(group[0]), _text(group[1]), seq, _int(get(fr.E_P2P_SEQ)) or 0, backend, op, peer,
        _int(get(fr.CT_PAIR_SEQ)), state,
        state == fr.STATE_COMPLETED or get(fr.E_RETIRED) is True or completed_ns is not None,
        _int(get(fr.E_CREATED_NS)) or 0, (_int(get(fr.CT_END_NS)) if extra else None) or completed_ns,
        _shared(get(fr.E_INPUT_SIZES)), _shared(get(fr.E_OUTPUT_SIZES)),
        _shared(get(fr.E_INPUT_DTYPES)), _shared(get(fr.E_OUTPUT_DTYPES)),
        is_p2p, _int(get(fr.E_RECORD_ID)) or 0, _int(get(fr.E_PG_ID)),
        (_list(get(fr.CT_IN_SPLITS)) or None) if extra else None,
        (_list(get(fr.CT_OUT_SPLITS)) or None) if extra else None,
        _int(get(fr.CT_REPLAY)) if extra else None, _text(name), error if type(error) is str else None,
    )


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


@functools.lru_cache(maxsize=4096)
def _split_name(name: str) -> tuple[str, str, Optional[str]]:
    return fr.split_profiling_name(name)


def _list(value: Any) -> list:
    """Sizes as lists (a pickle's tuples and a JSON's lists compare alike)."""
    if isinstance(value, (list, tuple)):
        return [_list(v) if isinstance(v, (list, tuple)) else v for v in value]
    return []


def read_dumps(folder: Path) -> list[FrDump]:
    """Every dump in ``folder``, in rank order (DumpError at the first that cannot be read). The
    collector is paused meanwhile: millions of new dicts and lists, none in a cycle, would set it off
    again and again (torch's analyzer pauses it too)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return [read_dump(path, rank) for rank, path in find_dumps(folder).items()]
    finally:
        _SHARED.clear()
        _RECENT.clear()
        if paused:
            gc.enable()
