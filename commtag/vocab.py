"""The domain's vocabulary: what PyTorch's profiler, Kineto, NCCL/RCCL and CUDA/HIP call things, written once.

Every fact commtag relies on about names it does not choose lives here as a
table with the reason beside it, the way :data:`commtag.kernels.KERNEL_RULES`
holds the kernel categories: change a fact here and nowhere else. Both wings
read it (torch-free and pydantic-free, so ``import commtag`` stays cheap);
the sidecar format's own names and limits are in :mod:`commtag.constants`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


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

#: The keys ProcessGroupNCCL's ``record_param_comms`` writes for one collective, in its order
#: (the aliases of :class:`commtag.schema.CollectiveAnnotation`'s eager fields, checked there).
EAGER_KEYS: tuple[str, ...] = (
    "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size",
    "Out split size", "Global rank start", "Global rank stride", "Process Group Name",
    "Process Group Description", "Process Group Ranks", "Rank", "Dst Rank", "Src Rank", "Seq",
)
#: The eager keys Kineto copies from the op onto the collective's NCCL kernel, in its order.
KERNEL_EAGER_KEYS: tuple[str, ...] = (
    "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size",
    "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks",
    "Dst Rank", "Src Rank", "Seq",
)
#: Eager keys only a point-to-point call carries (its peer's group rank).
P2P_PEER_KEYS: tuple[str, ...] = ("Dst Rank", "Src Rank")


# ---------------------------------------------------------------------------- torch's CUDA-graph annotations

#: torch 2.14+ public module for annotating captured graph nodes (``mark_kernels``,
#: ``get_kernel_annotations``, ``is_available``); it records by the driver's tools id, so it
#: needs cuda-bindings and a CUDA 13.1+ driver (``cudaGraphNodeGetToolsId``), else it is a no-op.
#: Torch 2.12 and 2.13 hold the same code privately (``torch.cuda._graph_annotations``).
TORCH_GRAPH_ANNOTATIONS_MODULE = "torch.cuda.graph_annotations"
#: Its registry's keys and Kineto's "graph node id" of a replayed node are one number:
#: ``(exec graph id << TOOLS_ID_GRAPH_SHIFT) | node id``.
TOOLS_ID_GRAPH_SHIFT = 32
#: Top-level key (before ``traceEvents``) of a trace torch 2.15+'s ``export_chrome_trace(...,
#: cuda_graph_annotations=...)`` wrote with annotations baked into graphed events' args.
TORCH_INLINE_ANNOTATED_KEY = "cudaGraphInlineAnnotated"
#: Annotation key whose value names the lane torch moves an annotated graphed event to, with
#: ``graph_lanes="all"``: the lane (a tid on the GPU's pid, from the annotation's ``"stream"``)
#: is named by it. The key is spliced into the event's args with the rest of the annotation.
TORCH_LANE_NAME_KEY = "Process Group Description"
#: Arg of an event torch moved onto a lane: the stream it ran on (its ``tid`` and ``args.stream``
#: then name the lane).
TORCH_ORIGINAL_STREAM_KEY = "original_stream"
#: Annotation key torch reserves for the lane (an int) an annotated node's events move to.
TORCH_LANE_KEY = "stream"
#: Device work categories torch's annotation pass reads and moves (not gpu_user_annotation).
TORCH_ANNOTATED_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
