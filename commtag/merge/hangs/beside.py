"""Flight Recorder dumps beside a profile, drawn on the merged trace.

A rank's dump is looked for in the folder of its trace files, named as torch names it
(:func:`commtag.merge.hangs.dumps.find_dumps`). Each profiled collective of the rank whose entry the
dump holds (the join's key: group name, Seq, a replay's capture Seq and index; and the same op:
:mod:`commtag.merge.hangs.join`) gets the entry's state as args on its lane slice, and where the dump
holds it in flight, the mark the dumps-only drawing uses.
Each rank missing from a hang that the folder's dumps show gets a marker on its row, at the time the
first rank entered the call: the dumps' times are each host's wall clock, as the profile's are, and
the marker is shifted as the rank's profile is (``--align``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

from commtag.merge.hangs.diagnose import Diagnosis, Hang, diagnose, entry_seq, position_of
from commtag.merge.hangs.dumps import FrDump, FrEntry, find_dumps, read_dumps
from commtag.merge.hangs.join import entry_key, instance_key, same_call
from commtag.merge.rank.rows import Encoder
from commtag.merge.records import CollectiveInstance
from commtag.merge.timeline import Row, RankTimeline, Track
from commtag.vocab import ANN_FR_DUMP, ANN_FR_END, ANN_FR_ERROR, ANN_FR_OUTCOME, ANN_FR_STATE, ANN_MARKER
from commtag.vocab import flight_recorder as fr

#: The row of a rank's process that holds its hang markers (a group of its own).
FR_ROW = "Flight Recorder"
#: The marker's kind (:data:`commtag.vocab.ANN_MARKER`) and the arg naming the ranks that wait.
HANG_MARKER = "hang"
WAITING_RANKS = "waiting ranks"

#: The last folder read: its dumps' files and times as read, the dumps by rank and their diagnosis. A
#: merge worker reads a folder once, not once per rank; a file changed since is read again.
_READ: dict[Path, tuple[tuple, dict[int, FrDump], Diagnosis]] = {}
#: Per folder: its names as last listed, and the dumps found among them then.
_FOUND: dict[Path, tuple[Optional[tuple[int, int, int]], dict[int, Path]]] = {}


def draw_beside(instances: Sequence[CollectiveInstance], rank: int, trace_files: Iterable[Path],
                timeline: RankTimeline, encoder: Optional[Encoder], offset_ns: int) -> list[str]:
    """Put the dumps' state on ``rank``'s joined instances, and its hang markers on ``timeline`` (encoded
    by ``encoder``, the rank's sequence; None where its timeline is not written); what was not drawn, as notes."""
    for folder in sorted({Path(path).parent for path in trace_files}):
        found = folder_dumps(folder)
        if found is None or rank not in found[0]:
            continue
        dumps, diagnosis = found
        _put_state(instances, group_calls(dumps[rank]), dumps[rank].path.name)
        return _mark_hangs(rank, list(dumps.values()), diagnosis, timeline, encoder, offset_ns)
    return []


def folder_dumps(folder: Path) -> Optional[tuple[dict[int, FrDump], Diagnosis]]:
    """The dumps in ``folder`` by rank and their diagnosis, or None where it holds none
    (commtag.merge.hangs.DumpError: one that cannot be read)."""
    paths = _found(folder)
    if not paths:
        return None
    stamp = tuple((rank, path.name, *_stat(path)) for rank, path in paths.items())
    known = _READ.get(folder)
    if known is None or known[0] != stamp:
        dumps = read_dumps(folder)
        _READ.clear()  # one folder's dumps held at a time: a merge's are in one folder
        known = _READ[folder] = (stamp, {d.rank: d for d in dumps}, diagnose(dumps))
    return known[1], known[2]


def _found(folder: Path) -> dict[int, Path]:
    """:func:`find_dumps`, looked for again only when the folder changed (each rank of a merge asks;
    listing a folder of a thousand ranks' files for each rank cost more than the rank's rows)."""
    try:
        status = os.stat(folder)
        stamp = (status.st_ino, status.st_mtime_ns, status.st_size)
    except OSError:
        stamp = None
    known = _FOUND.get(folder)
    if known is None or stamp is None or known[0] != stamp:
        if len(_FOUND) >= 64:
            _FOUND.clear()
        known = _FOUND[folder] = (stamp, find_dumps(folder))
    return known[1]


def _stat(path: Path) -> tuple[int, int]:
    try:
        status = os.stat(path)
    except OSError:
        return (-1, -1)
    return status.st_mtime_ns, status.st_size


def group_calls(dump: FrDump) -> dict[tuple[str, int, Optional[int]], FrEntry]:
    """A dump's collective entries by their join key (:func:`commtag.merge.hangs.join.entry_key`);
    send/recv are numbered otherwise, so they do not join."""
    return {entry_key(e): e for e in dump.entries if not e.is_p2p}


def fr_args(entry: FrEntry, dump_name: str) -> dict[str, object]:
    """What a dump says of a profiled call, as its slice's args."""
    args: dict[str, object] = {ANN_FR_STATE: entry.state, ANN_FR_OUTCOME: position_of(entry).outcome,
                               ANN_FR_DUMP: dump_name}
    if not entry.ended:
        args[ANN_FR_END] = fr.FR_IN_FLIGHT
    if entry.error:
        args[ANN_FR_ERROR] = entry.error
    return args


def _put_state(instances: Sequence[CollectiveInstance], calls: dict[tuple[str, int, Optional[int]], FrEntry],
               dump_name: str) -> None:
    """An entry whose op differs from the profiled call's is not drawn (the summary and the merge name it)."""
    for inst in instances:
        if inst.is_p2p:
            continue
        entry = calls.get(instance_key(inst))
        if entry is not None and same_call(entry, inst):
            inst.args.update(fr_args(entry, dump_name))


def hang_time(dumps: Sequence[FrDump], hang: Hang) -> Optional[int]:
    """When the first rank that entered the hung call entered it (its dump's time), None where no ring holds it."""
    return min((e.created_ns for d in dumps if d.rank in hang.entered for e in d.by_group.get(hang.pg, ())
                if entry_seq(e) == hang.seq and e.is_p2p == hang.is_p2p and e.created_ns), default=None)


def hang_marker(hang: Hang) -> tuple[str, dict[str, str]]:
    """The name and args of the marker on the row of a rank missing from ``hang``."""
    return (f"hang: never entered {hang.collective} Seq {hang.seq} of group {hang.pg}",
            {ANN_MARKER: HANG_MARKER, WAITING_RANKS: ",".join(map(str, hang.entered))})


def _mark_hangs(rank: int, dumps: list[FrDump], diagnosis: Diagnosis, timeline: RankTimeline,
                encoder: Optional[Encoder], offset_ns: int) -> list[str]:
    hangs = [h for h in diagnosis.hangs if rank in h.missing]
    if not hangs:
        return []
    if encoder is None:
        return [f"{len(hangs)} Flight Recorder hang markers not drawn: the rank's timeline is not written (--detail)"]
    row = Row()
    notes = []
    for hang in hangs:
        when = hang_time(dumps, hang)
        if when is None:
            notes.append(f"a Flight Recorder hang marker not drawn: no ring holds {hang.collective} Seq {hang.seq} "
                         f"of group {hang.pg}, so its time is unknown")
            continue
        name, args = hang_marker(hang)
        row.add(when + offset_ns, when + offset_ns, encoder.body(name, "commtag", args))
    if len(row):
        timeline.tracks.append(Track(FR_ROW, FR_ROW, 0, instants=row))
    return notes
