"""Flight Recorder dumps read: torch's pickle (through a restricted unpickler) and JSON forms, and commtag's.

A dump is found by its name, as torch names it (``<prefix><rank>``: no extension, the rank last), and
by its first byte (a pickle's protocol mark, or ``{``). A pickle is read by :class:`PlainUnpickler`,
which builds plain containers, strings and numbers and refuses every class: a dump that needs one
is refused in one line, never run.
"""

from __future__ import annotations

import io
import os
import pickle
import re
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

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it needs a persistent object, and a dump holds only plain data")


def load_plain_pickle(data: bytes) -> Any:
    """The plain data a pickle holds (pickle.UnpicklingError: one that needs more)."""
    return PlainUnpickler(io.BytesIO(data)).load()


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
        data = path.read_bytes()
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    if data[:1] == bytes([_PICKLE_MARK]):
        try:
            doc = load_plain_pickle(data)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
                MemoryError, RecursionError, UnicodeDecodeError) as exc:
            raise DumpError(path, f"not a Flight Recorder dump commtag reads: {' '.join(str(exc).split())}") from None
    else:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise DumpError(path, f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or fr.FR_ENTRIES not in doc or not isinstance(doc.get(fr.FR_ENTRIES), list):
        raise DumpError(path, "not a Flight Recorder dump (no list of entries)")
    return _dump(path, rank, doc)


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
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _entry(raw: Any, members: dict[str, tuple[int, ...]]) -> FrEntry | str:
    """An entry, or why it is left out."""
    if not isinstance(raw, dict) or any(key not in raw for key in fr.E_REQUIRED):
        return "an entry without process_group, collective_seq_id or profiling_name"
    group = raw[fr.E_PROCESS_GROUP]
    name = raw[fr.E_PROFILING_NAME]
    seq = _int(raw[fr.E_SEQ])
    if not isinstance(group, (list, tuple)) or len(group) != 2 or not isinstance(name, str) or seq is None:
        return "an entry whose process_group, profiling_name or collective_seq_id is malformed"
    backend, op, meta = fr.split_profiling_name(name)
    state = str(raw.get(fr.E_STATE, ""))
    is_p2p = bool(raw.get(fr.E_IS_P2P, op in fr.FR_P2P_OPS)) or op in fr.FR_P2P_OPS
    peer = _int(raw.get(fr.CT_PEER))
    if peer is None and is_p2p:
        group_peer = fr.p2p_peer(op, meta)
        ranks = members.get(str(group[0]))
        if group_peer is not None and ranks and 0 <= group_peer < len(ranks):
            peer = ranks[group_peer]
    completed_ns = _int(raw.get(fr.E_COMPLETED_NS)) or None
    return FrEntry(
        group=str(group[0]), desc=str(group[1]), seq=seq, p2p_seq=_int(raw.get(fr.E_P2P_SEQ)) or 0,
        backend=backend, op=op, peer=peer, pair_seq=_int(raw.get(fr.CT_PAIR_SEQ)), state=state,
        ended=state == fr.STATE_COMPLETED or raw.get(fr.E_RETIRED) is True or completed_ns is not None,
        created_ns=_int(raw.get(fr.E_CREATED_NS)) or 0, ended_ns=_int(raw.get(fr.CT_END_NS)) or completed_ns,
        input_sizes=_list(raw.get(fr.E_INPUT_SIZES)), output_sizes=_list(raw.get(fr.E_OUTPUT_SIZES)),
        input_dtypes=_list(raw.get(fr.E_INPUT_DTYPES)), output_dtypes=_list(raw.get(fr.E_OUTPUT_DTYPES)),
        is_p2p=is_p2p, record_id=_int(raw.get(fr.E_RECORD_ID)) or 0, pg_id=_int(raw.get(fr.E_PG_ID)),
        input_splits=_list(raw.get(fr.CT_IN_SPLITS)) or None, output_splits=_list(raw.get(fr.CT_OUT_SPLITS)) or None,
        replay=_int(raw.get(fr.CT_REPLAY)), name=name,
        error=raw.get(fr.CT_ERROR) if isinstance(raw.get(fr.CT_ERROR), str) else None,
    )


def _list(value: Any) -> list:
    """Sizes as lists (a pickle's tuples and a JSON's lists compare alike)."""
    if isinstance(value, (list, tuple)):
        return [_list(v) if isinstance(v, (list, tuple)) else v for v in value]
    return []


def read_dumps(folder: Path) -> list[FrDump]:
    """Every dump in ``folder``, in rank order (DumpError at the first that cannot be read)."""
    return [read_dump(path, rank) for rank, path in find_dumps(folder).items()]
