"""The offline wing: load rank traces and sidecars, attach, analyze, write Perfetto.

:func:`merge` is the library call behind ``commtag merge``::

    from commtag.merge import merge

    result = merge("traces/")          # writes traces/merged.pftrace
    print(result.output, len(result.instances))

The stages themselves are in :mod:`commtag.merge.engine.pipeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

from commtag.merge.errors import MergeFailed, MergeInputError
from commtag.merge.engine.options import DEFAULT_MAX_OUTPUT, MergeOptions, MergeResult

if TYPE_CHECKING:  # the rest of the engine loads on the first merge, not with the package
    from commtag.merge.engine.options import AnalysisHook
    from commtag.merge.inputs.selection import Selection

__all__ = ["DEFAULT_MAX_OUTPUT", "MergeFailed", "MergeInputError", "MergeOptions", "MergeResult", "Selection", "merge"]


def __getattr__(name: str) -> object:
    """``Selection`` on first use: its module loads orjson and the
    inputs' readers, which ``import commtag.merge`` alone does not need."""
    if name == "Selection":
        from commtag.merge.inputs.selection import Selection

        return Selection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def merge(
    inputs: Union[Sequence[Union[Path, str]], Path, str],
    output: Optional[Union[Path, str]] = None,
    *,
    align: str = "none",
    json_dir: Optional[Union[Path, str]] = None,
    rank_pattern: Optional[str] = None,
    rank: Optional[int] = None,
    skip_bad_ranks: bool = False,
    strict: bool = False,
    list_left_out: bool = False,
    progress: Optional[bool] = None,
    analysis: Union[bool, AnalysisHook] = True,
    selection: Optional[Selection] = None,
    max_output: Optional[int] = DEFAULT_MAX_OUTPUT,
    jobs: Optional[int] = None,
    nccl_inspector: Optional[Union[Path, str]] = None,
) -> MergeResult:
    """Merge every rank's trace (and sidecar) into one Perfetto file, as ``commtag merge`` does.

    The ranks are shared between merge workers on this host (``jobs``), or,
    run under ``torchrun --nproc-per-node=N``, between torchrun's processes;
    this call starts and ends them, and the trace is the same either way.

    Args:
        inputs: Directories (searched at any depth) and/or trace files.
        output: The ``.pftrace`` to write; default ``<first dir>/merged.pftrace``.
            It appears by an atomic rename: a failed merge leaves the old one.
        align: ``"collectives"`` corrects each host's clock from matched
            collectives (two passes over the inputs); ``"none"`` keeps them.
        json_dir: Also write each rank's annotated Chrome JSON into this folder.
        rank_pattern: A regex with one group giving the rank from a file name,
            for traces that name none.
        rank: The rank of a single trace that names none.
        skip_bad_ranks: Leave out bad files and ranks and list them in the
            result's ``skipped`` instead of stopping at the first.
        strict: Refuse files that may be of another run (else ``warnings``).
        list_left_out: List every event left out in the result's accounts.
        progress: Show a progress bar; None shows one when stderr is a terminal.
        analysis: True runs the skew, busbw and desync analysis
            (:class:`commtag.merge.analysis.hook.MergeAnalysis`) and writes its
            figures, counters and markers into the trace; False writes the
            trace alone; a callable is used as the hook (see
            :data:`commtag.merge.engine.options.AnalysisHook`).
        selection: The profiler steps or time window kept, and the ranks whose
            whole timelines are written (:class:`commtag.merge.inputs.selection.Selection`,
            what ``--steps``, ``--window`` and ``--detail`` build; default: everything).
        max_output: The bytes the trace may take: a merge whose estimated size
            (:mod:`commtag.merge.engine.budget`) is above it stops before writing,
            saying which ``--detail`` or ``--steps`` would fit; None: no limit.
        jobs: Merge worker processes on this host (``-j``): None takes the CPUs
            this process may use, fewer for small inputs
            (:func:`commtag.merge.engine.jobs.default_jobs`); 1 merges in this
            process alone. Ignored under torchrun. A custom ``analysis`` hook
            cannot be sent to other processes: with one, this process merges alone.
        nccl_inspector: A folder of NCCL Inspector dumps (``<host>-pid<pid>.log``): each record
            joins its instance, whose lane slice then carries NCCL's own figures beside commtag's
            (:mod:`commtag.merge.inputs.inspector`); records that join nothing are counted in notices.

    Returns:
        A :class:`commtag.merge.engine.options.MergeResult`: the output, the ranks
        merged, every collective instance, what was skipped, notices,
        warnings and per-rank event accounts, and with ``analysis=True`` the
        :class:`commtag.merge.analysis.results.Analysis` (``result.analysis``). With
        several workers (``jobs``, torchrun) each keeps its share: worker 0's result
        (``result.lead``) counts the slices (``result.slices``) and holds the findings,
        busbw and impact, not the instances nor the matched collectives.

    Raises:
        MergeFailed: Bad input or an output that cannot be written, nothing
            written; under torchrun every worker raises every worker's errors.
    """
    from commtag.merge.engine import pipeline
    from commtag.merge.engine.jobs import LocalWorld, launched, request_to_wire
    from commtag.merge.engine.worlds import World, under_launcher
    from commtag.merge.analysis.hook import MergeAnalysis
    from commtag.merge.engine.options import DEFAULT_OUTPUT, default_output

    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    options = MergeOptions(align=align, json_dir=Path(json_dir) if json_dir is not None else None,
                           rank_pattern=rank_pattern, rank=rank, progress=progress,
                           skip_bad_ranks=skip_bad_ranks, list_left_out=list_left_out, strict=strict,
                           selection=selection, max_output=max_output,
                           nccl_inspector=Path(nccl_inspector) if nccl_inspector is not None else None)
    if options.nccl_inspector is not None:  # bad dumps stop the merge before any worker starts
        from commtag.merge.errors import MergeFailed, MergeInputError
        from commtag.merge.inputs.inspector import read_inspector

        try:
            read_inspector(options.nccl_inspector)
        except MergeInputError as exc:
            raise MergeFailed([exc]) from None
    hook = MergeAnalysis() if analysis is True else analysis or None
    where = Path(output) if output else default_output(paths) if paths else Path(DEFAULT_OUTPUT)

    local = None
    if jobs != 1 and isinstance(analysis, bool) and not under_launcher():
        local = LocalWorld(jobs, where, request_to_wire(paths, where, options, analysis))

    def run(world: Optional[World]) -> MergeResult:
        result = pipeline.merge(paths, output, options, analysis=hook, world=world)
        if isinstance(hook, MergeAnalysis) and result.lead:
            result.analysis = hook.result
        return result

    return launched(where, run, local)
