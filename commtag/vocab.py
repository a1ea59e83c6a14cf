"""The domain's vocabulary: what PyTorch's profiler, Kineto, NCCL/RCCL and CUDA/HIP call things, written once.

Every fact commtag relies on about names it does not choose lives here as a
table with the reason beside it, the way :data:`commtag.kernels.KERNEL_RULES`
holds the kernel categories: change a fact here and nowhere else. Both wings
read it (torch-free and pydantic-free, so ``import commtag`` stays cheap);
the sidecar format's own names and limits are in :mod:`commtag.constants`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, NamedTuple, Optional


# ---------------------------------------------------------------------------- dtypes


class Dtype(NamedTuple):
    """One torch dtype as the profiler names it."""

    #: ``torch.<attr>`` (the canonical attribute; aliases such as ``half`` are the same dtype).
    attr: str
    #: c10 ScalarType name, as ``toString(ScalarType)`` prints it into "dtype".
    scalar_type: str
    #: Bytes per element for bandwidth; None for sub-byte shells (no defined element size).
    nbytes: Optional[int]


#: Every dtype torch 2.x defines (attributes a given torch lacks are skipped by the runtime).
#: The runtime reads it to name a tensor's dtype, on the Python-wrapper path and at operator
#: level alike; the merge reads the byte sizes for bandwidth and the names to validate a sidecar.
DTYPES: tuple[Dtype, ...] = (
    Dtype("uint8", "Byte", 1), Dtype("int8", "Char", 1), Dtype("int16", "Short", 2),
    Dtype("int32", "Int", 4), Dtype("int64", "Long", 8), Dtype("float16", "Half", 2),
    Dtype("float32", "Float", 4), Dtype("float64", "Double", 8), Dtype("complex32", "ComplexHalf", 4),
    Dtype("complex64", "ComplexFloat", 8), Dtype("complex128", "ComplexDouble", 16), Dtype("bool", "Bool", 1),
    Dtype("qint8", "QInt8", 1), Dtype("quint8", "QUInt8", 1), Dtype("qint32", "QInt32", 4),
    Dtype("bfloat16", "BFloat16", 2), Dtype("quint4x2", "QUInt4x2", 1), Dtype("quint2x4", "QUInt2x4", 1),
    Dtype("bits1x8", "Bits1x8", 1), Dtype("bits2x4", "Bits2x4", 1), Dtype("bits4x2", "Bits4x2", 1),
    Dtype("bits8", "Bits8", 1), Dtype("bits16", "Bits16", 2),
    Dtype("float8_e5m2", "Float8_e5m2", 1), Dtype("float8_e4m3fn", "Float8_e4m3fn", 1),
    Dtype("float8_e5m2fnuz", "Float8_e5m2fnuz", 1), Dtype("float8_e4m3fnuz", "Float8_e4m3fnuz", 1),
    Dtype("uint16", "UInt16", 2), Dtype("uint32", "UInt32", 4), Dtype("uint64", "UInt64", 8),
    Dtype("uint1", "UInt1", None), Dtype("uint2", "UInt2", None), Dtype("uint3", "UInt3", None),
    Dtype("uint4", "UInt4", None), Dtype("uint5", "UInt5", None), Dtype("uint6", "UInt6", None),
    Dtype("uint7", "UInt7", None), Dtype("int1", "Int1", None), Dtype("int2", "Int2", None),
    Dtype("int3", "Int3", None), Dtype("int4", "Int4", None), Dtype("int5", "Int5", None),
    Dtype("int6", "Int6", None), Dtype("int7", "Int7", None),
    Dtype("float8_e8m0fnu", "Float8_e8m0fnu", 1), Dtype("float4_e2m1fn_x2", "Float4_e2m1fn_x2", 1),
)
#: The ScalarType name of a dtype the profiler does not know.
UNDEFINED_DTYPE = "Undefined"
#: ``torch.<attr>`` name -> ScalarType name.
SCALAR_TYPE_OF: dict[str, str] = {d.attr: d.scalar_type for d in DTYPES}
#: Every ScalarType name a "dtype" key may hold.
SCALAR_TYPE_NAMES = frozenset({d.scalar_type for d in DTYPES} | {UNDEFINED_DTYPE})
#: Bytes per element by ScalarType name; used for bandwidth.
SCALAR_TYPE_BYTES: dict[str, int] = {d.scalar_type: d.nbytes for d in DTYPES if d.nbytes is not None}
#: The profiler records a complex tensor as its real view (``view_as_real``): this dtype,
#: twice the elements.
RECORDED_AS_REAL: dict[str, str] = {"ComplexHalf": "Half", "ComplexFloat": "Float", "ComplexDouble": "Double"}


# ---------------------------------------------------------------------------- eager keys

# The keys ProcessGroupNCCL's ``record_param_comms`` writes for one collective, each named once
# (their values: ../shared/reference/eager-comm-metadata.md).
COLLECTIVE_NAME_KEY = "Collective name"
IN_NELEMS_KEY = "In msg nelems"
OUT_NELEMS_KEY = "Out msg nelems"
GROUP_SIZE_KEY = "Group size"
DTYPE_KEY = "dtype"
IN_SPLIT_KEY = "In split size"
OUT_SPLIT_KEY = "Out split size"
RANK_START_KEY = "Global rank start"
RANK_STRIDE_KEY = "Global rank stride"
PG_NAME_KEY = "Process Group Name"
PG_DESC_KEY = "Process Group Description"
#: The group's global ranks as a list string, ``"[0, 2, 4]"`` (read by :func:`commtag.constants.parse_rank_list`).
PG_RANKS_KEY = "Process Group Ranks"
#: The own group rank, the root's (rooted ops) or the peer's (send/recv).
RANK_KEY = "Rank"
DST_RANK_KEY = "Dst Rank"
SRC_RANK_KEY = "Src Rank"
SEQ_KEY = "Seq"
#: A hash newer profilers add after Seq (of the group name, Seq, p2p-ness and rank start/stride/size):
#: the profiler's own, which commtag does not reproduce.
COMMS_ID_KEY = "Comms Id"
#: Those keys in the profiler's order (the aliases of :class:`commtag.schema.CollectiveAnnotation`'s
#: eager fields, checked there).
EAGER_KEYS: tuple[str, ...] = (
    COLLECTIVE_NAME_KEY, IN_NELEMS_KEY, OUT_NELEMS_KEY, GROUP_SIZE_KEY, DTYPE_KEY, IN_SPLIT_KEY, OUT_SPLIT_KEY,
    RANK_START_KEY, RANK_STRIDE_KEY, PG_NAME_KEY, PG_DESC_KEY, PG_RANKS_KEY, RANK_KEY, DST_RANK_KEY, SRC_RANK_KEY,
    SEQ_KEY,
)
#: The eager keys Kineto copies from the op onto the collective's NCCL kernel, in its order.
KERNEL_EAGER_KEYS: tuple[str, ...] = (
    COLLECTIVE_NAME_KEY, IN_NELEMS_KEY, OUT_NELEMS_KEY, GROUP_SIZE_KEY, DTYPE_KEY, IN_SPLIT_KEY, OUT_SPLIT_KEY,
    PG_NAME_KEY, PG_DESC_KEY, PG_RANKS_KEY, DST_RANK_KEY, SRC_RANK_KEY, SEQ_KEY,
)
#: Eager keys only a point-to-point call carries (its peer's group rank).
P2P_PEER_KEYS: tuple[str, ...] = (DST_RANK_KEY, SRC_RANK_KEY)


# ---------------------------------------------------------------------------- torch's CUDA-graph annotations

#: torch 2.14+ public module for annotating captured graph nodes (``mark_kernels``,
#: ``get_kernel_annotations``, ``is_available``); it records by the driver's tools id, so it
#: needs cuda-bindings and a CUDA 13.1+ driver (``cudaGraphNodeGetToolsId``), else it is a no-op.
#: Torch 2.12 and 2.13 hold the same code privately (``torch.cuda._graph_annotations``).
TORCH_GRAPH_ANNOTATIONS_MODULE = "torch.cuda.graph_annotations"
#: Its registry's keys and Kineto's "graph node id" of a replayed node are one number:
#: ``(exec graph id << TOOLS_ID_GRAPH_SHIFT) | node id``.
TOOLS_ID_GRAPH_SHIFT = 32
#: CUDA driver version (cudaDriverGetVersion) from which cudaGraphNodeGetToolsId and the graph
#: id APIs work: 13.1.
TOOLS_ID_DRIVER_VERSION = 13010
#: Top-level key (before ``traceEvents``) of a trace torch 2.15+'s ``export_chrome_trace(...,
#: cuda_graph_annotations=...)`` wrote with annotations baked into graphed events' args.
TORCH_INLINE_ANNOTATED_KEY = "cudaGraphInlineAnnotated"
#: Annotation key whose value names the lane torch moves an annotated graphed event to, with
#: ``graph_lanes="all"``: the lane (a tid on the GPU's pid, from the annotation's ``"stream"``)
#: is named by it. The key is spliced into the event's args with the rest of the annotation.
TORCH_LANE_NAME_KEY = PG_DESC_KEY
#: Arg of an event torch moved onto a lane: the stream it ran on (its ``tid`` and ``args.stream``
#: then name the lane).
TORCH_ORIGINAL_STREAM_KEY = "original_stream"
#: Annotation key torch reserves for the lane (an int) an annotated node's events move to.
TORCH_LANE_KEY = "stream"


# ---------------------------------------------------------------------------- Kineto

#: The CPU op in which ProcessGroupNCCL records each call's eager keys; Kineto copies
#: part of them (:data:`KERNEL_EAGER_KEYS`) onto the call's NCCL kernel, if it was profiled.
COMMS_OP = "record_param_comms"
#: The CPU op of a c10d collective ("c10d::allreduce_"), as Kineto names it.
C10D_OP_PREFIX = "c10d::"
#: "Collective name" values of COMMS_OP that are no collective: a Work's wait, a
#: communicator's creation.
NON_COLLECTIVE_NAMES = frozenset({"wait", "init"})
#: Older torch wrote the group as this integer key instead of "Process Group Name":
#: the group's "uid" in distributedInfo's pg_config, whose "pg_name" is the name.
PG_ID_KEY = "Process Group ID"
#: Kineto's category of a GPU kernel.
KERNEL_CATEGORY = "kernel"
#: The graph node type the runtime records for a kernel node (``GraphNodeRecord.node_type``).
KERNEL_NODE_TYPE = "kernel"
#: Kineto categories of device-side events (their pid is the device).
GPU_CATEGORIES = frozenset({KERNEL_CATEGORY, "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "gpu_memory"})
#: Host-side events that launch device work (same "correlation" as the work); HIP's
#: runtime calls are filed under the same names.
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: Categories of device work a graph node can be, and the node type the runtime records
#: for it (``GraphNodeRecord.node_type``).
MEMCPY_NODE_TYPE = "memcpy"
MEMSET_NODE_TYPE = "memset"
DEVICE_WORK_NODE_TYPES: dict[str, str] = {KERNEL_CATEGORY: KERNEL_NODE_TYPE, "gpu_memcpy": MEMCPY_NODE_TYPE,
                                          "gpu_memset": MEMSET_NODE_TYPE}
#: Device work categories torch's CUDA-graph annotation pass (2.14+) reads and moves: those a
#: graph node can be (not gpu_user_annotation).
TORCH_ANNOTATED_CATEGORIES = frozenset(DEVICE_WORK_NODE_TYPES)
#: Categories of Kineto's Chrome JSON before torch 1.11 (libkineto's output_json.cpp until
#: the end of 2021) -> today's name for the same activity. ``gpu_user_Annotation`` is the
#: capital-A spelling libkineto's ActivityType table had in 2021.
KINETO_LEGACY_CATEGORIES: dict[str, str] = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "User": "gpu_user_annotation",
    "gpu_user_Annotation": "gpu_user_annotation",
}
#: How old Kineto named a GPU row in ``tid``: ``"stream 7"`` (today: ``tid`` 7 on the device's pid).
KINETO_STREAM_TID_PREFIX = "stream "
#: The name of the slice torch's profiler writes around each ``prof.step()``: ``ProfilerStep#<N>``.
PROFILER_STEP_PREFIX = "ProfilerStep#"
#: Categories of Kineto's flow events ("s"/"f") from a runtime launch to its device work: today
#: ``ac2g``, ``async`` (2020-21, named "launch") and ``async_gpu`` (late 2021). They join events
#: by the ``correlation`` both ends carry.
KINETO_LAUNCH_FLOW_CATEGORIES = frozenset({"ac2g", "async", "async_gpu"})
#: Arg joining a CPU op to the launches it made (and, for NCCL, an op to its kernel).
EXTERNAL_ID_KEY = "External id"
#: Arg joining a runtime launch to the device work it launched: both ends carry it.
CORRELATION_KEY = "correlation"
#: The shapes of an op's inputs, one list per tensor (written with ``record_shapes``).
INPUT_DIMS_KEY = "Input Dims"
#: Arg numbering a CPU op within its trace.
EV_IDX_KEY = "Ev Idx"
#: Arg giving a runtime launch's CUPTI callback id.
CBID_KEY = "cbid"
#: CUPTI's runtime callback id of cudaGraphLaunch (CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000),
#: the "cbid" Kineto writes on a graph launch.
CUDA_GRAPH_LAUNCH_CBID = 311
#: Arg giving a CPU op its record function's id.
RECORD_FUNCTION_ID_KEY = "Record function id"
#: Args that number events within one trace: the op/launch links and the Python tracer's ids
#: (a copy of a trace's events, as the scale-set generator tiles them, offsets these).
KINETO_ID_ARGS: tuple[str, ...] = (EXTERNAL_ID_KEY, CORRELATION_KEY, "Python id", "Python parent id", EV_IDX_KEY)
#: Args that only link or number events: once the merge has drawn its flows from them they say
#: nothing to a reader, so the merged slices leave them out.
LINK_ARGS = frozenset({EXTERNAL_ID_KEY, CORRELATION_KEY, CBID_KEY, EV_IDX_KEY, RECORD_FUNCTION_ID_KEY})


# ---------------------------------------------------------------------------- CUDA / HIP graphs

#: Runtime and driver calls that replay a whole graph, by the start of their name: the
#: CUDA runtime (``cudaGraphLaunch``, versioned ``cudaGraphLaunch_v10000``, per-thread
#: ``_ptsz``), the driver (``cuGraphLaunch``) and HIP (``hipGraphLaunch``). The replayed
#: kernels share the launch's correlation id. Test names with :func:`is_graph_launch`.
GRAPH_LAUNCH_PREFIXES: tuple[str, ...] = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
#: How far (ns) a graph launch may sit outside the ``CUDAGraph.replay()`` call the sidecar logged
#: around it and still be that replay: the profiler's and Python's clocks are converted
#: separately, and the trace rounds to µs, so they disagree by a few µs.
LAUNCH_TOLERANCE_NS = 20_000
#: How far (ns) the ends of a call the sidecar recorded and of its own profiler events (its
#: ``c10d::`` op, its gloo work) may disagree and still be that call: the trace rounds to µs.
#: Tighter than :data:`LAUNCH_TOLERANCE_NS`: these events lie inside the call, not around it.
SPAN_TOLERANCE_NS = 2_000
#: Args Kineto writes on device work a graph replayed (CUPTI 12.x+): the node's id (whole, or
#: only the node id on older CUPTI) and the executable graph's id.
GRAPH_NODE_ID_KEY = "graph node id"
GRAPH_ID_KEY = "graph id"
#: A "graph node id" written whole is ``(graph id << 32) | node id``; this takes the node id.
NODE_ID_MASK = 0xFFFFFFFF


def is_graph_launch(name: str) -> bool:
    """Does a runtime or driver call of this name replay a graph (see :data:`GRAPH_LAUNCH_PREFIXES`)?"""
    return name.startswith(GRAPH_LAUNCH_PREFIXES)


# ---------------------------------------------------------------------------- NCCL / RCCL kernels

#: A kernel NCCL or RCCL launched for a collective, and the collective its name gives:
#: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (NCCL 2.19+), ``ncclKernel_AllReduce_RING_LL_Sum_float``
#: (older), ``ncclDevKernel_Generic`` (NCCL and RCCL: the collective is in the args only).
#: The one recogniser: :func:`nccl_kind` and :func:`parse_nccl_kernel` read it.
NCCL_KERNEL = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
#: Kernel names that are communication for the kernel breakdown: NCCL's and RCCL's (as
#: :data:`NCCL_KERNEL` and beyond: MSCCL, NVSHMEM, DeepEP) and custom all-reduce kernels.
COMMUNICATION_KERNELS = (
    r"nccl|rccl|msccl|nvshmem|deep_?ep|multimem|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter"
    r"|all_?to_?all|sendrecv"
)
_NCCL_NEW = re.compile(
    r"^ncclDevKernel_([A-Za-z]+?)(?:_(Sum|Prod|MinMax|Max|Min|PreMulSum|SumPostDiv))?(?:_([a-z]+[0-9a-z]*))?"
    r"(?:_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE|PAT)_(LL128|LL|SIMPLE))?$")
_NCCL_OLD = re.compile(
    r"^ncclKernel_([A-Za-z]+)_(?:[A-Z_]+?)_(LL128|LL|SIMPLE)_(Sum|Prod|Max|Min|PreMulSum|SumPostDiv)_([A-Za-z0-9_]+)$")
#: NCCL's element type in a kernel name (new and old spelling) -> ScalarType name.
NCCL_KERNEL_TYPES: dict[str, str] = {
    "f32": "Float", "float": "Float", "f16": "Half", "half": "Half", "bf16": "BFloat16", "__nv_bfloat16": "BFloat16",
    "bfloat16": "BFloat16", "f64": "Double", "double": "Double", "i8": "Char", "int8_t": "Char", "u8": "Byte",
    "uint8_t": "Byte", "i32": "Int", "int32_t": "Int", "u32": "UInt32", "uint32_t": "UInt32", "i64": "Long",
    "int64_t": "Long", "u64": "UInt64", "uint64_t": "UInt64", "f8e4m3": "Float8_e4m3fn", "f8e5m2": "Float8_e5m2",
    "__nv_fp8_e4m3": "Float8_e4m3fn", "__nv_fp8_e5m2": "Float8_e5m2",
}
#: NCCL's reduction op in a kernel name -> the op's name as commtag records it.
NCCL_KERNEL_OPS: dict[str, str] = {
    "Sum": "sum", "Prod": "product", "Max": "max", "Min": "min", "PreMulSum": "premul_sum", "SumPostDiv": "sum_post_div",
}
#: NCCL kernel collectives whose names' element type is the data's (the others move bytes).
NCCL_REDUCING = frozenset({"AllReduce", "ReduceScatter", "Reduce"})
#: A user reduction op -> the NCCL kernel ops that may carry it out (avg is a premul or a
#: post-divided sum, bitwise ops run as min/max/product/sum on booleans).
NCCL_OPS_FOR: dict[str, frozenset[str]] = {
    "sum": frozenset({"sum"}), "product": frozenset({"product"}), "max": frozenset({"max"}),
    "min": frozenset({"min"}), "avg": frozenset({"premul_sum", "sum_post_div", "sum"}),
    "premul_sum": frozenset({"premul_sum"}), "band": frozenset({"min", "product"}),
    "bor": frozenset({"max", "sum"}), "bxor": frozenset({"sum"}),
}


@lru_cache(maxsize=65536)
def nccl_kind(name: str) -> Optional[str]:
    """The collective of an NCCL/RCCL kernel name ("allreduce"), None for other kernels (cached: names repeat)."""
    match = NCCL_KERNEL.search(name)
    return match.group(1).lower() if match else None


class NcclKernel(NamedTuple):
    """What an NCCL kernel name says; None = the name does not say."""

    #: NCCL's spelling ("AllReduce", "SendRecv"); "Generic" when the name does not say.
    collective: str
    op: Optional[str]
    dtype: Optional[str]


@lru_cache(maxsize=65536)
def parse_nccl_kernel(name: str) -> Optional[NcclKernel]:
    """Collective, reduction op and dtype from an NCCL/RCCL kernel name (Kineto's or a mangled
    symbol), old or new style; None if :data:`NCCL_KERNEL` does not recognise it."""
    if nccl_kind(name) is None:
        return None
    base = base_name(name)
    new = _NCCL_NEW.match(base)
    if new:
        coll, op, ty = new.group(1), new.group(2), new.group(3)
        if coll not in NCCL_REDUCING:
            return NcclKernel(coll, None, None)
        return NcclKernel(coll, NCCL_KERNEL_OPS.get(op or ""), NCCL_KERNEL_TYPES.get(ty or ""))
    old = _NCCL_OLD.match(base)
    if old:
        coll, op, ty = old.group(1), old.group(3), old.group(4)
        if coll not in NCCL_REDUCING:
            return NcclKernel(coll, None, None)
        return NcclKernel(coll, NCCL_KERNEL_OPS.get(op), NCCL_KERNEL_TYPES.get(ty))
    return NcclKernel("Generic", None, None)


def base_name(name: str) -> str:
    """A kernel's qualified name without return type, template and call arguments.

    Accepts what Kineto writes (demangled, with arguments) and what
    cuFuncGetName returns (often Itanium-mangled), so both compare equal:
    ``"void ns::k<4>(int)"`` and ``"_ZN2ns1kILi4EEEvi"`` both give ``"ns::k"``.
    """
    name = name.strip()
    if name.startswith("_Z"):
        demangled = _mangled_base(name)
        if demangled:
            return demangled
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    out, depth = [], 0
    for ch in name[:cut]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    tokens = "".join(out).split()
    return tokens[-1] if tokens else name


def _mangled_base(name: str) -> str:
    """Qualified name of an Itanium-mangled symbol (enough for kernels; "" if unparsable)."""
    i = 2
    if name.startswith("L", i):
        i += 1
    nested = name.startswith("N", i)
    if nested:
        i += 1
    parts: list[str] = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        length = int(name[i:j])
        parts.append(name[j : j + length])
        i = j + length
        if not nested:
            break
        if i < len(name) and name[i] in "EI":
            break
    return "::".join(parts)


# ---------------------------------------------------------------------------- collectives

#: Collective families, tried in order on a name with everything but letters removed
#: ("gloo:all_reduce" -> "allreduce"); the order matters ("sendrecv" before "send").
FAMILIES: tuple[str, ...] = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "barrier",
                             "gather", "scatter", "reduce", "sendrecv", "send", "recv")


#: Names whose family their letters do not say: nccl2's record of a whole batch of sends and
#: receives (nccl2-and-hooks.md §3 ``batch_op_issue``), carried out by SendRecv kernels.
NAMED_FAMILIES: dict[str, str] = {"batch_op_issue": "sendrecv"}


@lru_cache(maxsize=4096)
def family(name: str) -> str:
    """Collective family of an eager, c10d, gloo or NCCL-kernel name: "gloo:all_reduce" -> "allreduce"
    (cached: names repeat)."""
    if name in NAMED_FAMILIES:
        return NAMED_FAMILIES[name]
    flat = re.sub(r"[^a-z]", "", name.lower().split("::")[-1].split(":")[-1])
    for fam in FAMILIES:
        if fam in flat:
            return fam
    return flat


#: The eager "Collective name" of a point-to-point send and of a receive (the rows below); the
#: runtime's OpCall.p2p says which of the two a call is with these.
SEND, RECV = "send", "recv"

#: nccl-tests' bus-bandwidth factors of a group of n ranks, by name (see :class:`Collective`).
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "2(n-1)/n": lambda n: 2 * (n - 1) / n,
    "(n-1)/n": lambda n: (n - 1) / n,
    "1": lambda n: 1.0,
}


class Collective(NamedTuple):
    """What commtag knows of one eager "Collective name"."""

    name: str
    #: :func:`family` of the name (what its gloo works and NCCL kernels are called).
    family: str
    #: No member can end it before the last has joined, so its ends are one instant
    #: on every clock (clock alignment reads only these).
    synchronizing: bool
    #: The NCCL kernel collective that carries it out (a replayed kernel must say this).
    nccl_kernel: str
    #: nccl-tests' size S: "in" or "out" msg nelems; None: it moves no data (no bandwidth).
    busbw_size: Optional[str]
    #: nccl-tests' bus-bandwidth factor (a key of :data:`BUSBW_FACTORS`).
    busbw_factor: Optional[str]
    #: Whether every member's In / Out msg nelems must be equal (a difference is a desync).
    equal_in: bool
    equal_out: bool
    #: How one rank's in and out sizes relate on n ranks: "out = in x n" (gathers into
    #: all), "in = out x n" (reduce-scatters), "sum in = sum out" (all-to-all), or None.
    shape: Optional[str]
    #: "all" (every member contributes alike), "rooted" (Rank is the root) or "p2p" (Rank is the peer).
    kind: str
    #: The name the coalescing manager gives a fused block of this op (None: not fusable).
    coalesced: Optional[str] = None


def _row(name: str, fam: str, sync: bool, kernel: str, size: Optional[str], factor: Optional[str],
         equal: str, shape: Optional[str], kind: str, coalesced: Optional[str] = None) -> Collective:
    return Collective(name, fam, sync, kernel, size, factor, "i" in equal, "o" in equal, shape, kind, coalesced)


#: One row per eager "Collective name" (see :class:`Collective`). Sizes follow nccl-tests:
#: all_reduce/broadcast/reduce/send/recv use the buffer (in == out); all_gather and gather
#: the gathered total (out); reduce_scatter and scatter the total before splitting (in);
#: all_to_all a rank's whole send buffer (in). Rooted gathers and scatters and all-to-all
#: move their data as NCCL SendRecv kernels; a barrier is a one-element all-reduce.
COLLECTIVES: dict[str, Collective] = {row.name: row for row in (
    _row("allreduce", "allreduce", True, "AllReduce", "in", "2(n-1)/n", "io", None, "all", "allreduce_coalesced"),
    _row("allreduce_coalesced", "allreduce", True, "AllReduce", "in", "2(n-1)/n", "io", None, "all"),
    _row("broadcast", "broadcast", False, "Broadcast", "in", "1", "io", None, "rooted"),
    _row("reduce", "reduce", False, "Reduce", "in", "1", "io", None, "rooted"),
    _row("all_gather", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all"),
    _row("_allgather_base", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all",
         "allgather_into_tensor_coalesced"),
    _row("allgather_coalesced", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all"),
    _row("allgather_into_tensor_coalesced", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n",
         "all"),
    _row("reduce_scatter", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io", "in = out x n", "all"),
    _row("_reduce_scatter_base", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io", "in = out x n", "all",
         "reduce_scatter_tensor_coalesced"),
    _row("reduce_scatter_tensor_coalesced", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io",
         "in = out x n", "all"),
    _row("all_to_all", "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    _row("all_to_allv", "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    _row("gather", "gather", False, "SendRecv", "out", "(n-1)/n", "i", None, "rooted"),
    _row("scatter", "scatter", False, "SendRecv", "in", "(n-1)/n", "o", None, "rooted"),
    _row("barrier", "barrier", True, "AllReduce", None, None, "io", None, "all"),
    _row(SEND, "send", False, "SendRecv", "in", "1", "io", None, "p2p"),
    _row(RECV, "recv", False, "SendRecv", "out", "1", "io", None, "p2p"),
)}
#: Eager names of the all-to-all collectives, whose "In split size" lists what each peer was sent.
ALL_TO_ALL_NAMES = frozenset({"all_to_all", "all_to_allv"})
#: Families whose collectives synchronise their members (see :attr:`Collective.synchronizing`).
SYNCHRONIZING_FAMILIES = frozenset(row.family for row in COLLECTIVES.values() if row.synchronizing)
#: Eager names numbered on a group's point-to-point Seq counter.
P2P_COLLECTIVES = frozenset(row.name for row in COLLECTIVES.values() if row.kind == "p2p")
#: Families (:func:`family`) of point-to-point work: gloo's send/recv and NCCL's Send, Recv and
#: SendRecv kernels.
P2P_FAMILIES = frozenset({"sendrecv", "send", "recv"})
#: The "dtype" ProcessGroupNCCL records for a barrier (0 / 0 elements: it moves none of the caller's data).
BARRIER_DTYPE = "Byte"
#: Op -> the name of its fused block under the coalescing manager.
COALESCED_NAMES: dict[str, str] = {row.name: row.coalesced for row in COLLECTIVES.values() if row.coalesced}

#: Each torch.distributed function commtag patches -> the eager "Collective name" ProcessGroupNCCL
#: records for it (a key of :data:`COLLECTIVES`): the tensor forms record the c10d base op's name.
FUNCTION_COLLECTIVES: dict[str, str] = {
    "all_reduce": "allreduce", "all_reduce_coalesced": "allreduce_coalesced", "broadcast": "broadcast",
    "reduce": "reduce", "all_gather": "all_gather", "all_gather_single": "_allgather_base",
    "all_gather_into_tensor": "_allgather_base", "_all_gather_base": "_allgather_base",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_single": "_reduce_scatter_base",
    "reduce_scatter_tensor": "_reduce_scatter_base", "_reduce_scatter_base": "_reduce_scatter_base",
    "all_to_all_single": "all_to_allv", "all_to_all": "all_to_all", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "monitored_barrier": "barrier", "send": SEND, "recv": RECV,
}
#: Each c10d operator commtag describes while a graph is captured, as (namespace, name without
#: overload) -> the eager "Collective name" the same call made eagerly records (a key of :data:`COLLECTIVES`).
#: Functional collectives (``_c10d_functional``) record as the c10d op they lower to.
OPERATOR_COLLECTIVES: dict[tuple[str, str], str] = {
    ("c10d", "allreduce_"): "allreduce",
    ("c10d", "allreduce_coalesced_"): "allreduce_coalesced",
    ("c10d", "broadcast_"): "broadcast",
    ("c10d", "reduce_"): "reduce",
    ("c10d", "allgather_"): "all_gather",
    ("c10d", "_allgather_base_"): "_allgather_base",
    ("c10d", "allgather_into_tensor_coalesced_"): "allgather_into_tensor_coalesced",
    ("c10d", "allgather_coalesced_"): "allgather_coalesced",
    ("c10d", "reduce_scatter_"): "reduce_scatter",
    ("c10d", "_reduce_scatter_base_"): "_reduce_scatter_base",
    ("c10d", "reduce_scatter_tensor_coalesced_"): "reduce_scatter_tensor_coalesced",
    ("c10d", "alltoall_base_"): "all_to_allv",
    ("c10d", "alltoall_"): "all_to_all",
    ("c10d", "gather_"): "gather",
    ("c10d", "scatter_"): "scatter",
    ("c10d", "barrier"): "barrier",
    ("_c10d_functional", "all_reduce"): "allreduce",
    ("_c10d_functional", "all_reduce_"): "allreduce",
    ("_c10d_functional", "all_reduce_coalesced"): "allreduce_coalesced",
    ("_c10d_functional", "all_reduce_coalesced_"): "allreduce_coalesced",
    ("_c10d_functional", "all_gather_into_tensor"): "_allgather_base",
    ("_c10d_functional", "all_gather_into_tensor_out"): "_allgather_base",
    ("_c10d_functional", "all_gather_into_tensor_coalesced"): "allgather_into_tensor_coalesced",
    ("_c10d_functional", "reduce_scatter_tensor"): "_reduce_scatter_base",
    ("_c10d_functional", "reduce_scatter_tensor_out"): "_reduce_scatter_base",
    ("_c10d_functional", "reduce_scatter_tensor_coalesced"): "reduce_scatter_tensor_coalesced",
    ("_c10d_functional", "all_to_all_single"): "all_to_allv",
    ("_c10d_functional", "broadcast"): "broadcast",
    ("_c10d_functional", "broadcast_"): "broadcast",
}

#: Names torch added after 2.13 for calls already in the tables above. ``dist.gather_single``
#: (2.14+; ``gather_into_tensor`` is its alias) records as c10d's gather (nccl2-and-hooks.md §3:
#: "gather (and gather_single / gather_into_tensor) | gather"); the coalesced c10d ops record
#: under their own names (rows above).
FUNCTION_COLLECTIVES.update({"gather_single": "gather", "gather_into_tensor": "gather"})

#: "Collective name" prefix of the records torch's symmetric-memory ops write
#: (``torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu``: each op calls
#: RECORD_PARAM_COMMS with Seq 0, its group's name and description, the own rank, In / Out
#: msg nelems = input / output numel, "[]" splits and rank start / stride -1; the six names below
#: are strings of the torch 2.15.0 wheel's libtorch_cuda.so, their values not seen in a trace). Seq 0 on every
#: call: a symmetric-memory record has no cross-rank identity of its own.
SYMM_MEM_PREFIX = "symm_mem::"
#: Each symmetric-memory record's name -> its row, by the op that writes it
#: (``multimem_all_reduce_``, ``multimem_one_shot_reduce_out`` / ``multimem_one_shot_all_reduce_out``,
#: ``multimem_all_gather_out``, ``one_shot_all_reduce_out_impl``, ``two_shot_all_reduce_impl``,
#: ``reduce_scatter_out``). They launch torch's own kernels, no NCCL (``nccl_kernel`` ""), so they
#: stay out of :data:`COLLECTIVES`. ``multimem_one_shot_reduce`` has no bus-bandwidth factor: the same
#: name records a reduce to one root and (root = every rank in turn) an all-reduce, and the
#: record does not say which, so neither nccl-tests factor is right for both.
SYMM_MEM_COLLECTIVES: dict[str, Collective] = {row.name: row for row in (
    _row(SYMM_MEM_PREFIX + "multimem_all_reduce", "allreduce", True, "", "in", "2(n-1)/n", "io", None, "all"),
    _row(SYMM_MEM_PREFIX + "one_shot_all_reduce", "allreduce", True, "", "in", "2(n-1)/n", "io", None, "all"),
    _row(SYMM_MEM_PREFIX + "two_shot_all_reduce", "allreduce", True, "", "in", "2(n-1)/n", "io", None, "all"),
    _row(SYMM_MEM_PREFIX + "multimem_one_shot_reduce", "reduce", True, "", None, None, "io", None, "all"),
    _row(SYMM_MEM_PREFIX + "multimem_all_gather", "allgather", True, "", "out", "(n-1)/n", "io", "out = in x n", "all"),
    _row(SYMM_MEM_PREFIX + "reduce_scatter", "reducescatter", True, "", "in", "(n-1)/n", "io", "in = out x n", "all"),
)}


# ---------------------------------------------------------------------------- nccl2 (ProcessGroupNCCL2)

# Facts from ../shared/reference/nccl2-and-hooks.md (§ numbers below), read from the torch 2.15.0
# wheel and pytorch's nccl2 sources; none from a real nccl2 trace (launch/gpu_check.py's nccl2
# step is what settles them on hardware).

#: What a c10d backend object's ``name()`` returns, per implementation (§1: ``kBackendName``).
BACKEND_NCCL = "nccl"
BACKEND_NCCL2 = "nccl2"
BACKEND_NCCL_LAZY = "nccl-lazy"
BACKEND_GLOO = "gloo"
#: The format of a group's eager records: ProcessGroupNCCL's (and commtag's for gloo, which
#: records none) or ProcessGroupNCCL2's (§2, §3).
LEGACY_FORMAT = "legacy"
NCCL2_FORMAT = "nccl2"
#: Backend implementation -> the format its records follow; any other writes the legacy one.
#: nccl-lazy runs its collectives on a primary nccl2 communicator (§4, §6).
RECORD_FORMATS: dict[str, str] = {BACKEND_NCCL2: NCCL2_FORMAT, BACKEND_NCCL_LAZY: NCCL2_FORMAT}
#: The environment variable that picks nccl2 or legacy for ``"nccl"`` (§1): torch 2.14 gives
#: nccl2 only with "1", torch 2.15 gives it unless "0".
USE_NCCL2_ENV = "TORCH_DIST_USE_NCCL2"

#: nccl2's "Collective name" for each legacy one (§3: the string passed to TracingGuard).
#: all_to_allv splits in two by whether the caller gave split lists (§3 alltoall_base rows):
#: :data:`NCCL2_ALLTOALL_EVEN` without, :data:`NCCL2_ALLTOALL_SPLIT` with. The coalesced
#: legacy names become one record per tensor (or pair) under the single op's name (§3).
NCCL2_NAMES: dict[str, str] = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
    "all_gather": "all_gather", "_allgather_base": "allGatherSingleImpl", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "allGatherSingleImpl", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduceScatterSingleImpl",
    "reduce_scatter_tensor_coalesced": "reduceScatterSingleImpl", "all_to_all": "all_to_all", "gather": "gather",
    "scatter": "scatter", "barrier": "barrier", SEND: SEND, RECV: RECV,
}
NCCL2_ALLTOALL_EVEN = "allToAllSingleImpl"
NCCL2_ALLTOALL_SPLIT = "all_to_all_v_single"
#: The one record nccl2 writes for a whole ``batch_isend_irecv`` (at ``_end_coalescing``):
#: In / Out msg nelems = the sends' / the receives' total, splits per send / per receive (§3).
NCCL2_BATCH_P2P = "batch_op_issue"
#: Legacy names whose one call nccl2 writes as one record per tensor (or tensor pair), every
#: record with the call's one Seq (§3 coalesced rows, §4) -> the legacy name of one such part.
NCCL2_PER_TENSOR: dict[str, str] = {
    "allreduce_coalesced": "allreduce", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "_allgather_base", "reduce_scatter_tensor_coalesced": "_reduce_scatter_base",
}
#: Keys nccl2 never writes (§2): the description (an empty comm id), rank start and stride
#: (both -1), and the p2p peers (no group ranks to find them in).
NCCL2_OMITTED_KEYS: tuple[str, ...] = (PG_DESC_KEY, RANK_START_KEY, RANK_STRIDE_KEY, DST_RANK_KEY, SRC_RANK_KEY)
#: nccl2's "Process Group Ranks" on every record (§2: stride -1 leaves groupRanks empty).
NCCL2_GROUP_RANKS = "[]"
#: nccl2 writes "Is asynchronized op" = 1 on every record, barrier included (§2).
NCCL2_ALWAYS_ASYNC = True
#: nccl2 p2p (send, recv, batch_op_issue) takes no Seq of its own: it carries the Seq of the
#: group's last collective, 0 before any (§4), so (group, Seq) and Comms Id do not tell a p2p
#: call from that collective or from another p2p call: p2p pairs by its own order.
NCCL2_P2P_NAMES = frozenset({SEND, RECV, NCCL2_BATCH_P2P})
#: Records nccl2 writes that are no collective (§2 "Extra records with no kernel"): a
#: communicator's ``init`` and a Work's ``wait`` (already in :data:`NON_COLLECTIVE_NAMES`).
NCCL2_NON_COLLECTIVES = frozenset({"init", "wait"})

#: One row per nccl2 "Collective name" (see :class:`Collective`). Sizes follow the record's own
#: In / Out msg nelems (§3), which differ from legacy for the list all_gather (the guard's input
#: list is the output list: in = N·n, out = n) and for rooted ops off the root (gather: out 0,
#: scatter: in 0), so these rows are keyed by the nccl2 name and read only for a group whose
#: format is :data:`NCCL2_FORMAT`. Kernels: §3's NCCL calls (the list all_gather and
#: reduce_scatter run N broadcasts / reduces; the even all-to-all ncclAlltoAll). The rooted
#: ops' sizes are the largest over the ranks (the root's), as the analysis reads them.
NCCL2_COLLECTIVES: dict[str, Collective] = {row.name: row for row in (
    _row("all_reduce", "allreduce", True, "AllReduce", "in", "2(n-1)/n", "io", None, "all"),
    _row("broadcast", "broadcast", False, "Broadcast", "in", "1", "io", None, "rooted"),
    _row("reduce", "reduce", False, "Reduce", "in", "1", "io", None, "rooted"),
    _row("all_gather", "allgather", True, "Broadcast", "in", "(n-1)/n", "io", "in = out x n", "all"),
    _row("allGatherSingleImpl", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all"),
    _row("reduce_scatter", "reducescatter", True, "Reduce", "in", "(n-1)/n", "io", "in = out x n", "all"),
    _row("reduceScatterSingleImpl", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io", "in = out x n",
         "all"),
    _row(NCCL2_ALLTOALL_EVEN, "alltoall", True, "AlltoAll", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    _row(NCCL2_ALLTOALL_SPLIT, "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    _row("all_to_all", "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    _row("gather", "gather", False, "SendRecv", "out", "(n-1)/n", "i", None, "rooted"),
    _row("scatter", "scatter", False, "SendRecv", "in", "(n-1)/n", "o", None, "rooted"),
    _row("barrier", "barrier", True, "AllReduce", None, None, "io", None, "all"),
    _row(SEND, "send", False, "SendRecv", "in", "1", "io", None, "p2p"),
    _row(RECV, "recv", False, "SendRecv", "out", "1", "io", None, "p2p"),
    # No bus bandwidth: one batch's sends and receives go to several peers in sizes of their own.
    _row(NCCL2_BATCH_P2P, "sendrecv", False, "SendRecv", None, None, "", None, "p2p"),
)}


#: nccl2 names legacy never writes: a record named so is nccl2's, whatever the sidecar says.
NCCL2_ONLY_NAMES = frozenset(NCCL2_COLLECTIVES) - frozenset(COLLECTIVES)
#: The one name per kind the analysis and summary use for an nccl2 record: the legacy name of
#: the same call (§3), so one job reads the same under either backend; the record's own name
#: stays on its slices. A batch of p2p (no legacy record: legacy writes each op alone) keeps its own.
NCCL2_KINDS: dict[str, str] = {
    **{name: name for name in NCCL2_COLLECTIVES},
    "all_reduce": "allreduce", "allGatherSingleImpl": "_allgather_base",
    "reduceScatterSingleImpl": "_reduce_scatter_base", NCCL2_ALLTOALL_EVEN: "all_to_allv",
    NCCL2_ALLTOALL_SPLIT: "all_to_allv",
}
#: nccl2 names legacy also writes, whose legacy split sizes are always "[]" (LEG) where nccl2's
#: list each tensor's numel (§2): a non-empty split tells nccl2's record apart.
_NCCL2_SPLIT_TELLS = frozenset(NCCL2_COLLECTIVES) - {"all_to_all", "barrier"}


def is_nccl2_record(name: object, in_split: object, out_split: object) -> bool:
    """Is this record_param_comms record (or its kernel's copy) nccl2's? By its name (an engine
    name, §3), else by a split size legacy leaves "[]" (§2). A barrier reads alike in both."""
    if name in NCCL2_ONLY_NAMES:
        return True
    return name in _NCCL2_SPLIT_TELLS and (in_split not in ("[]", None) or out_split not in ("[]", None))


def legacy_view(record_format: object, name: str, in_nelems: int, out_nelems: int,
                group_size: int) -> tuple[str, int, int]:
    """(kind, In msg nelems, Out msg nelems) of a record as legacy writes the same call; an nccl2
    record's differ (§3 against LEG): the list all_gather's guard lists the output as its input
    (N·n / n, legacy n / N·n); off the root, gather writes out 0 and scatter in 0 (legacy: N·n)."""
    if record_format != NCCL2_FORMAT:
        return name, in_nelems, out_nelems
    kind = NCCL2_KINDS.get(name, name)
    if name == "all_gather":
        return kind, out_nelems, in_nelems
    if name == "gather" and out_nelems == 0:
        return kind, in_nelems, in_nelems * group_size
    if name == "scatter" and in_nelems == 0:
        return kind, out_nelems * group_size, out_nelems
    return kind, in_nelems, out_nelems


#: c10d's hook op names (torch 2.15 ``HookOpName``, the name a ProcessGroup pre-hook is given;
#: nccl2-and-hooks.md §7a) -> the eager "Collective name" of the c10d op behind it. Left out:
#: ALLTOALL_BASE (the hook is not given the split sizes, which legacy records and nccl2's name
#: depends on: such a call is numbered, not annotated), SPLIT, NEW_WINDOW and UNKNOWN (no
#: collective). torch 2.14's HookOpName lacks the *_BASE and *_COALESCED members (§7a).
HOOK_OP_COLLECTIVES: dict[str, str] = {
    "ALLREDUCE": "allreduce", "ALLREDUCE_COALESCED": "allreduce_coalesced", "BROADCAST": "broadcast",
    "REDUCE": "reduce", "ALLGATHER": "all_gather", "ALLGATHER_BASE": "_allgather_base",
    "ALLGATHER_COALESCED": "allgather_coalesced", "ALLGATHER_INTO_TENSOR_COALESCED": "allgather_into_tensor_coalesced",
    "REDUCE_SCATTER": "reduce_scatter", "REDUCE_SCATTER_BASE": "_reduce_scatter_base",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter_tensor_coalesced", "ALLTOALL": "all_to_all",
    "GATHER": "gather", "SCATTER": "scatter", "BARRIER": "barrier", "SEND": SEND, "RECV": RECV,
}
#: The hook op name of a collective the hook cannot describe (see above).
UNDESCRIBED_HOOK_OP = "ALLTOALL_BASE"


# ---------------------------------------------------------------------------- gloo

#: c10d CPU ops (as Kineto names them) whose gloo work runs on the calling thread, as
#: ``gloo:send``/``gloo:recv`` events, instead of as one ``gloo:<collective>`` event on a worker:
#: monitored_barrier sends to and receives from group rank 0 inside ProcessGroupGloo.
C10D_OPS_WITHOUT_GLOO_WORK = frozenset({"c10d::monitored_barrier_"})
#: gloo's work events ("gloo:all_reduce"), on the group's worker threads or the caller's (p2p).
GLOO_WORK_PREFIX = "gloo:"
#: gloo (torch 2.13) runs a collective as ``gloo:<op>`` events of another family here: both
#: reduce_scatters run as all_reduce works (families as :func:`family` names them).
GLOO_WORK_FAMILY = {"reducescatter": "allreduce"}
#: Collective names gloo runs as one work per group member (the list reduce_scatter), each
#: on a worker thread of the group; every other collective is one work.
GLOO_WORK_PER_MEMBER = frozenset({"reduce_scatter"})
#: Families whose gloo work runs on the calling thread, starting inside its c10d op (p2p);
#: the rest run on the group's own worker threads (``pt_gloo_runloop``), in queue order.
GLOO_CALLER_FAMILIES = frozenset({"send", "recv"})
#: Work families whose gloo event shows, in its "Input Dims" (``record_shapes``), exactly the
#: tensors its one-work call reduces (all_reduce, all_reduce_coalesced, a fused coalescing
#: block, reduce_scatter_tensor's input): a work showing another element count is another call's.
GLOO_SHAPED_FAMILIES = frozenset({"allreduce"})


# ---------------------------------------------------------------------------- commtag's own keys

# Every key commtag adds is spelled "commtag ..." so that it never collides with Kineto's.
# On an annotation (sidecar and merged trace; the aliases of CollectiveAnnotation's own fields):
ANN_LANE_ID = "commtag lane id"
ANN_LANE = "commtag lane"
ANN_PG_UID = "commtag pg uid"
ANN_P2P = "commtag p2p"
ANN_P2P_PAIR_SEQ = "commtag p2p pair seq"
ANN_ASYNC = "commtag async"
ANN_THREAD = "commtag thread"
ANN_CAPTURE_ID = "commtag capture id"
ANN_REPLAY = "commtag replay"
ANN_ERROR = "commtag error"
# Added by the merge to a slice: whose it is, where it came from, how it was joined.
ANN_RANK = "commtag rank"
ANN_SOURCE = "commtag source"
#: How a replayed kernel was matched: "tools-id", "node-id" or "order".
ANN_MATCH = "commtag match"
#: What a Seq the trace did not carry was derived from ("kernel order", ...).
ANN_SEQ_FROM = "commtag seq from"
#: False where an instance must not be matched across ranks.
ANN_CROSS_RANK = "commtag cross-rank"
#: On an nccl2 record's slices: its format (vocab.NCCL2_FORMAT), read back to its legacy view.
ANN_RECORD_FORMAT = "commtag record format"
#: On an nccl2 send/recv: the peer's global rank, which nccl2 does not write (no Dst / Src Rank,
#: nccl2-and-hooks.md §2), from its "Rank" and the group's members.
ANN_PEER = "commtag peer"
#: The k-th (from 0) of a rank's nccl2 records sharing one group and Seq (a coalesced call's
#: per-tensor records, nccl2-and-hooks.md §4): each is an instance of its own.
ANN_SEQ_PART = "commtag seq part"
#: What the merge guessed, and why (metadata-less NCCL kernels).
ANN_INFERRED = "commtag inferred"
#: "not identified" where a gloo call's work event could not be told apart.
ANN_GLOO_WORK = "commtag gloo work"
#: On a call that had not finished when its window's trace was handed over: what its end is.
ANN_UNFINISHED = "commtag unfinished"
UNFINISHED_END = "still running when its trace was written; its end is not in this trace"
# Written by the analysis on a matched instance's slices and markers.
ANN_RANKS_MATCHED = "commtag ranks matched"
ANN_SKEW_US = "commtag skew us"
ANN_LAST_RANK = "commtag last rank"
ANN_MISSING_RANKS = "commtag missing ranks"
ANN_MEMBERS_NOT_FOUND = "commtag members not found"
ANN_BYTES = "commtag bytes"
ANN_ALGBW = "commtag algbw GB/s"
ANN_BUSBW = "commtag busbw GB/s"
ANN_DESYNC = "commtag desync"
ANN_WAIT_US = "commtag wait us"
ANN_STRAGGLER = "commtag straggler"
#: A marker's kind ("straggler", "desync", a trace window).
ANN_MARKER = "commtag marker"
ANN_WINDOW_RANK = "commtag window of rank"
ANN_WINDOW_NS = "commtag window ns"
ANN_WORLD_SIZE = "commtag world size"
# With torch's own CUDA-graph annotations (torch 2.14+).
#: Key commtag adds to the annotation it hands torch's ``mark_kernels`` for a captured
#: collective (where the user turned torch's graph annotations on): ``"<capture id>.<n>"``, the
#: n-th collective commtag saw in that capture. torch's exporter bakes it into the replayed
#: events' args; the sidecar's captured collective carries the same value (``torch_mark``).
TORCH_MARK_KEY = "commtag graph mark"
#: Arg of a graphed event the merge put back on the stream it ran on: the lane torch had moved
#: it to (a process group's lane, which commtag's own lane of that group replaces).
TORCH_LANE_ARG = "commtag torch lane"

# The kernel breakdown (commtag.kernels.Breakdown.annotations).
ANN_KERNELS = "commtag kernels"
ANN_KERNELS_PREFIX = "commtag kernels "
ANN_DOMINANT = "commtag dominant"
ANN_KERNELS_SCOPE = "commtag kernels scope"
ANN_KERNELS_ID = "commtag kernels id"
