"""CUDA/HIP graph launches and torch's own CUDA-graph annotations."""

from __future__ import annotations

from commtag.vocab.eager import PG_DESC_KEY


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
