"""What dominates a GPU stream, a graph launch or a process-group lane: kernels sorted into a few categories.

A replayed CUDA graph shows as one opaque ``cudaGraphLaunch`` whose kernels
share its correlation id; a stream shows thousands of kernels. Both questions
("is this launch GEMM-bound or waiting on NCCL?") need the same thing: a
category per kernel name and time summed per category. The one table of rules
is :data:`KERNEL_RULES`; change it there, nowhere else.

Three scopes, each per rank:

stream
    every kernel, memcpy and memset on one GPU stream (HTA's per-stream view;
    in the merged trace, one GPU stream row).
graph launch
    the kernels one ``cudaGraphLaunch``/``hipGraphLaunch`` replayed (same
    correlation id), TraceLens' question of a graph launch.
lane
    a process-group lane's device work: the kernels the merge attributed to
    the lane's collectives (eager NCCL kernels: communication) and, for a
    collective replayed inside a CUDA graph, every kernel of the graph launches
    that ran it, since the lane's collectives cost what those launches cost. A
    lane of gloo/CPU collectives has no device work and no breakdown.

The merge computes all three in its one pass over the events
(:class:`DeviceWork`) and writes them into the trace as debug annotations
(:meth:`Breakdown.annotations`), from which ``commtag summary`` reads them
back (:meth:`Breakdown.from_annotations`). The tests hold a plain
per-event version of the same sums to check it against.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, Optional

from commtag.vocab import (
    ANN_DOMINANT, ANN_KERNELS, ANN_KERNELS_PREFIX, ANN_LANE, COMMUNICATION_KERNELS, CORRELATION_KEY,
    DEVICE_WORK_NODE_TYPES, KERNEL_NODE_TYPE, is_graph_launch, nccl_kind, nccl_symmetric,
)

GEMM = "GEMM"
ATTENTION = "attention"
COMMUNICATION = "communication"
MEMORY = "memcpy/memset"
ELEMENTWISE = "elementwise/reduction"
OTHER = "other"
CATEGORIES = (GEMM, ATTENTION, COMMUNICATION, MEMORY, ELEMENTWISE, OTHER)

#: Kernel-name rules, tried in order, first match wins (case-insensitive search).
#: The order is the point: NCCL names contain "Reduce", Inductor's fused
#: pointwise kernels carry the names of the ops they fused ("addmm", "attention")
#: though they are elementwise, xformers' attention is built with cutlass, and
#: cuBLAS' split-K reduction belongs to its GEMM.
KERNEL_RULES: tuple[tuple[str, str, str], ...] = (
    # (category, pattern, why)
    (COMMUNICATION, COMMUNICATION_KERNELS, "NCCL/RCCL device kernels and custom all-reduce kernels (commtag.vocab)"),
    (MEMORY, r"^memcpy|^memset|memcpy|memset",
     "Kineto's 'Memcpy DtoD (Device -> Device)', 'Memset (Device)' and kernels named for them"),
    (ELEMENTWISE, r"^triton_(poi|red|per)_",
     "Inductor pointwise / reduction / persistent-reduction kernels (their suffix names fused ops)"),
    (ATTENTION,
     r"flash|fmha|attention|attn|sdpa|\bmha|_mha|paged_?attention|xformers|flashinfer|cutlass[FB]"
     r"|sage_?(?:fwd|bwd)|kv_?cache",
     "FlashAttention, cuDNN/TRT fMHA, xformers, SageAttention, paged / unified attention, and the KV-cache "
     "writes that serve them"),
    (GEMM,
     r"gemm|gemv|cutlass|cublas|hipblas|nvjet|xmma|wgmma|matmul|bmm|Cijk_|splitkreduce|scudnn|conv(?!ert)"
     r"|triton_tem_fused_(addmm|mm|bmm)"
     r"|(?<![a-z])[wd]grad|winograd|fft[12]d_[rc]2[rc]|flip_filter|cask_cudnn|im2d?2?col|col2im",
     "cuBLAS(Lt)/CUTLASS/nvjet, ROCm Tensile (Cijk_) and hipBLASLt, Triton matmuls; convolutions count as "
     "GEMM: implicit GEMM, cuDNN's data/weight-gradient, Winograd and FFT engines with their offset and "
     "filter helpers, MIOpen's im2col"),
    (ELEMENTWISE,
     r"elementwise|vectorized|unrolled|reduce|reduction|softmax|norm|\bbn_|_bn_|pool|catarray|copy|fill|index"
     r"|gather|scatter|transpose|nhwc|nchw|rotary|embedding|dropout|adam|sgd|foreach|multi_tensor|gelu|silu"
     r"|relu|sigmoid|tanh|topk|sort|cumsum|sum|arange|where|quant|cast|convert|triton_"
     r"|gammabeta|moments|fusedparams|internalgradients|criterion|scan|scale|subtensorop|optensor",
     "ATen elementwise/reduce/normalization/optimizer/loss kernels, layout transforms, scans, cuDNN and MIOpen "
     "tensor scaling and arithmetic, other Triton kernels"),
)

_COMPILED = tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern, _ in KERNEL_RULES)

#: The NCCL kernel variants a lane's breakdown counts (:attr:`Breakdown.nccl_kernels`).
SYMMETRIC = "symmetric"
REGULAR = "regular"
NCCL_VARIANTS = (SYMMETRIC, REGULAR)

#: Kineto categories of device work this module reads (:data:`commtag.vocab.DEVICE_WORK_NODE_TYPES`),
#: with the category their kind fixes: copies and memsets are MEMORY, a kernel goes by its name (None).
WORK_CATEGORIES: dict[str, Optional[str]] = {
    cat: None if node == KERNEL_NODE_TYPE else MEMORY for cat, node in DEVICE_WORK_NODE_TYPES.items()
}


@lru_cache(maxsize=65536)
def categorize(name: str) -> str:
    """The category of one kernel name (see :data:`KERNEL_RULES`)."""
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return OTHER


@dataclass(slots=True)
class Breakdown:
    """GPU time per category on one stream or in one graph launch."""

    time_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: A lane's NCCL kernels by variant (:data:`NCCL_VARIANTS`): whether its group ran NCCL's
    #: symmetric-memory kernels, its regular ones, or both; outside the sums the breakdown compares.
    nccl_kernels: dict[str, int] = field(default_factory=dict, compare=False)

    def merge(self, other: "Breakdown") -> None:
        """Add another breakdown's time and counts (category by category, in its order)."""
        for category, time in other.time_us.items():
            self.time_us[category] += time
        for category, n in other.count.items():
            self.count[category] += n
        for variant, n in other.nccl_kernels.items():
            self.nccl_kernels[variant] = self.nccl_kernels.get(variant, 0) + n

    @property
    def mixes_nccl_variants(self) -> bool:
        """Whether both NCCL's symmetric-memory and its regular kernels ran here."""
        return all(self.nccl_kernels.get(variant) for variant in NCCL_VARIANTS)

    @property
    def total_us(self) -> float:
        return sum(self.time_us.values())

    @property
    def dominant(self) -> tuple[str, float]:
        """(category, share of the time) of the largest category."""
        total = self.total_us
        if total <= 0:
            return OTHER, 0.0
        category = max(self.time_us, key=lambda c: (self.time_us[c], -CATEGORIES.index(c)))
        return category, self.time_us[category] / total

    def shares(self) -> dict[str, float]:
        """Category -> share of the time, largest first."""
        total = self.total_us or 1.0
        return {c: t / total for c, t in sorted(self.time_us.items(), key=lambda kv: -kv[1])}

    def describe(self) -> str:
        """A one-line answer, e.g. 'GEMM 62% | communication 30% | other 8%'."""
        return " | ".join(f"{c} {share:.0%}" for c, share in self.shares().items())

    def to_dict(self) -> dict[str, object]:
        category, share = self.dominant
        out: dict[str, object] = {
            "dominant": category,
            "dominant_share": round(share, 4),
            "total_us": round(self.total_us, 3),
            "time_us": {c: round(self.time_us[c], 3) for c in CATEGORIES if c in self.time_us},
            "count": {c: self.count[c] for c in CATEGORIES if c in self.count},
        }
        if self.nccl_kernels.get(SYMMETRIC):
            out["nccl_kernels"] = {v: self.nccl_kernels.get(v, 0) for v in NCCL_VARIANTS}
        return out

    def annotations(self) -> dict[str, object]:
        """Debug annotations for the merged trace: the one-line answer, the dominant category,
        then per category its exact time (us) and kernel count, so the breakdown reads back whole."""
        args: dict[str, object] = {ANN_KERNELS: self.describe(), ANN_DOMINANT: self.dominant[0]}
        for c in CATEGORIES:
            if c in self.count:
                args[f"{ANN_KERNELS_PREFIX}{c} us"] = float(self.time_us[c])
                args[f"{ANN_KERNELS_PREFIX}{c} count"] = self.count[c]
        if self.nccl_kernels.get(SYMMETRIC):  # only where symmetric kernels ran: other traces keep their bytes
            for variant in NCCL_VARIANTS:
                args[f"{ANN_KERNELS_PREFIX}nccl {variant} count"] = self.nccl_kernels.get(variant, 0)
        return args

    @classmethod
    def from_annotations(cls, args: Mapping[str, object]) -> "Breakdown":
        """The breakdown :meth:`annotations` wrote (unknown keys ignored)."""
        out = cls()
        for c in CATEGORIES:
            time, n = args.get(f"{ANN_KERNELS_PREFIX}{c} us"), args.get(f"{ANN_KERNELS_PREFIX}{c} count")
            if isinstance(time, (int, float)) and isinstance(n, int):
                out.time_us[c] += time
                out.count[c] += n
        for variant in NCCL_VARIANTS:
            n = args.get(f"{ANN_KERNELS_PREFIX}nccl {variant} count")
            if isinstance(n, int) and n:
                out.nccl_kernels[variant] = n
        return out


def mixed_nccl_lanes(lanes: Mapping[tuple[int, object], Breakdown]) -> list[str]:
    """One line per lane whose group ran both NCCL's symmetric-memory and regular kernels, its
    ranks' counts summed: the two run at different speeds, so its busbw mixes two figures."""
    totals: dict[object, Breakdown] = {}
    for (_, lane), b in sorted(lanes.items(), key=lambda kv: (str(kv[0][1]), kv[0][0])):
        if b.nccl_kernels:
            totals.setdefault(lane, Breakdown()).merge(Breakdown(nccl_kernels=dict(b.nccl_kernels)))
    return [f"{lane}: {b.nccl_kernels[SYMMETRIC]} symmetric-memory and {b.nccl_kernels[REGULAR]} regular NCCL kernels"
            for lane, b in totals.items() if b.mixes_nccl_variants]


#: The scopes of a breakdown, in the report's order: what an annotated slice or instant says
#: in ``vocab.ANN_KERNELS_SCOPE``, beside its id in ``ANN_KERNELS_ID`` (stream id, launch
#: correlation id, lane name) and the rank.
STREAM_SCOPE = "stream"
LAUNCH_SCOPE = "graph launch"
LANE_SCOPE = "lane"
SCOPES = (STREAM_SCOPE, LAUNCH_SCOPE, LANE_SCOPE)


def summary_name(describe: str) -> str:
    """The name of the slice that shows a breakdown's one-line answer (:meth:`Breakdown.describe`) on its row."""
    return f"{ANN_KERNELS}: {describe}"


#: Breakdowns by scope (:data:`SCOPES`) -> (rank, id) -> breakdown
#: (the id: stream id, launch correlation id, lane name).
KernelTables = dict[str, dict[tuple[int, object], Breakdown]]


class DeviceWork:
    """One rank's breakdowns by stream, graph launch and lane, fed during the merge's one pass.

    The merge already visits every event to build its rows; it hands each GPU
    activity to :meth:`kernel` and each runtime launch to :meth:`launch`, so no
    second pass over the events is needed. Whether a kernel belongs to a graph
    launch is known only once the whole file is read (a launch may come after
    its kernels), so :meth:`end_trace` settles that per file. The figures equal
    those of a plain pass over the events (tests/kernel_reference.py), with
    the same additions in the same order.

    The kernels waiting for that are kept in four flat lists of references the
    events already hold, not a tuple each: a merge holds millions of live
    objects, and every tracked allocation brings Python's next full garbage
    collection (hundreds of ms) nearer.
    """

    __slots__ = ("streams", "launches", "lanes", "_corr", "_cat", "_dur", "_lane", "_graphs", "_lane_launches",
                 "_lane_nccl")

    def __init__(self) -> None:
        #: Stream key (the caller's, e.g. (pid, tid)) -> breakdown.
        self.streams: dict[tuple, Breakdown] = {}
        #: Graph launch correlation id -> breakdown of what it replayed.
        self.launches: dict[int, Breakdown] = {}
        #: Lane name -> breakdown (complete after :meth:`finish`).
        self.lanes: dict[str, Breakdown] = {}
        self._corr: list[object] = []
        self._cat: list[str] = []
        self._dur: list[float] = []
        self._lane: list[object] = []
        self._graphs: set[int] = set()
        self._lane_launches: dict[str, set[int]] = {}
        #: Lane name -> its NCCL kernels by variant (graph-replayed ones too).
        self._lane_nccl: dict[str, dict[str, int]] = {}

    def kernel(self, stream: tuple, name: str, cat: str, dur_us: float, args: Mapping[str, object],
               lane: object = None) -> None:
        """One GPU activity of a Kineto category in :data:`WORK_CATEGORIES`; ``lane``: its
        "commtag lane" where the annotation is not in ``args``."""
        category = WORK_CATEGORIES[cat] or categorize(name)
        b = self.streams.get(stream)
        if b is None:
            b = self.streams[stream] = Breakdown()
        b.time_us[category] += dur_us
        b.count[category] += 1
        correlation = args.get(CORRELATION_KEY)
        self._corr.append(correlation if correlation.__class__ is int else None)
        self._cat.append(category)
        self._dur.append(dur_us)
        lane = args.get(ANN_LANE) if lane is None else lane
        self._lane.append(lane)
        if lane.__class__ is str and category == COMMUNICATION and nccl_kind(name) is not None:
            variants = self._lane_nccl.setdefault(lane, {})
            variant = SYMMETRIC if nccl_symmetric(name) else REGULAR
            variants[variant] = variants.get(variant, 0) + 1

    def launch(self, name: str, correlation: object) -> None:
        """A runtime call; graph launches tie the kernels of their correlation id to them."""
        if correlation.__class__ is int and is_graph_launch(name):
            self._graphs.add(correlation)

    def end_trace(self) -> list[int]:
        """Settle the kernels of one trace file (correlation ids are per file); return the
        correlation ids of its graph launches that ran kernels."""
        graphs = self._graphs
        for correlation, category, dur_us, lane in zip(self._corr, self._cat, self._dur, self._lane):
            if correlation in graphs:
                b = self.launches.get(correlation)
                if b is None:
                    b = self.launches[correlation] = Breakdown()
                b.time_us[category] += dur_us
                b.count[category] += 1
                if lane.__class__ is str:
                    self._lane_launches.setdefault(lane, set()).add(correlation)
            elif lane.__class__ is str:
                b = self.lanes.get(lane)
                if b is None:
                    b = self.lanes[lane] = Breakdown()
                b.time_us[category] += dur_us
                b.count[category] += 1
        for pending in (self._corr, self._cat, self._dur, self._lane):
            pending.clear()
        ran = sorted(c for c in graphs if c in self.launches)
        graphs.clear()
        return ran

    def finish(self) -> None:
        """Add to each lane the graph launches that ran its kernels (after the last file)."""
        for lane, correlations in self._lane_launches.items():
            b = self.lanes.setdefault(lane, Breakdown())
            for correlation in sorted(correlations):
                b.merge(self.launches[correlation])
        self._lane_launches.clear()
        for lane, variants in self._lane_nccl.items():
            if lane in self.lanes:
                self.lanes[lane].nccl_kernels = variants
        self._lane_nccl.clear()
