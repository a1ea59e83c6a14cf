"""What a merge is asked to do and what it returns.

:class:`MergeOptions` is built once, by :func:`commtag.merge.merge`, and
carried whole to every stage and to every merge worker (``-j`` sends it as
JSON, :mod:`commtag.merge.engine.jobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
import sys
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence

from commtag.merge.records import CollectiveInstance, Coverage, TraceAnnotations

if TYPE_CHECKING:
    from commtag.merge.analysis.align import Alignment
    from commtag.merge.analysis.results import Analysis
    from commtag.merge.errors import MergeInputError
    from commtag.merge.account import EventAccount
    from commtag.merge.inputs.selection import Selection

#: The default ``max_output`` (bytes): below what the Perfetto UI opens (about 2 GB), with room to spare.
DEFAULT_MAX_OUTPUT = 1_500_000_000

#: A caller's own analysis: ``analysis(instances, coverage)`` (every rank's instances, rank by rank)
#: may add figures to each instance's ``args`` and return counters and markers for the trace.
#: Under torchrun every merge worker calls it, over every rank's instances; the merge's one driver
#: then numbers the flows (:func:`commtag.merge.engine.owned.run_hook`).
AnalysisHook = Callable[[list[CollectiveInstance], Coverage], Optional[TraceAnnotations]]
DEFAULT_OUTPUT = "merged.pftrace"
ALIGN_MODES = ("none", "collectives")


@dataclass(frozen=True)
class MergeOptions:
    """How to merge: the options of ``commtag merge``, each said here once; :func:`commtag.merge.merge`
    takes each as a keyword."""

    #: ``"collectives"`` corrects each host's clock from matched collectives (two passes over the
    #: inputs); ``"none"`` keeps them.
    align: str = "none"
    #: Also write each rank's annotated Chrome JSON into this folder (a str is taken as a path).
    json_dir: Optional[Path] = None
    #: A regex with one group giving the rank from a file name, for traces that name none.
    rank_pattern: Optional[str] = None
    #: The rank of a single trace that names none.
    rank: Optional[int] = None
    #: Show a progress bar; None: a progress bar when stderr is a terminal.
    progress: Optional[bool] = None
    #: Leave out bad files and ranks and list them in the result's ``skipped`` instead of stopping at the first.
    skip_bad_ranks: bool = False
    #: List every event left out in the result's accounts.
    list_left_out: bool = False
    #: Refuse files that may be of another run (else the result's ``warnings``).
    strict: bool = False
    #: The profiler steps or time window kept, and the ranks whose whole timelines are written
    #: (:class:`commtag.merge.inputs.selection.Selection`, what ``--steps``, ``--window`` and
    #: ``--detail`` build); None: everything.
    selection: Optional[Selection] = None
    #: Bytes the merged trace may take: a merge whose estimated size (:mod:`commtag.merge.engine.budget`)
    #: is above it stops before writing, saying which ``--detail`` or ``--steps`` would fit; None: any.
    max_output: Optional[int] = DEFAULT_MAX_OUTPUT
    #: A folder of NCCL Inspector dumps whose records join their instances (commtag.merge.inputs.inspector).
    nccl_inspector: Optional[Path] = None

    def __post_init__(self) -> None:
        if self.json_dir is not None and not isinstance(self.json_dir, Path):
            object.__setattr__(self, "json_dir", Path(self.json_dir))
        if self.nccl_inspector is not None and not isinstance(self.nccl_inspector, Path):
            object.__setattr__(self, "nccl_inspector", Path(self.nccl_inspector))
        if self.align not in ALIGN_MODES:
            raise ValueError(f"align must be one of {ALIGN_MODES}, got {self.align!r}")

    def to_wire(self) -> dict:
        """The options as JSON data, whole: what a ``-j`` worker is sent
        (:func:`commtag.merge.engine.jobs.options_from_wire`) and what the nodes of a merge
        compare (:func:`commtag.merge.engine.hosts.share`)."""
        sent = {f.name: getattr(self, f.name) for f in fields(self)}
        sent["json_dir"] = None if self.json_dir is None else str(self.json_dir)
        sent["nccl_inspector"] = None if self.nccl_inspector is None else str(self.nccl_inspector)
        chosen = self.selection
        sent["selection"] = None if chosen is None else {
            name: None if value is None else sorted(value) if isinstance(value, frozenset) else list(value)
            for name, value in (("steps", chosen.steps), ("window", chosen.window), ("detail", chosen.detail))}
        return sent


@dataclass(slots=True)
class MergeResult:
    """What a merge did, the same whatever the number of workers (``jobs``, torchrun) on the lead
    worker (``lead``); another worker's result is not the one to report."""

    output: Path
    ranks: list[int]
    alignment: Optional[Alignment] = None
    annotations: Optional[TraceAnnotations] = None
    #: With ``skip_bad_ranks``: the files left out, each with why (worker 0 has everyone's).
    skipped: list[MergeInputError] = field(default_factory=list)
    #: Things the user should know that did not stop the merge (a trace without sidecar).
    notices: list[str] = field(default_factory=list)
    #: Per merged rank, in rank order: events read, written, and left out by reason.
    accounts: list[EventAccount] = field(default_factory=list)
    #: Files that may not be of one run with the rest (``strict`` refuses them instead).
    warnings: list[str] = field(default_factory=list)
    #: Whether this process is the merge worker that wrote the output (always, without torchrun).
    lead: bool = True
    #: The analysis :func:`commtag.merge.merge` ran, on the lead: findings, busbw, impact and
    #: all-to-all traffic. The matched collectives are not held (workers share them out):
    #: :func:`commtag.merge.engine.shards.analyze` over :attr:`instances` matches them again.
    analysis: Optional[Analysis] = None
    #: The collective slices the merged trace holds (every rank's).
    slices: int = 0
    _read: Optional[list[CollectiveInstance]] = field(default=None, init=False, repr=False, compare=False)

    @property
    def instances(self) -> list[CollectiveInstance]:
        """Every collective lane slice of the written trace, with its figures, as records: read
        back from the output on first use (a merge's workers each hold only their share), so the
        same list whatever the workers; empty on a worker that is not the lead."""
        if self._read is None:
            from commtag.merge.pftrace.readback import read_instances  # protobuf: only a read needs it

            self._read = read_instances(self.output) if self.lead else []
        return self._read


def default_output(inputs: Sequence[Path]) -> Path:
    first = inputs[0]
    return (first if first.is_dir() else first.parent) / DEFAULT_OUTPUT


class Progress(Protocol):
    """A stage's progress as it goes (a tqdm bar, or nothing shown)."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


class Unshown:
    """Progress nobody sees: no terminal, or ``progress=False``."""

    def update(self, n: int = 1) -> object:
        return None

    def close(self) -> None:
        pass


def progress_bar(options: MergeOptions, stage: str, total: int, unit: str) -> Progress:
    """A progress bar for ``stage`` on stderr where a merge shows progress (``options.progress``,
    else whether stderr is a terminal), so that no stage of a large merge sits silent."""
    if not (sys.stderr.isatty() if options.progress is None else options.progress):
        return Unshown()
    from tqdm import tqdm  # only a visible progress bar needs it

    return tqdm(total=total, desc=stage, unit=unit)
