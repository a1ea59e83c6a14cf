"""A commtag sidecar as the merge takes it: its head for discovery, in full for its rank's
conversion, read by :mod:`commtag.sidecarfile` (the reader both wings share), then held to the
bounds every file's times and world size get."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from commtag.constants import MAX_AHEAD_NS, MAX_DUR_US
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.clock import wall_clock
from commtag.sidecarfile import SidecarError, read_sidecar, read_sidecar_head

if TYPE_CHECKING:
    from commtag.schema import GraphCapture, GraphReplay, RecordedCollective, Sidecar, SidecarHead

_Model = TypeVar("_Model", bound="SidecarHead")

#: Ranks a merged trace can hold: track ids and pids are built from the rank.
MAX_RANKS = 1 << 24


def check_world_size(path: Path, what: str, size: int) -> None:
    """A file's world size ``size`` (named ``what`` in the message) is refused above MAX_RANKS:
    the analysis lists every absent rank up to it, so such a claim is not a job but a bad file."""
    if size > MAX_RANKS:
        raise MergeInputError(path, f"{what} {size} is more ranks than a merged trace can hold ({MAX_RANKS:,})")


def load_sidecar(path: Path, base_ns: int = 0) -> Sidecar:
    """Parse and validate a commtag sidecar (what the conversion of its rank reads); ``base_ns``:
    its trace's baseTimeNanoseconds (0 when unknown), before which none of its times may lie."""
    sidecar = _validated(path, read_sidecar)
    check_world_size(path, "world_size", sidecar.world_size)
    _check_times(path, sidecar, base_ns)
    _check_once(path, sidecar)
    return sidecar


def _check_once(path: Path, sidecar: Sidecar) -> None:
    """A record present twice (the same call, times and thread) is one call written twice, not two.
    Records are grouped by their times and threads first, and annotations compared only within a
    group: hashing every field of every annotation cost more than the rest of the check."""
    calls = sidecar.collectives
    at: dict[tuple, list[int]] = {}
    for i, c in enumerate(calls):
        same = at.setdefault((c.start_ns, c.end_ns, c.tid, c.done_tid), [])
        first = next((j for j in same if calls[j].annotation == c.annotation), None)
        if first is not None:
            raise MergeInputError(path, f"invalid sidecar: collectives.{i} repeats collectives.{first} "
                                        "(one call recorded twice)")
        same.append(i)


def _check_times(path: Path, sidecar: Sidecar, base_ns: int) -> None:
    """A sidecar's times get the bounds a trace's have: none lasting over a day, none ending a
    day after this machine's clock, and what ran while the trace was profiled (calls, replays)
    not before its base time (where Kineto's ts 0 lies). A graph's capture may precede it."""
    now = time.time_ns()
    if base_ns > now + MAX_AHEAD_NS:
        base_ns = 0  # the trace's own clock is absurd: its conversion says so, naming the trace
    timed: list[tuple[str, RecordedCollective | GraphCapture | GraphReplay, bool]] = [
        (f"collectives.{i}", c, True) for i, c in enumerate(sidecar.collectives)]
    for i, capture in enumerate(sidecar.captures):
        timed += [(f"captures.{i}", capture, False),
                  *((f"captures.{i}.replays.{j}", r, True) for j, r in enumerate(capture.replays))]
    for where, item, profiled in timed:
        if profiled and item.start_ns < base_ns:
            problem = (f"start_ns {item.start_ns} ({wall_clock(item.start_ns)}) is before its trace's "
                       f"baseTimeNanoseconds {base_ns} ({wall_clock(base_ns)})")
        elif item.end_ns - item.start_ns > MAX_DUR_US * 1000:
            problem = f"lasts {(item.end_ns - item.start_ns) / 86_400e9:.1f} days, more than the 1 day a call may take"
        elif item.end_ns > now + MAX_AHEAD_NS:
            problem = (f"end_ns {item.end_ns} ({wall_clock(item.end_ns)}) is "
                       f"{(item.end_ns - now) / 86_400e9:.0f} days after this machine's clock")
        else:
            continue
        raise MergeInputError(path, f"invalid sidecar: {where}: {problem}")


def load_sidecar_head(path: Path) -> SidecarHead:
    """Only a sidecar's run, rank and trace (what discovery reads of every sidecar).

    So each sidecar is validated in full once, when its rank is converted: a
    full validation costs about ten times a head's. Keeping every validated
    sidecar from discovery instead grew with the rank count (a sidecar is
    about six times its JSON as objects: 180 MB for 128 ranks).
    """
    head = _validated(path, read_sidecar_head)
    check_world_size(path, "world_size", head.world_size)
    return head


def _validated(path: Path, read: Callable[[Path], _Model]) -> _Model:
    """The one sidecar reader's result, its refusal as the merge's own input error (same words)."""
    try:
        return read(path)
    except SidecarError as exc:
        raise MergeInputError(path, exc.problem) from None
