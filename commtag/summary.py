"""What ``commtag summary`` reads: a trace directory or a merged .pftrace.

A directory goes through the merge's collection stage (load, attach, align;
no Perfetto file is written), and its traces' GPU activity through the
kernel-category table. A merged .pftrace is read back
(:mod:`commtag.merge.readback`): the lane slices carry every key the analysis
needs, so the one file a user shares is enough. Either way the same
:func:`commtag.merge.analyze.analyze` runs, so the numbers match the trace's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from commtag.kernels import Breakdown, by_graph_launch, by_stream, kernels_from_events
from commtag.merge.analyze import DEFAULT_STRAGGLER_MIN_SKEW_US, Analysis, analyze

#: Kernel breakdown scopes: "stream" and "graph launch" -> (rank, id) -> breakdown.
KernelTables = dict[str, dict[tuple[int, int], Breakdown]]


class SummaryInputError(Exception):
    """The input cannot be summarized; the message names the file and the problem."""


def load(path: Path, *, straggler_min_skew_us: float = DEFAULT_STRAGGLER_MIN_SKEW_US,
         rank_pattern: Optional[str] = None) -> tuple[Analysis, Optional[KernelTables]]:
    """The analysis of ``path`` and, for a directory, its kernel categories."""
    path = Path(path)
    if path.is_dir():
        instances, ranks, kernels = _from_directory(path, rank_pattern)
    elif path.is_file():
        instances, ranks, kernels = _from_pftrace(path), None, None
    else:
        raise SummaryInputError(f"{path}: no such file or directory")
    return analyze(instances, loaded_ranks=ranks, straggler_min_skew_us=straggler_min_skew_us), kernels


def _from_pftrace(path: Path):
    from commtag.merge.readback import ReadbackError, read_instances

    try:
        instances = read_instances(path)
    except ReadbackError as exc:
        raise SummaryInputError(str(exc)) from exc
    except OSError as exc:
        raise SummaryInputError(f"{path}: {exc.strerror or exc}") from exc
    if not instances:
        raise SummaryInputError(f"{path}: no collective lane slices (is it a trace written by `commtag merge`?)")
    return instances


def _from_directory(path: Path, rank_pattern: Optional[str]):
    from commtag.merge.load import MergeInputError, load_trace
    from commtag.merge.pipeline import collect

    try:
        ranks, instances = collect([path], rank_pattern=rank_pattern)
        kernels = [
            kernel
            for rank_input in ranks
            for trace_file in rank_input.files
            for kernel in kernels_from_events(load_trace(trace_file.path).get("traceEvents", []), rank_input.rank)
        ]
    except MergeInputError as exc:
        raise SummaryInputError(str(exc)) from exc
    tables: KernelTables = {"stream": by_stream(kernels), "graph launch": by_graph_launch(kernels)}
    return instances, {r.rank for r in ranks}, tables
