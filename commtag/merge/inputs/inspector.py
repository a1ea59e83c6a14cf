"""NCCL Inspector dumps (``--nccl-inspector DIR``): read, and each record joined to its instance.

A record is one NCCL operation on one communicator as one rank saw it (:mod:`commtag.vocab.inspector`).
Its communicator is a process group: torch names it ``"<group_desc>:<group_name>"``; its rank in the
communicator is the group's member at that index. ``coll_sn`` counts NCCL operations, not c10d
calls (nccl2 may issue several per call, a graph replay issues its own) and is counted per NCCL
function, so a record is never joined by Seq, nor ordered by ``coll_sn``: per communicator and
rank, the records in the order NCCL completed them (the order of the dump's lines) meet the
instances NCCL ran (not p2p, timed by a kernel or a graph replay) in start order, where op and
size agree (:func:`_join_in_order` says each step). Where no record was dumped before the last
profiled instance ended (a dump at teardown) their order cannot be placed against the profiled
window: they join only where they match the instances one to one.
What joins nothing is counted.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import orjson

from commtag.merge.analysis.analyze import message_bytes
from commtag.merge.errors import MergeInputError
from commtag.merge.records import CollectiveInstance
from commtag.vocab import (
    ANN_NCCL_ALGBW, ANN_NCCL_BUSBW, ANN_NCCL_EXEC_US, ANN_NCCL_SN, ANN_NCCL_SOURCE, COLL_ALGBW, COLL_BUSBW,
    COLL_BYTES, COLL_EXEC_US, COLL_NAME, COLL_SN, COLL_SOURCE, COLLECTIVES, HEADER_COMM_NAME, HEADER_N_RANKS,
    HEADER_RANK, INSPECTOR_COLL_PERF, INSPECTOR_FILE, INSPECTOR_HEADER, INSPECTOR_METADATA, INSPECTOR_P2P_PERF,
    INSPECTOR_VERSIONS, META_DUMP_US, META_HOSTNAME, META_PID, META_VERSION, PER_RANK_SIZE, PG_DESC_KEY, PG_NAME_KEY,
)

#: Instance sources NCCL's own operations time (its kernels, eager or replayed).
_NCCL_TIMED = frozenset({"nccl-kernel", "graph-replay"})


@dataclass(frozen=True, slots=True)
class InspectorRecord:
    """One ``coll_perf`` record, with its communicator's header and its dump's time."""

    comm_name: str
    comm_rank: int
    n_ranks: int
    #: The host and process that wrote it.
    host: str
    pid: int
    #: When its line was dumped (ns since the epoch).
    dump_ns: int
    coll: str
    sn: int
    nbytes: int
    exec_us: float
    source: str
    algbw_gbps: float
    busbw_gbps: float

    @property
    def collective_bytes(self) -> int:
        """The size as nccl-tests' S (commtag's bytes): a per-rank size times the ranks."""
        return self.nbytes * self.n_ranks if self.coll in PER_RANK_SIZE else self.nbytes


#: Records by (communicator name, rank in it), each list in the order NCCL completed them.
Dumps = dict[tuple[str, int], list[InspectorRecord]]


@functools.lru_cache(maxsize=4)
def read_inspector(folder: Path) -> Dumps:
    """Every collective record of the dumps in ``folder``, by communicator and rank; MergeInputError
    (naming the file and the line) on anything else than NCCL Inspector's format. Cached: each
    merge worker and the summary read it once, whatever the ranks."""
    if not folder.is_dir():
        raise MergeInputError(folder, "--nccl-inspector needs a folder of NCCL Inspector dumps")
    paths = sorted(p for p in folder.iterdir() if INSPECTOR_FILE.match(p.name) and p.is_file())
    if not paths:
        raise MergeInputError(folder, "no NCCL Inspector dump (<hostname>-pid<pid>.log) in it")
    out: Dumps = {}
    for path in paths:
        for rec in _read_file(path):
            out.setdefault((rec.comm_name, rec.comm_rank), []).append(rec)
    for recs in out.values():  # each file's lines in order; a second process's after, by when it dumped
        recs.sort(key=lambda r: r.dump_ns)
    return out


def _read_file(path: Path) -> list[InspectorRecord]:
    out = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise MergeInputError(path, exc.strerror or str(exc)) from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise MergeInputError(path, f"line {number} is not JSON (not an NCCL Inspector dump?)") from None
        if not isinstance(doc, dict):
            raise MergeInputError(path, f"line {number} is not a JSON object")
        if INSPECTOR_P2P_PERF in doc and INSPECTOR_COLL_PERF not in doc:
            continue  # a point-to-point operation's line: no collective to join
        try:
            out.append(_record(doc))
        except (KeyError, TypeError, ValueError) as exc:
            raise MergeInputError(path, f"line {number}: {_problem(exc)}") from None
    return out


def _problem(exc: Exception) -> str:
    return f"missing {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)


def _record(doc: dict) -> InspectorRecord:
    header, metadata, perf = doc[INSPECTOR_HEADER], doc[INSPECTOR_METADATA], doc[INSPECTOR_COLL_PERF]
    if not all(isinstance(part, dict) for part in (header, metadata, perf)):
        raise ValueError(f"{INSPECTOR_HEADER}, {INSPECTOR_METADATA} and {INSPECTOR_COLL_PERF} are not all objects")
    version = metadata[META_VERSION]
    if version not in INSPECTOR_VERSIONS:
        raise ValueError(f"format {version!r}, not one of {', '.join(sorted(INSPECTOR_VERSIONS))}")
    return InspectorRecord(
        comm_name=str(header.get(HEADER_COMM_NAME, "unknown")), comm_rank=_int(header[HEADER_RANK], HEADER_RANK),
        n_ranks=_int(header[HEADER_N_RANKS], HEADER_N_RANKS), host=str(metadata[META_HOSTNAME]),
        pid=_int(metadata[META_PID], META_PID),
        dump_ns=_int(metadata[META_DUMP_US], META_DUMP_US) * 1000,
        coll=str(perf[COLL_NAME]), sn=_int(perf[COLL_SN], COLL_SN), nbytes=_int(perf[COLL_BYTES], COLL_BYTES),
        exec_us=_number(perf[COLL_EXEC_US], COLL_EXEC_US), source=str(perf[COLL_SOURCE]),
        algbw_gbps=_number(perf[COLL_ALGBW], COLL_ALGBW), busbw_gbps=_number(perf[COLL_BUSBW], COLL_BUSBW))


def _int(value: object, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a count")
    return value


def _number(value: object, key: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a number")
    return float(value)


def comm_name(inst: CollectiveInstance) -> str:
    """The communicator name torch gives an instance's process group: ``"<group_desc>:<group_name>"``."""
    return f"{inst.arg(PG_DESC_KEY, '')}:{inst.arg(PG_NAME_KEY, '')}"


def join(instances: Sequence[CollectiveInstance], rank: int, dumps: Dumps,
         process: Optional[tuple[str, int]] = None) -> list[str]:
    """Put each record of ``rank`` on its instance (its own args, :data:`commtag.vocab.ANN_NCCL_BUSBW`
    ...); what could not be joined, as notes. ``process``: the rank's (host, pid), where its
    sidecar says them: its process's records of communicators it joined none of are counted too."""
    mine: dict[str, list[CollectiveInstance]] = {}
    index: dict[str, Optional[int]] = {}
    for inst in instances:
        if inst.is_p2p or inst.source not in _NCCL_TIMED:
            continue
        name = comm_name(inst)
        if name not in index:  # a group's members are looked up once, not once per instance
            index[name] = inst.group_ranks.index(rank) if rank in inst.group_ranks else None
        if index[name] is not None:
            mine.setdefault(name, []).append(inst)
    notes = []
    for name in sorted(mine):
        recs = dumps.get((name, index[name]), [])  # type: ignore[arg-type]
        if not recs:
            continue
        insts = sorted(mine[name], key=lambda i: (i.start_ns, i.end_ns))
        joined = _join_in_order(insts, recs)
        if joined < len(recs):
            notes.append(f"NCCL Inspector: {len(recs) - joined} of {len(recs)} records of communicator {name!r} joined "
                         f"no collective ({_why(insts, recs)})")
    if process is not None:
        claimed = {(name, index[name]) for name in mine}
        others = [key for key, recs in dumps.items() if key not in claimed
                  for r in recs if (r.host, r.pid) == process]
        if others:
            notes.append(unclaimed_note(others))
    return notes


def unclaimed_note(keys: Sequence[tuple[str, int]]) -> str:
    """What is said of records (one key each) whose communicator and rank no traced NCCL collective has."""
    names = sorted({name for name, _ in keys})
    return (f"NCCL Inspector: {len(keys)} records joined no collective: no trace here shows an NCCL collective of "
            f"their communicator and rank ({', '.join(map(repr, names[:5]))}{', ...' if len(names) > 5 else ''})")


def claimed(instances: Sequence[CollectiveInstance]) -> set[tuple[str, int]]:
    """The (communicator, rank in it) of every NCCL-timed collective instance: the records :func:`join` may take."""
    out = set()
    for inst in instances:
        if not inst.is_p2p and inst.source in _NCCL_TIMED and inst.rank in inst.group_ranks:
            out.add((comm_name(inst), inst.group_ranks.index(inst.rank)))
    return out


def _key(inst: CollectiveInstance) -> Optional[tuple[str, Optional[int]]]:
    row = COLLECTIVES.get(inst.collective)
    return None if row is None else (row.nccl_kernel, message_bytes(inst))


def _placed(insts: list[CollectiveInstance], recs: list[InspectorRecord]) -> bool:
    """Whether the records' dump times place them against the instances: some was dumped before
    the last instance ended (a dump at teardown places none)."""
    return bool(insts) and any(r.dump_ns < insts[-1].end_ns for r in recs)


def _join_in_order(insts: list[CollectiveInstance], recs: list[InspectorRecord]) -> int:
    """Join one communicator's records to its instances by order (see the module docstring); how many joined.

    Walking both in order: a record dumped before the instance ended is an earlier operation's; one
    that agrees joins it; one whose op and size no instance has is an operation the traces do not
    show; an instance whose op and size no record has is one the Inspector did not record (below
    its minimum size); anything else stops the join there: what is left is counted, not guessed."""
    if not _placed(insts, recs):  # only a whole match can tell which is which
        if len(recs) != len(insts) or not all(_key(i) == (r.coll, r.collective_bytes) for i, r in zip(insts, recs)):
            return 0
        pairs = list(zip(insts, recs))
    else:
        ahead: Counter[Optional[tuple[str, Optional[int]]]] = Counter(_key(i) for i in insts)  # the keys of the instances and records not passed yet
        recorded: Counter[Optional[tuple[str, Optional[int]]]] = Counter((r.coll, r.collective_bytes) for r in recs)
        pairs, i, at = [], 0, 0
        while i < len(insts) and at < len(recs):
            inst, rec = insts[i], recs[at]
            key = (rec.coll, rec.collective_bytes)
            if rec.dump_ns < inst.end_ns or not ahead[key]:
                at += 1  # an earlier operation's, or one the traces do not show
                recorded[key] -= 1
            elif _key(inst) == key:
                pairs.append((inst, rec))
                i, at = i + 1, at + 1
                ahead[key] -= 1
                recorded[key] -= 1
            elif not recorded[_key(inst)]:
                i += 1  # the Inspector did not record it
                ahead[_key(inst)] -= 1
            else:
                break
    for inst, rec in pairs:
        inst.args.update({ANN_NCCL_BUSBW: rec.busbw_gbps, ANN_NCCL_ALGBW: rec.algbw_gbps, ANN_NCCL_EXEC_US: rec.exec_us,
                          ANN_NCCL_SOURCE: rec.source, ANN_NCCL_SN: rec.sn})
    return len(pairs)


def _why(insts: list[CollectiveInstance], recs: list[InspectorRecord]) -> str:
    if not _placed(insts, recs):
        return (f"none dumped within the profiled window, {len(recs)} records for {len(insts)} profiled instances "
                "that do not match one to one: their order cannot be placed against it")
    return "operations before or after the profiled window, ones the traces do not show, or past a point where "\
        "the order was ambiguous"
