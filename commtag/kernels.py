"""What dominates a GPU stream or a graph launch: kernels sorted into a few categories.

A replayed CUDA graph shows as one opaque ``cudaGraphLaunch`` whose kernels
share its correlation id; a stream shows thousands of kernels. Both questions
("is this launch GEMM-bound or waiting on NCCL?") need the same thing: a
category per kernel name and time summed per category. The one table of rules
is :data:`KERNEL_RULES`; change it there, nowhere else.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Mapping, Optional

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
    (COMMUNICATION,
     r"nccl|rccl|msccl|nvshmem|deep_?ep|multimem|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter"
     r"|all_?to_?all|sendrecv",
     "NCCL/RCCL device kernels and custom all-reduce kernels"),
    (MEMORY, r"^memcpy|^memset|memcpy|memset",
     "Kineto's 'Memcpy DtoD (Device -> Device)', 'Memset (Device)' and kernels named for them"),
    (ELEMENTWISE, r"^triton_(poi|red|per)_",
     "Inductor pointwise / reduction / persistent-reduction kernels (their suffix names fused ops)"),
    (ATTENTION,
     r"flash|fmha|attention|attn|sdpa|\bmha|_mha|paged_?attention|xformers|flashinfer|cutlass[FB]",
     "FlashAttention, cuDNN/TRT fMHA, xformers, paged / unified attention (and KV-cache helpers named 'flash')"),
    (GEMM,
     r"gemm|gemv|cutlass|cublas|hipblas|nvjet|xmma|wgmma|matmul|bmm|Cijk_|splitkreduce|scudnn|conv(?!ert)"
     r"|triton_tem_fused_(addmm|mm|bmm)",
     "cuBLAS(Lt)/CUTLASS/nvjet, ROCm Tensile (Cijk_) and hipBLASLt, Triton matmuls; convolutions count as "
     "GEMM (implicit GEMM)"),
    (ELEMENTWISE,
     r"elementwise|vectorized|unrolled|reduce|reduction|softmax|norm|\bbn_|_bn_|pool|catarray|copy|fill|index"
     r"|gather|scatter|transpose|nhwc|nchw|rotary|embedding|dropout|adam|sgd|foreach|multi_tensor|gelu|silu"
     r"|relu|sigmoid|tanh|topk|sort|cumsum|sum|arange|where|quant|cast|convert|triton_",
     "ATen elementwise/reduce/normalization/optimizer kernels, layout transforms, other Triton kernels"),
)

_COMPILED = tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern, _ in KERNEL_RULES)

#: Kineto categories of GPU activity this module reads.
_GPU_CATS = {"kernel": None, "gpu_memcpy": MEMORY, "gpu_memset": MEMORY}
#: Runtime calls that launch a whole graph (their correlation is the replay's).
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch"})


@lru_cache(maxsize=65536)
def categorize(name: str) -> str:
    """The category of one kernel name (see :data:`KERNEL_RULES`)."""
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return OTHER


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


@dataclass(slots=True)
class Breakdown:
    """GPU time per category on one stream or in one graph launch."""

    time_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, kernel: Kernel) -> None:
        self.time_us[kernel.category] += kernel.dur_us
        self.count[kernel.category] += 1

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
        return {
            "dominant": category,
            "dominant_share": round(share, 4),
            "total_us": round(self.total_us, 3),
            "time_us": {c: round(self.time_us[c], 3) for c in CATEGORIES if c in self.time_us},
            "count": {c: self.count[c] for c in CATEGORIES if c in self.count},
        }


def kernels_from_events(events: Iterable[Mapping[str, object]], rank: int) -> list[Kernel]:
    """GPU activities of one rank's Kineto events, each tied to its graph launch when it has one."""
    launches: set[int] = set()
    gpu: list[Mapping[str, object]] = []
    for event in events:
        cat = event.get("cat")
        if cat in _GPU_CATS and event.get("ph") == "X":
            gpu.append(event)
        elif cat in ("cuda_runtime", "cuda_driver") and event.get("name") in GRAPH_LAUNCHES:
            correlation = _arg(event, "correlation")
            if correlation is not None:
                launches.add(correlation)
    out = []
    for event in gpu:
        name = str(event.get("name", ""))
        fixed = _GPU_CATS[str(event["cat"])]
        correlation = _arg(event, "correlation")
        out.append(Kernel(
            rank=rank,
            name=name,
            stream=_arg(event, "stream") or 0,
            ts_us=float(event.get("ts", 0.0)),  # type: ignore[arg-type]
            dur_us=float(event.get("dur", 0.0)),  # type: ignore[arg-type]
            category=fixed or categorize(name),
            graph_launch=correlation if correlation in launches else None,
        ))
    return out


def _arg(event: Mapping[str, object], key: str) -> Optional[int]:
    args = event.get("args")
    value = args.get(key) if isinstance(args, Mapping) else None
    return value if isinstance(value, int) else None


def by_stream(kernels: Iterable[Kernel]) -> dict[tuple[int, int], Breakdown]:
    """(rank, stream) -> breakdown."""
    out: dict[tuple[int, int], Breakdown] = defaultdict(Breakdown)
    for kernel in kernels:
        out[(kernel.rank, kernel.stream)].add(kernel)
    return dict(out)


def by_graph_launch(kernels: Iterable[Kernel]) -> dict[tuple[int, int], Breakdown]:
    """(rank, launch correlation id) -> breakdown of the kernels that graph replay ran."""
    out: dict[tuple[int, int], Breakdown] = defaultdict(Breakdown)
    for kernel in kernels:
        if kernel.graph_launch is not None:
            out[(kernel.rank, kernel.graph_launch)].add(kernel)
    return dict(out)


def top_kernels(kernels: Iterable[Kernel], n: int = 5) -> list[tuple[str, str, float]]:
    """The n kernel names with the most GPU time: (name, category, time us)."""
    time: dict[str, float] = defaultdict(float)
    for kernel in kernels:
        time[kernel.name] += kernel.dur_us
    ranked = sorted(time.items(), key=lambda kv: -kv[1])[:n]
    return [(name, categorize(name), round(t, 3)) for name, t in ranked]
