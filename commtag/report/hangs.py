"""``commtag summary`` of Flight Recorder dumps: the stuck ranks first, then each hang, the groups'
progress and the desyncs, grouped by what the ranks share so a 1,024-rank job reads in a screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import orjson

from commtag.merge.analysis.results import Analysis
from commtag.merge.records import CollectiveInstance
from commtag.merge.hangs import Diagnosis, FrDump, diagnose, find_dumps, read_dumps
from commtag.merge.hangs.join import FrJoin, join_fr
from commtag.merge.hangs.diagnose import Hang, Position, call_name, describe_ranks, entry_seq, plural_ranks, position_of
from commtag.report.tables import REPORT_VERSION, to_json

#: Hangs and desyncs listed in the text report; the JSON has them all.
MAX_LINES = 20


def load_hangs(path: Path) -> Optional[Diagnosis]:
    """The diagnosis of the Flight Recorder dumps in ``path`` (a folder), or None where it holds none
    (commtag.merge.hangs.DumpError: a dump that cannot be read)."""
    path = Path(path)
    if not path.is_dir() or not find_dumps(path):
        return None
    return diagnose(read_dumps(path))


def join_profile(path: Path, analysis: Analysis) -> FrJoin:
    """The dumps in ``path`` joined to the profiled instances of ``analysis`` by (rank, group, Seq)."""
    instances = [i for c in analysis.collectives for i in c.members.values()]
    return join_fr(read_dumps(Path(path)), instances)


def beside_profile(dumps: list[FrDump], instances: Sequence[CollectiveInstance]) -> list[str]:
    """What `commtag merge` of a profile with its dumps says of them: the dumps' hangs and desyncs, then
    how their entries joined the profiled calls (the merge's instances, read back from its output)."""
    diagnosis = diagnose(dumps)
    join = join_fr(dumps, instances)
    unprofiled = sorted({r for h in diagnosis.hangs for r in h.missing} - {i.rank for i in instances})
    return [*(h.message for h in diagnosis.hangs), *(m.message for m in diagnosis.mismatches), join.describe(),
            *(f"not joined: {d}" for d in join.disagreements),
            *([f"no hang marker drawn for {plural_ranks(unprofiled)}: the merge has no profiled call of theirs"]
              if unprofiled else [])]


def only_dumps(exc: Exception) -> bool:
    """Whether the summary's error is only that no profiler trace was found (the dumps then stand alone)."""
    from commtag.merge.inputs.load import NoTraceFound

    return isinstance(exc.__cause__, NoTraceFound)


def summary_json(analysis: Optional[Analysis], kernels: Optional[dict], diagnosis: Optional[Diagnosis],
                 join: Optional[FrJoin] = None) -> bytes:
    """The JSON summary: the profiles' (where there are any) with the dumps' keys and findings added, and
    ``fr_join`` where the dumps were joined to the profile."""
    doc: dict[str, Any] = orjson.loads(to_json(analysis, kernels)) if analysis is not None else {
        "kind": "commtag-summary", "version": REPORT_VERSION, "findings": []}
    if diagnosis is not None:
        doc.update(hangs_json(diagnosis))
        doc["findings"] = [*hang_findings(diagnosis), *doc["findings"]]
    if join is not None:
        doc["fr_join"] = join.to_dict()
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def hang_findings(diagnosis: Diagnosis) -> list[dict[str, object]]:
    """The hangs and desyncs as the summary's findings."""
    return ([{"kind": "hang", "pg_uid": h.pg, "seq": h.seq, "ranks": h.missing, "desync": True,
              "message": h.message} for h in diagnosis.hangs]
            + [{"kind": f"fr_{m.kind}_mismatch", "pg_uid": m.pg, "seq": m.seq, "ranks": m.ranks, "desync": True,
                "message": m.message} for m in diagnosis.mismatches])


def hangs_json(diagnosis: Diagnosis) -> dict[str, object]:
    """The keys a JSON summary gains from the dumps."""
    return {
        "flight_recorder_ranks": diagnosis.ranks,
        "hangs": [h.to_dict() for h in diagnosis.hangs],
        "stuck_ranks": diagnosis.stuck(),
        "fr_groups": [g.to_dict() for g in diagnosis.groups],
        "fr_desyncs": [m.to_dict() for m in diagnosis.mismatches],
        "fr_notices": diagnosis.notices,
        "fr_not_read": [n.to_dict() for n in diagnosis.not_read],
    }


def hangs_text(diagnosis: Diagnosis, join: Optional[FrJoin] = None) -> str:
    """The dumps' report for a terminal: one answer first (who is stuck, in what), then the detail, and
    how the dumps joined the profile where there is one."""
    lines = [f"Flight Recorder dumps of {len(diagnosis.ranks)} ranks ({describe_ranks(diagnosis.ranks)}): "
             f"{_many(len(diagnosis.hangs), 'hang')}, {_many(len(diagnosis.mismatches), 'desync')}"]
    for rank in diagnosis.stuck():
        lines.append(_stuck_line(diagnosis, rank))
    for hang in diagnosis.hangs[:MAX_LINES]:
        lines.append(hang.message)
        lines.extend(f"  {line}" for line in _positions(hang.last))
    if len(diagnosis.hangs) > MAX_LINES:
        lines.append(f"... {len(diagnosis.hangs) - MAX_LINES} more hangs (--format json lists them all)")
    for mismatch in diagnosis.mismatches[:MAX_LINES]:
        lines.append(mismatch.message)
    if len(diagnosis.mismatches) > MAX_LINES:
        lines.append(f"... {len(diagnosis.mismatches) - MAX_LINES} more desyncs (--format json lists them all)")
    lines.append("groups (last Seq entered / ended, ranks):")
    for group in diagnosis.groups[:MAX_LINES]:
        label = f"{group.pg} ({group.desc})" if group.desc and group.desc != "undefined" else group.pg
        places: dict[tuple[int, int], list[int]] = {}
        for rank, seq in group.entered.items():
            places.setdefault((seq, group.ended.get(rank, 0)), []).append(rank)
        where = "; ".join(f"{e}/{c}: {describe_ranks(r)}" for (e, c), r in sorted(places.items()))
        unknown = f"; unknown: {describe_ranks(group.unknown)}" if group.unknown else ""
        lines.append(f"  {label}, {len(group.members)} members ({group.members_from}): {where}{unknown}")
    if len(diagnosis.groups) > MAX_LINES:
        lines.append(f"  ... {len(diagnosis.groups) - MAX_LINES} more groups (--format json lists them all)")
    if join is not None:
        lines.append(join.describe())
        lines.extend(f"  not joined: {d}" for d in join.disagreements[:MAX_LINES])
    lines.extend(f"notice: {n}" for n in diagnosis.notices)
    return "\n".join(lines) + "\n"


def _never_entered(hang: Hang) -> str:
    """A call a stuck rank never entered: a replay by its index and capture Seq (its Seq is its place)."""
    if hang.replay is not None:
        return f"{hang.call} of group {hang.pg}"
    if hang.is_p2p:
        return f"its side of {hang.collective} p2p Seq {hang.seq} of group {hang.pg}"
    return f"{hang.collective} Seq {hang.seq} of group {hang.pg}"


def _stuck_line(diagnosis: Diagnosis, rank: int) -> str:
    """A rank others wait on: the calls it never entered, who waits, and its last call."""
    blocked = [h for h in diagnosis.hangs if rank in h.missing]
    waiting = sorted({r for h in blocked for r in h.entered})
    calls = ", ".join(_never_entered(h) for h in blocked[:3])
    more = f" and {len(blocked) - 3} more" if len(blocked) > 3 else ""
    latest = diagnosis.latest.get(rank)
    where = ("no call in its ring" if latest is None else
             f"its last call: {call_name(latest)}{'' if latest.replay is not None else f' Seq {entry_seq(latest)}'} "
             f"of group {latest.group}, "
             f"{position_of(latest).outcome}")
    verb = "waits" if len(waiting) == 1 else "wait"
    return (f"stuck: rank {rank} never entered {calls}{more}, which {_brief(waiting)} {verb} in; "
            f"{where}")


#: Rank ranges a line lists before it says how many more there are.
MAX_RANGES = 12


def _brief(ranks: list[int]) -> str:
    """Ranks as ranges, the first MAX_RANGES of them and a count of the rest (--format json lists all)."""
    parts = describe_ranks(ranks).split(",")
    if len(parts) <= MAX_RANGES:
        return plural_ranks(ranks)
    return f"{len(ranks)} ranks ({','.join(parts[:MAX_RANGES])},...)"


def _positions(last: dict[int, Position]) -> list[str]:
    """Each member's last call, ranks at the same place on one line."""
    places: dict[tuple[int, str, str, str], list[int]] = {}
    for rank, position in last.items():
        places.setdefault((position.seq, position.collective, position.state, position.outcome), []).append(rank)
    return [f"{_brief(ranks)}: last Seq {seq} {name} ({state or 'no state'}"
            + (")" if state == outcome else f", {outcome})")
            for (seq, name, state, outcome), ranks in sorted(places.items())]


def _many(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"
