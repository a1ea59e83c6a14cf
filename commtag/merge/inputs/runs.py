"""Do the merged files come from one run? What each file says of itself, compared.

Discovery already refuses what the first bytes prove (sidecars of another run
id, another world size), and the conversion a sidecar whose calls lie outside
its trace. What is left can only be suspected once every rank is read, so it
is a warning (``--strict`` refuses it):

* files far apart in time: every file of every rank is placed in time, and
  files more than :data:`RUN_GAP_NS` from the largest group of files (by
  ranks) are named: a file of another run, or a clock days off. A later file
  of a rank that also has files in that group, with the same sidecar run id,
  is a later profile of the same run and is not named;
* a trace whose ``host_name`` differs from its sidecar's ``host``, and files of
  one rank written on different hosts (one rank of one run is one process);
* files of one rank that cannot come from one process: sidecars of another
  pid, or traces of other devices (``deviceProperties``); a trace id is no
  sign, each profiled window has its own;
* two ranks claiming copies of one profile (the same ``trace_id`` and the
  same time span);
* ranks that list one process group (its name, in one life of the world) with other
  members: its calls match only among the ranks that agree, so a rank that disagrees is named.
"""

from __future__ import annotations

from typing import Sequence

from commtag.merge.inputs.clock import wall_clock
from commtag.merge.records import FileSpan, RankSummary

#: Files further apart than this (a day) are not one profiled window of one run.
RUN_GAP_NS = 86_400 * 10**9


def warnings(files: list[FileSpan]) -> list[tuple[str, str]]:
    """``(path, problem)`` for each file the checks above suspect, in the order of the checks."""
    return [*_far_apart(files), *_hosts(files), *_processes(files), *_copies(files),
            *((f.path, f.formats) for f in files if f.formats)]


def suspects(summaries: Sequence[RankSummary]) -> list[tuple[str, str]]:
    """:func:`warnings` of every file of ``summaries``: what the merge and ``commtag summary DIR`` warn of."""
    return [*warnings([f for s in summaries for f in s.files]), *_members(summaries)]


def _members(summaries: Sequence[RankSummary]) -> list[tuple[str, str]]:
    """A file of each rank whose members of a group (by name and life: its uid less the members'
    digest) are not those most ranks list, with what each side lists."""
    listed: dict[tuple[str, str], dict[tuple[int, ...], list[int]]] = {}
    files = {s.rank: s.files[0].path for s in summaries if s.files}
    for s in summaries:
        for group in s.groups:
            if group.ranks and ":" in group.pg_uid:
                name, _, digest = group.pg_uid.rpartition(":")
                by_ranks = listed.setdefault((name, digest.partition("~")[2]), {})
                if s.rank not in by_ranks.setdefault(tuple(group.ranks), []):
                    by_ranks[tuple(group.ranks)].append(s.rank)
    found = []
    for (name, life), by_ranks in listed.items():
        if len(by_ranks) < 2:
            continue
        common = max(by_ranks, key=lambda ranks: (len(by_ranks[ranks]), -min(by_ranks[ranks])))
        for ranks, who in by_ranks.items():
            if ranks != common and min(who) in files:
                found.append((files[min(who)], f"rank {min(who)} lists process group {name!r}"
                              + (f" (life {life})" if life else "") + f" with members {list(ranks)}, ranks "
                              f"{', '.join(map(str, sorted(by_ranks[common])))} with {list(common)}: its calls match "
                              "only among ranks that agree"))
    return found


def _far_apart(files: list[FileSpan]) -> list[tuple[str, str]]:
    # (first, last, file) of the files with timed events (a file has both ends or neither).
    timed = sorted(((f.first_ns, f.last_ns, f) for f in files if f.first_ns is not None and f.last_ns is not None),
                   key=lambda t: t[0])
    groups: list[list[tuple[int, int, FileSpan]]] = []
    for t in timed:
        if groups and t[0] - max(last for _, last, _ in groups[-1]) <= RUN_GAP_NS:
            groups[-1].append(t)
        else:
            groups.append([t])
    if len(groups) < 2:
        return []
    main = max(groups, key=lambda g: (len({f.rank for _, _, f in g}), len(g)))  # the earliest on a tie
    start, end = min(first for first, _, _ in main), max(last for _, last, _ in main)
    run_of_rank = {(f.rank, f.run_id) for _, _, f in main if f.run_id}
    out = []
    for first, last, f in timed:
        if any(f is g for _, _, g in main) or (f.rank, f.run_id) in run_of_rank:
            continue
        days = max(first - end, start - last) / 86_400e9
        out.append((f.path, f"rank {f.rank}: its events lie {days:.1f} days from those of the other files "
                            f"({wall_clock(start)} to {wall_clock(end)}): a file of another run, or a clock "
                            "days off?"))
    return out


def _hosts(files: list[FileSpan]) -> list[tuple[str, str]]:
    out = []
    first_host: dict[int, FileSpan] = {}
    for f in files:
        if f.host and f.sidecar_host and f.host != f.sidecar_host:
            out.append((f.path, f"its host_name {f.host!r} differs from host {f.sidecar_host!r} of its sidecar: "
                                "a trace and sidecar of different machines"))
        host = f.sidecar_host or f.host
        if not host:
            continue
        seen = first_host.setdefault(f.rank, f)
        if (seen.sidecar_host or seen.host) != host:
            out.append((f.path, f"rank {f.rank} ran on {seen.sidecar_host or seen.host!r} in {seen.path} but on "
                                f"{host!r} here: one rank of one run is one process, on one host"))
    return out


def _processes(files: list[FileSpan]) -> list[tuple[str, str]]:
    out = []
    first_pid: dict[int, FileSpan] = {}
    first_devices: dict[int, FileSpan] = {}
    for f in files:
        seen = first_pid.setdefault(f.rank, f) if f.pid is not None else None
        if seen is not None and seen.pid != f.pid:
            out.append((f.path, f"rank {f.rank} was process {seen.pid} in {seen.path} but process {f.pid} here: "
                                "files of one rank that cannot come from one process (another run?)"))
        seen = first_devices.setdefault(f.rank, f) if f.devices else None
        if seen is not None and seen.devices != f.devices:
            out.append((f.path, f"rank {f.rank} ran on {seen.devices} in {seen.path} but on {f.devices} here: "
                                "files of one rank that cannot come from one process (another run?)"))
    return out


def _copies(files: list[FileSpan]) -> list[tuple[str, str]]:
    out = []
    seen: dict[tuple, FileSpan] = {}
    for f in files:
        if not f.trace_id or f.first_ns is None:
            continue
        other = seen.setdefault((f.trace_id, f.first_ns, f.last_ns), f)
        if other is not f and other.rank != f.rank:
            out.append((f.path, f"rank {f.rank}'s trace is a copy of {other.path} (rank {other.rank}): the same "
                                f"trace_id {f.trace_id!r} and time span"))
    return out
