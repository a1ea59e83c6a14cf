"""What ``commtag summary`` reads: a trace directory or a merged .pftrace.

A directory goes through the merge's collection stage (each rank streamed,
attached and aligned as the merge does; no Perfetto file is written), which
also sums its GPU activity by kernel category. A merged .pftrace is read back
(:mod:`commtag.merge.pftrace.readback`): the lane slices carry every key the analysis
needs, and the graph launch slices and the instants opening each GPU stream
and lane row carry the kernel breakdowns, so the one file a user shares is
enough. Either way the merge's own analysis driver runs over the instances
(:func:`commtag.merge.engine.shards.analyze`, a world of one), so the numbers match the trace's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from commtag.errors import CommtagError
from commtag.kernels import LANE_SCOPE, LAUNCH_SCOPE, SCOPES, STREAM_SCOPE, DeviceWork, KernelTables
from commtag.merge.analysis.analyze import DEFAULT_STRAGGLER_MIN_SKEW_US
from commtag.merge.engine.shards import analyze
from commtag.merge.analysis.results import Analysis
from commtag.merge.records import Coverage


class SummaryInputError(CommtagError):
    """The input cannot be summarized; the message names the file and the problem."""


def load(path: Path, *, straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US,
         rank_pattern: Optional[str] = None, rank: Optional[int] = None, warnings: Optional[list[str]] = None,
         notices: Optional[list[str]] = None,
         nccl_inspector: Optional[Path] = None) -> tuple[Analysis, Optional[KernelTables]]:
    """The analysis of ``path`` and its kernel categories (the same scopes for both inputs);
    ``rank_pattern`` and ``rank`` tell the rank of traces that name none, as for the merge.
    ``warnings`` gets the merge's warnings of traces read (files that may not be of one run),
    ``notices`` its notices of files left out (a link to nothing), and with ``nccl_inspector`` (a
    folder of NCCL Inspector dumps, joined as the merge joins them) the records that joined nothing."""
    path = Path(path)
    if path.is_dir():
        instances, coverage, kernels = _from_traces(path, rank_pattern, rank, warnings, notices)
    elif path.is_file():
        from commtag.merge.pftrace import readback  # protobuf: only a file needs it

        try:
            kind = readback.sniff(path)[0]
        except OSError as exc:
            raise SummaryInputError(f"{path}: {exc.strerror or exc}") from exc
        if kind == readback.EMPTY:
            raise SummaryInputError(f"{path}: empty file, neither a profiler trace nor a .pftrace")
        if kind == readback.JSON:
            instances, coverage, kernels = _from_traces(path, rank_pattern, rank, warnings)
        else:
            instances, coverage, kernels = _from_pftrace(path)
    else:
        raise SummaryInputError(f"{path}: no such file or directory")
    if nccl_inspector is not None:
        _join_inspector(instances, Path(nccl_inspector), notices)
    return analyze(instances, coverage=coverage, straggler_min_skew_us=straggler_min_skew_us), kernels


def _from_pftrace(path: Path) -> tuple[list, Coverage, KernelTables]:
    """A merged trace (gzipped or not) read back; a merge of ranks without collectives has
    no lane slices, but its ranks' processes tell it from a trace commtag did not write."""
    from commtag.merge.pftrace.readback import ReadbackError, read_merged

    try:
        instances, kernels, coverage = read_merged(path)
    except ReadbackError as exc:
        raise SummaryInputError(str(exc)) from exc
    except OSError as exc:
        raise SummaryInputError(f"{path}: {exc.strerror or exc}") from exc
    if not instances and not coverage.windows:
        raise SummaryInputError(f"{path}: no rank processes or collective lane slices "
                                "(is it a trace written by `commtag merge`?)")
    return instances, coverage, _tables(kernels)


def _join_inspector(instances: list, folder: Path, notices: Optional[list[str]]) -> None:
    """Each rank's NCCL Inspector records joined to its instances, as the merge's rank pass joins them."""
    from commtag.identity import describe_ranks
    from commtag.merge.errors import MergeInputError
    from commtag.merge.inputs.inspector import claimed, join, read_inspector, unclaimed_note

    try:
        records = read_inspector(folder)
    except MergeInputError as exc:
        raise SummaryInputError(str(exc)) from exc
    said: dict[str, list[int]] = {}
    for rank in sorted({i.rank for i in instances}):
        for note in join([i for i in instances if i.rank == rank], rank, records):
            said.setdefault(note, []).append(rank)
    if notices is not None:
        notices += [f"{describe_ranks(ranks)}: {note}" for note, ranks in said.items()]
        taken = claimed(instances)
        others = [key for key, recs in records.items() if key not in taken for _ in recs]
        if others:
            notices.append(unclaimed_note(others))


def _tables(found: KernelTables) -> KernelTables:
    """The scopes in the report's order, each present even when empty (as from a directory)."""
    return {scope: found.get(scope, {}) for scope in SCOPES}


def _from_traces(path: Path, rank_pattern: Optional[str], rank: Optional[int], warnings: Optional[list[str]],
                 notices: Optional[list[str]] = None):
    from commtag.merge.errors import MergeInputError
    from commtag.merge.engine.pipeline import collect

    tables: KernelTables = {scope: {} for scope in SCOPES}

    def categorize(rank: int, work: DeviceWork) -> None:
        # The breakdowns the merge writes into the trace, keyed as read back from it.
        for key, breakdown in work.streams.items():  # key: the stream's row, (device, stream id, kind)
            tables[STREAM_SCOPE][(rank, key[1])] = breakdown
        for correlation, breakdown in work.launches.items():
            tables[LAUNCH_SCOPE][(rank, correlation)] = breakdown
        for lane, breakdown in work.lanes.items():
            tables[LANE_SCOPE][(rank, lane)] = breakdown

    try:
        coverage, instances = collect([path], rank_pattern=rank_pattern, rank=rank, on_rank=categorize,
                                      warnings=warnings, notices=notices)
    except MergeInputError as exc:
        raise SummaryInputError(str(exc)) from exc
    if notices is not None and coverage.step_numbers:
        notices.append(coverage.step_numbers)
    return instances, coverage, tables
