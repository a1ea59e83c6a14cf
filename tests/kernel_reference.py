"""The kernel breakdowns computed the plain way, one pass over a rank's events with a
record per GPU activity: the reference that commtag.kernels.DeviceWork (the merge's
single pass, which keeps no such records) must equal, sum for sum."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from commtag.kernels import WORK_CATEGORIES, Breakdown, categorize
from commtag.vocab import LAUNCH_CATEGORIES, is_graph_launch


@dataclass(slots=True)
class Kernel:
    """One GPU activity (kernel, memcpy or memset) on one rank."""

    rank: int
    name: str
    stream: int
    ts_us: float
    dur_us: float
    category: str
    #: Correlation id of the graph launch that ran it, None for an eager launch.
    graph_launch: Optional[int] = None
    #: The process-group lane the merge attributed it to ("commtag lane"), if any.
    lane: Optional[str] = None




def kernels_from_events(events: Iterable[Mapping[str, object]], rank: int) -> list[Kernel]:
    """GPU activities of one rank's Kineto events, each tied to its graph launch when it has one."""
    launches: set[int] = set()
    gpu: list[Mapping[str, object]] = []
    for event in events:
        cat = event.get("cat")
        if cat in WORK_CATEGORIES and event.get("ph") == "X":
            gpu.append(event)
        elif cat in LAUNCH_CATEGORIES and is_graph_launch(str(event.get("name"))):
            correlation = _arg(event, "correlation")
            if correlation is not None:
                launches.add(correlation)
    out = []
    for event in gpu:
        name = str(event.get("name", ""))
        fixed = WORK_CATEGORIES[str(event["cat"])]
        correlation = _arg(event, "correlation")
        out.append(Kernel(
            rank=rank,
            name=name,
            stream=_arg(event, "stream") or 0,
            ts_us=float(event.get("ts", 0.0)),  # type: ignore[arg-type]
            dur_us=float(event.get("dur", 0.0)),  # type: ignore[arg-type]
            category=fixed or categorize(name),
            graph_launch=correlation if correlation in launches else None,
            lane=_lane(event),
        ))
    return out


def _arg(event: Mapping[str, object], key: str) -> Optional[int]:
    args = event.get("args")
    value = args.get(key) if isinstance(args, Mapping) else None
    return value if isinstance(value, int) else None


def _lane(event: Mapping[str, object]) -> Optional[str]:
    args = event.get("args")
    lane = args.get("commtag lane") if isinstance(args, Mapping) else None
    return lane if isinstance(lane, str) else None


def by_stream(kernels: Iterable[Kernel]) -> dict[tuple[int, int], Breakdown]:
    """(rank, stream) -> breakdown."""
    out: dict[tuple[int, int], Breakdown] = defaultdict(Breakdown)
    for kernel in kernels:
        add_kernel(out[(kernel.rank, kernel.stream)], kernel)
    return dict(out)


def by_graph_launch(kernels: Iterable[Kernel]) -> dict[tuple[int, int], Breakdown]:
    """(rank, launch correlation id) -> breakdown of the kernels that graph replay ran."""
    out: dict[tuple[int, int], Breakdown] = defaultdict(Breakdown)
    for kernel in kernels:
        if kernel.graph_launch is not None:
            add_kernel(out[(kernel.rank, kernel.graph_launch)], kernel)
    return dict(out)


def by_lane(kernels: Iterable[Kernel]) -> dict[tuple[int, str], Breakdown]:
    """(rank, lane name) -> breakdown of the lane's device work (see the module docstring).

    The lane's eager kernels in event order, then the whole of each graph
    launch that ran one of its kernels, in correlation order.
    """
    kernels = list(kernels)
    out: dict[tuple[int, str], Breakdown] = defaultdict(Breakdown)
    replays: dict[tuple[int, str], set[int]] = defaultdict(set)
    for kernel in kernels:
        if kernel.lane is None:
            continue
        if kernel.graph_launch is None:
            add_kernel(out[(kernel.rank, kernel.lane)], kernel)
        else:
            replays[(kernel.rank, kernel.lane)].add(kernel.graph_launch)
    launches = by_graph_launch(kernels)
    for (rank, lane), correlations in replays.items():
        for correlation in sorted(correlations):
            out[(rank, lane)].merge(launches[(rank, correlation)])
    return dict(out)


def add_kernel(breakdown: Breakdown, kernel: Kernel) -> None:
    breakdown.time_us[kernel.category] += kernel.dur_us
    breakdown.count[kernel.category] += 1
