"""The few CUDA-graph queries capture bookkeeping needs, behind one small interface.

:mod:`commtag.runtime.capture` only talks to a :class:`GraphAPI`, so its
node-walking logic runs unchanged over the real driver (through
``cuda.bindings``, imported here and only here, lazily) or over a small
in-memory graph in tests on machines without a GPU.

Graph and node handles are opaque to the caller; ``int(node)`` must be a
stable key for a node while its graph lives.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Protocol

from commtag.vocab import KERNEL_NODE_TYPE, MEMCPY_NODE_TYPE, MEMSET_NODE_TYPE, TOOLS_ID_DRIVER_VERSION

log = logging.getLogger("commtag.capture")



class GraphAPI(Protocol):
    """What capture bookkeeping asks of CUDA. Every method may raise; callers fail open."""

    def capture_info(self, stream: int) -> Optional[tuple[int, Any]]:
        """(capture sequence id, graph) when ``stream`` (a cudaStream_t value) is capturing, else None."""

    def nodes(self, graph: Any) -> list[Any]:
        """The graph's nodes, in creation order (the driver's listing order)."""

    def node_count(self, graph: Any) -> int:
        """How many nodes the graph holds, without listing them."""

    def node_type(self, node: Any) -> str:
        """"kernel", "memcpy", "memset", "empty", "event_record", ... (lower case)."""

    def kernel_name(self, node: Any) -> str:
        """The kernel's (possibly mangled) function name; "" when not obtainable."""

    def tools_id(self, node: Any) -> Optional[int]:
        """cudaGraphNodeGetToolsId, or None where the driver lacks it (< 13.1)."""

    def local_id(self, node: Any) -> Optional[int]:
        """cudaGraphNodeGetLocalId, or None where the driver lacks it (< 13.1)."""

    def graph_id(self, graph: Any) -> Optional[int]:
        """cudaGraphGetId, or None where the driver lacks it."""

    def exec_graph_id(self, exec_handle: int) -> Optional[int]:
        """cudaGraphExecGetId of a cudaGraphExec_t value, or None where the driver lacks it."""


_NODE_TYPE_NAMES = {
    "cudaGraphNodeTypeKernel": KERNEL_NODE_TYPE,
    "cudaGraphNodeTypeMemcpy": MEMCPY_NODE_TYPE,
    "cudaGraphNodeTypeMemset": MEMSET_NODE_TYPE,
    "cudaGraphNodeTypeHost": "host",
    "cudaGraphNodeTypeGraph": "child_graph",
    "cudaGraphNodeTypeEmpty": "empty",
    "cudaGraphNodeTypeWaitEvent": "wait_event",
    "cudaGraphNodeTypeEventRecord": "event_record",
    "cudaGraphNodeTypeExtSemaphoreSignal": "ext_semaphore_signal",
    "cudaGraphNodeTypeExtSemaphoreWait": "ext_semaphore_wait",
    "cudaGraphNodeTypeMemAlloc": "mem_alloc",
    "cudaGraphNodeTypeMemFree": "mem_free",
    "cudaGraphNodeTypeConditional": "conditional",
}


class CudaBindingsGraphAPI:
    """:class:`GraphAPI` over ``cuda.bindings`` (runtime for graphs, driver for kernel names)."""

    def __init__(self) -> None:
        from cuda.bindings import driver, runtime  # lazy: absent or broken means "no capture support"

        self._rt = runtime
        self._drv = driver
        self._ok = runtime.cudaError_t.cudaSuccess
        err, version = runtime.cudaDriverGetVersion()
        if err != self._ok:
            raise RuntimeError(f"cudaDriverGetVersion failed: {err}")
        #: The CUDA driver version as an int (13000 = 13.0).
        self.driver_version = int(version)
        self._has_ids = self.driver_version >= TOOLS_ID_DRIVER_VERSION and all(
            hasattr(runtime, name)
            for name in ("cudaGraphNodeGetToolsId", "cudaGraphNodeGetLocalId", "cudaGraphGetId", "cudaGraphExecGetId")
        )
        self._active = runtime.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive

    def _check(self, result: tuple[Any, ...]) -> tuple[Any, ...]:
        if result[0] != self._ok:
            raise RuntimeError(f"CUDA call failed: {result[0]}")
        return result[1:]

    def capture_info(self, stream: int) -> Optional[tuple[int, Any]]:
        # cuda-bindings 12.x returns (err, status, id, graph, deps, n); 13.x adds edge data: graph is [3] in both.
        result = self._rt.cudaStreamGetCaptureInfo(self._rt.cudaStream_t(init_value=stream))
        if result[0] != self._ok or result[1] != self._active:
            return None
        return int(result[2]), result[3]

    def nodes(self, graph: Any) -> list[Any]:
        _, count = self._check(self._rt.cudaGraphGetNodes(graph, numNodes=0))
        if not count:
            return []
        nodes, count = self._check(self._rt.cudaGraphGetNodes(graph, numNodes=count))
        return list(nodes[:count])

    def node_count(self, graph: Any) -> int:
        _, count = self._check(self._rt.cudaGraphGetNodes(graph, numNodes=0))
        return int(count)

    def node_type(self, node: Any) -> str:
        (kind,) = self._check(self._rt.cudaGraphNodeGetType(node))
        return _NODE_TYPE_NAMES.get(getattr(kind, "name", str(kind)), str(getattr(kind, "name", kind)).lower())

    def kernel_name(self, node: Any) -> str:
        drv = self._drv
        err, params = drv.cuGraphKernelNodeGetParams(node)
        if err != drv.CUresult.CUDA_SUCCESS:
            return ""
        if int(params.func):
            err, name = drv.cuFuncGetName(params.func)
            if err == drv.CUresult.CUDA_SUCCESS and name:
                return _decode(name)
        kern = getattr(params, "kern", None)
        if kern is not None and int(kern):
            err, name = drv.cuKernelGetName(kern)
            if err == drv.CUresult.CUDA_SUCCESS and name:
                return _decode(name)
        return ""

    def tools_id(self, node: Any) -> Optional[int]:
        if not self._has_ids:
            return None
        (value,) = self._check(self._rt.cudaGraphNodeGetToolsId(node))
        return int(value)

    def local_id(self, node: Any) -> Optional[int]:
        if not self._has_ids:
            return None
        (value,) = self._check(self._rt.cudaGraphNodeGetLocalId(node))
        return int(value)

    def graph_id(self, graph: Any) -> Optional[int]:
        if not self._has_ids:
            return None
        (value,) = self._check(self._rt.cudaGraphGetId(graph))
        return int(value)

    def exec_graph_id(self, exec_handle: int) -> Optional[int]:
        if not self._has_ids or not exec_handle:
            return None
        (value,) = self._check(self._rt.cudaGraphExecGetId(self._rt.cudaGraphExec_t(init_value=exec_handle)))
        return int(value)


def _decode(name: Any) -> str:
    if isinstance(name, bytes):
        return name.decode("utf-8", "replace")
    return str(name)


def load_cuda_graph_api() -> Optional[CudaBindingsGraphAPI]:
    """The real adapter, or None (logged once by the caller) when CUDA or cuda-python is unusable."""
    try:
        import torch

        if not torch.cuda.is_available():
            log.info("commtag: no CUDA device; CUDA-graph capture bookkeeping is off")
            return None
        return CudaBindingsGraphAPI()
    except Exception as exc:  # noqa: BLE001 - missing cuda-python or driver: bookkeeping off, job unaffected
        log.warning("commtag: cuda-python unusable (%s); CUDA-graph capture bookkeeping is off", exc)
        return None
