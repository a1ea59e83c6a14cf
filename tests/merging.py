"""The merge as most tests run it: the facade, in this process alone, with the analysis only where a
test passes one (a hook, or True), so that a test of one stage does not also run the analysis; and
the merge's one driver over a test's own instances, in a world of one (:func:`one_driver`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import commtag.merge
from commtag.merge.engine.shards import analyze
from commtag.merge.analysis.hook import MergeAnalysis
from commtag.merge.analysis.results import Analysis, MatchedCollective
from commtag.merge.engine import shards
from commtag.merge.engine.options import AnalysisHook, MergeResult
from commtag.merge.engine.routes import carrier
from commtag.merge.engine.worlds import SoloWorld
from commtag.merge.pftrace.readback import read_merged
from commtag.merge.records import CollectiveInstance, Coverage, Interner, RankSummary, TraceAnnotations


def merge(inputs: Union[Sequence[Union[Path, str]], Path, str], output: Optional[Union[Path, str]] = None, *,
          analysis: Union[bool, AnalysisHook, MergeAnalysis] = False, **options) -> MergeResult:
    """:func:`commtag.merge.merge` with ``jobs=1`` and ``analysis=False`` unless given."""
    return commtag.merge.merge(inputs, output, jobs=1, analysis=analysis, **options)


def analysed(result: MergeResult) -> Analysis:
    """The merge's analysis as ``commtag summary FILE`` makes it from the merged trace, matched
    collectives included: a result holds its instances (read back from its output), not the matched
    collectives, which stay with the merge workers that matched them."""
    instances, _, coverage = read_merged(result.output)
    return analyze(instances, coverage=coverage)


def matched(result: MergeResult) -> list[MatchedCollective]:
    """The merge's collectives matched across their ranks (see :func:`analysed`)."""
    return analysed(result).collectives


def one_driver(instances: Sequence[CollectiveInstance], analysis: Optional[MergeAnalysis] = None,
               coverage: Optional[Coverage] = None) -> shards.Outcome:
    """``instances`` (several ranks') through the merge's one driver in a world of one, as a merge
    of their ranks runs it after writing them: ``outcome.lanes`` is what its lanes writer takes
    (each lane's instances with their figures and flows), ``outcome.annotations`` its counters and
    markers (with ``analysis``). Each rank is taken in its order in ``instances``, and handed over unpacked
    as in a merge alone: the lanes writer gets (and annotates) those very records."""
    world = SoloWorld()
    held = shards.Held(carrier(world))
    for rank in sorted({inst.rank for inst in instances}):
        held.take(RankSummary(rank, "host", None, [], instances=[inst for inst in instances if inst.rank == rank]))
    shards.settle(world, held)
    covered = coverage or Coverage.unknown_windows({inst.rank for inst in instances})
    return shards.analyse(world, held, analysis, covered, Interner())


def annotations_of(instances: Sequence[CollectiveInstance], coverage: Optional[Coverage] = None) -> TraceAnnotations:
    """The counters and markers the merge's analysis writes for ``instances`` (:func:`one_driver`)."""
    found = one_driver(instances, MergeAnalysis(), coverage).annotations
    assert found is not None
    return found


def written(outcome: shards.Outcome) -> dict[tuple[int, int], CollectiveInstance]:
    """Each instance as the lanes writer gets it from ``outcome`` (:func:`one_driver`), with its figures,
    by (rank, place among its rank's instances)."""
    out = {}
    for key in list(outcome.lanes):
        places = outcome.lanes.held[key][1]
        for inst, place in zip(outcome.lanes.pop(key, ()), places):
            out[(key[0], place)] = inst
    return out
