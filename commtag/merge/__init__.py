"""The offline wing: load rank traces and sidecars, attach, analyze, write Perfetto.

:func:`merge` is the library call behind ``commtag merge``::

    from commtag.merge import merge

    result = merge("traces/")          # writes traces/merged.pftrace
    print(result.output, len(result.instances))

The stages themselves are in :mod:`commtag.merge.engine.pipeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from commtag.merge.errors import MergeFailed, MergeInputError
from commtag.merge.engine.options import DEFAULT_MAX_OUTPUT, MergeOptions, MergeResult

if TYPE_CHECKING:  # the rest of the engine loads on the first merge, not with the package
    from commtag.merge.analysis.hook import MergeAnalysis
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
    analysis: Union[bool, AnalysisHook, MergeAnalysis] = True,
    jobs: Optional[int] = None,
    **options: Any,
) -> MergeResult:
    """Merge every rank's trace (and sidecar) into one Perfetto file, as ``commtag merge`` does.

    The ranks are shared between merge workers on this host (``jobs``), or,
    run under ``torchrun --nproc-per-node=N``, between torchrun's processes;
    this call starts and ends them, and the trace is the same either way.

    Args:
        inputs: Directories (searched at any depth) and/or trace files.
        output: The ``.pftrace`` to write; default ``<first dir>/merged.pftrace``.
            It appears by an atomic rename: a failed merge leaves the old one.
        analysis: True runs the skew, busbw and desync analysis
            (:class:`commtag.merge.analysis.hook.MergeAnalysis`) and writes its
            figures, counters and markers into the trace; False writes the
            trace alone; a callable is used as the hook (see
            :data:`commtag.merge.engine.options.AnalysisHook`).
        jobs: Merge worker processes on this host (``-j``): None takes the CPUs
            this process may use, fewer for small inputs
            (:func:`commtag.merge.engine.jobs.default_jobs`); 1 merges in this
            process alone. Ignored under torchrun. A custom ``analysis`` hook
            cannot be sent to other processes: with one, this process merges alone.
        options: The fields of :class:`MergeOptions` (``align``, ``json_dir``,
            ``rank_pattern``, ``selection``, ``max_output``, ...), each described there.

    Returns:
        A :class:`commtag.merge.engine.options.MergeResult`, the same whatever the
        workers on worker 0 (``result.lead``): the output, the ranks merged, the
        slices written, what was skipped, notices, warnings and per-rank event
        accounts, every collective instance with its figures (``result.instances``,
        read back from the output when first asked for), and with ``analysis=True``
        the :class:`commtag.merge.analysis.results.Analysis` (``result.analysis``:
        findings, busbw, impact and all-to-all traffic; the matched collectives
        stay with the workers that matched them, :func:`commtag.merge.engine.shards.analyze`
        over ``result.instances`` matches them again).

    Raises:
        MergeFailed: Bad input or an output that cannot be written, nothing
            written; under torchrun every worker raises every worker's errors.
        TypeError: A keyword that is no option.
    """
    from commtag.merge.engine.jobs import LocalWorld, launched, request_to_wire
    from commtag.merge.engine.worlds import World, under_launcher
    from commtag.merge.engine.options import DEFAULT_OUTPUT, default_output

    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    chosen = MergeOptions(**options)
    if chosen.nccl_inspector is not None:  # bad dumps stop the merge before any worker starts
        from commtag.merge.inputs.inspector import read_inspector

        try:
            read_inspector(chosen.nccl_inspector)
        except MergeInputError as exc:
            raise MergeFailed([exc]) from None
    where = Path(output) if output else default_output(paths) if paths else Path(DEFAULT_OUTPUT)

    local = None
    if jobs != 1 and isinstance(analysis, bool) and not under_launcher():
        # Started before this process loads the engine: their own start and imports overlap its.
        local = LocalWorld(jobs, where, request_to_wire(paths, where, chosen, analysis))
    from commtag.merge.engine import pipeline
    from commtag.merge.analysis.hook import MergeAnalysis

    hook = MergeAnalysis() if analysis is True else analysis or None

    def run(world: Optional[World]) -> MergeResult:
        result = pipeline.merge(paths, output, chosen, analysis=hook, world=world)
        if isinstance(hook, MergeAnalysis) and result.lead:
            result.analysis = hook.result
        return result

    return launched(where, run, local)
