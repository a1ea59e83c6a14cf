"""The merged trace in segments of consecutive ranks: the same bytes whoever writes them.

Why: a merge worker writes its ranks on a packet sequence of its own, which interns names and
args afresh, and its lanes block after them; so where workers' chunks began showed in the file,
and ``-j 2`` wrote other bytes than ``-j 1``. Now the ranks are cut into at most
:data:`SEGMENTS` segments (balanced by input size) that depend on the job alone. Each
segment's ranks are one sequence (named after its first rank) and its lanes another; a worker
takes whole consecutive segments (:func:`share`); the file is the header, every segment's
ranks, then every segment's lanes, in rank order (:func:`commtag.merge.engine.pipeline.merge`
publishes the workers' rank parts, then their lanes parts). Ranks of a segment share their
interning, as ranks mostly repeat each other's names and args.

On hosts of their own (:mod:`commtag.merge.engine.hosts`) each node merges the ranks it holds,
which need not be whole segments: there each worker writes one sequence, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, TypeVar

if TYPE_CHECKING:
    from commtag.merge.inputs.load import RankInput

#: At most this many segments: enough for as many workers on one host, few enough that their
#: sequences' interned names and args add little to the file.
SEGMENTS = 64

_Item = TypeVar("_Item")


def _balanced(items: Sequence[_Item], weights: Sequence[int], parts: int) -> list[list[_Item]]:
    """``items`` in at most ``parts`` consecutive runs of about equal weight, none empty."""
    total = sum(weights) or 1
    out: list[list[_Item]] = [[] for _ in range(parts)]
    done = 0
    for item, weight in zip(items, weights):
        out[min(parts - 1, done * parts // total)].append(item)
        done += weight
    return [run for run in out if run]


def segments(ranks: Sequence[RankInput]) -> list[list[RankInput]]:
    """The job's segments, in rank order."""
    if not ranks:
        return []
    return _balanced(ranks, [max(1, r.size) for r in ranks], min(len(ranks), SEGMENTS))


def share(ranks: Sequence[RankInput], workers: int, index: int) -> list[RankInput]:
    """Worker ``index``'s ranks: its run of whole segments (worker 0's never empty)."""
    cut = segments(ranks)
    runs = _balanced(cut, [sum(max(1, r.size) for r in seg) for seg in cut], workers) if cut else []
    return [r for seg in runs[index] for r in seg] if index < len(runs) else []


def firsts(ranks: Sequence[RankInput]) -> dict[int, int]:
    """Rank -> the first rank of its segment (which names the segment's sequences)."""
    return {r.rank: seg[0].rank for seg in segments(ranks) for r in seg}
