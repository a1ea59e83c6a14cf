"""Traces of a graphed 2-rank NCCL job written by torch's own exporter, with torch's graph annotations.

    python launch/torch_graph_traces.py OUT_DIR      # under torch 2.14 or 2.15+ (CUDA builds run on CPU)

No machine here has a GPU with a CUDA 13.1+ driver, which torch's graph annotations need
(tools ids), so nothing real is replayed. What is real is torch's exporter: the events
are handed to ``torch.profiler._chrome_trace_export.export_chrome_trace`` (torch 2.14+),
the function ``prof.export_chrome_trace(path, cuda_graph_annotations=...,
graph_lanes=...)`` calls, as activity objects shaped like the profiler's (the methods it
reads: device and resource ids, times, category, name, Kineto's metadata fragment,
correlation and flows), with the annotations commtag's runtime hands torch's
``mark_kernels`` for each captured collective (``commtag.runtime.capture.torch_marks``) keyed as
torch's registry keys them: ``(exec graph id << 32) | node id``, the kernels' "graph node id".

The job, per rank: one capture of a graph with 6 nodes (a gemm the user annotated
``{"name": "fwd"}``, an all_reduce on the world, an all_gather and its copy on group "tp",
a relu, a second all_reduce), replayed twice; the NCCL kernels run on streams 20 and 21,
the compute on 22. Its sidecar, beside each trace, is what commtag's runtime writes for
such a capture on a 13.1 driver: nodes with tools and local ids, the exec graph id, the
replay log, each collective's torch mark and the tools ids torch held for it.

Under torch 2.15+, four folders, the same job exported four ways:

``graph-lanes-all``   ``cuda_graph_annotations=..., graph_lanes="all"``: annotations baked
                      in, graphed work moved onto lanes ("Process Group Description" lanes
                      for the collectives, ``default_stream`` 7 for the rest)
``graph-lanes-none``  ``cuda_graph_annotations=...``: baked in, nothing moved
``plain``             no annotations: Kineto's keys only (joined by torch's tools ids)
``graph-lanes-all-wrapper``  as ``graph-lanes-all``, but a comms wrapper of the user's
                      annotated the same calls in an enclosing scope with its own eager
                      keys ("Collective name", "Seq", ...) and lane: torch merges the two,
                      the inner scope (commtag's) winning shared keys, so replayed kernels
                      carry eager keys, the same Seq on every replay

Under torch 2.14, whose exporter does not annotate, one folder, ``annotate-tool``: its plain
export post-processed by the passes of torch 2.14's ``torch.cuda._annotate_cuda_graph_trace``
(annotations joined on, every graphed event moved to its annotation's ``"stream"`` or to 7,
the stream it ran on not kept).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import _chrome_trace_export

from commtag.identity import format_list, group_info
from commtag.runtime.record.sidecar import write_sidecar
from commtag.runtime.capture.torch_marks import TorchMarks
from commtag.schema import (
    CapturedCollective, CollectiveAnnotation, GraphCapture, GraphNodeRecord, GraphReplay, ProcessGroupInfo, Sidecar,
)
from commtag.vocab import (
    CBID_KEY, COLLECTIVE_NAME_KEY, CORRELATION_KEY, CUDA_GRAPH_LAUNCH_CBID, DEVICE_WORK_NODE_TYPES, DTYPE_KEY, PG_DESC_KEY,
    PG_NAME_KEY, SEQ_KEY, TOOLS_ID_GRAPH_SHIFT,
)

WORLD = 2
CAPTURE_GRAPH, EXEC_GRAPH = 5, 9
GPU = 0
CPU_TID = 4242
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
#: (node id, category, name, stream, collective index or None, user annotation or None)
NODES = (
    (0, "kernel", "void gemm_fwd_kernel<float>(float const*, float*, int)", 22, None, {"name": "fwd"}),
    (1, "kernel", AR, 20, 0, None),
    (2, "kernel", AG, 21, 1, None),
    (3, "gpu_memcpy", "Memcpy DtoD (Device -> Device)", 21, 1, None),
    (4, "kernel", "void relu_kernel<float>(float*, int)", 22, None, None),
    (5, "kernel", AR, 20, 2, None),
)
#: (collective name, group, Seq, elements) of the captured collectives, in capture order.
COLLECTIVES = (("allreduce", "0", 1, 4096), ("_allgather_base", "1", 1, 2048), ("allreduce", "0", 2, 4096))
GROUPS = {"0": ("default_pg", [0, 1]), "1": ("tp", [0, 1])}
#: folder -> (graph_lanes, annotations baked in, a comms wrapper of the user's annotated the calls too)
VARIANTS = {"graph-lanes-all": ("all", True, False), "graph-lanes-none": ("none", True, False),
            "plain": ("none", False, False), "graph-lanes-all-wrapper": ("all", True, True)}


class Activity:
    """One profiler activity, through the methods the exporter calls."""

    def __init__(self, device: int, resource: int, ts: int, dur: int, cat: str, name: str, metadata: str = "",
                 correlation: int = 0, linked_correlation: int = 0, flow: tuple[int, int, bool] = (0, 0, False)) -> None:
        self._device, self._resource, self._ts, self._dur = device, resource, ts, dur
        self._cat, self._name, self._metadata = cat, name, metadata
        self._correlation, self._linked = correlation, linked_correlation
        self._flow = flow

    def device_id(self) -> int:
        return self._device

    def resource_id(self) -> int:
        return self._resource

    def timestamp(self) -> int:
        return self._ts

    def duration(self) -> int:
        return self._dur

    def type(self) -> str:
        return self._cat

    def name(self) -> str:
        return self._name

    def metadata_json(self) -> str:
        return self._metadata

    def correlation_id(self) -> int:
        return self._correlation

    def linked_correlation_id(self) -> int:
        return self._linked

    def linked_activity(self) -> None:
        return None  # a replayed kernel links to cudaGraphLaunch, not to record_param_comms

    def flow_id(self) -> int:
        return self._flow[0]

    def flow_type(self) -> int:
        return self._flow[1]

    def flow_start(self) -> bool:
        return self._flow[2]


class Results:
    """What ``export_chrome_trace`` reads of a ``_ProfilerResult``."""

    def __init__(self, activities: list[Activity]) -> None:
        self._activities = sorted(activities, key=lambda a: a.timestamp())

    def trace_activities(self) -> list[Activity]:
        return self._activities

    def trace_start_ns(self) -> int:
        return self._activities[0].timestamp()


def _tools_id(node: int) -> int:
    return (EXEC_GRAPH << TOOLS_ID_GRAPH_SHIFT) | node


def _annotation(rank: int, index: int) -> CollectiveAnnotation:
    name, pg, seq, n = COLLECTIVES[index]
    desc, ranks = GROUPS[pg]
    group = group_info(pg, desc, ranks, "nccl")
    out = n * len(ranks) if name == "_allgather_base" else n
    return CollectiveAnnotation(
        collective_name=name, in_msg_nelems=n, out_msg_nelems=out, group_size=len(ranks), dtype="Float",
        pg_name=pg, pg_desc=desc, pg_ranks=format_list(ranks), rank=rank, seq=seq,
        lane_id=group.lane_id, lane_name=group.lane_name, pg_uid=group.uid, capture_id=0,
    )


def _torch_annotations(rank: int, wrapper: bool) -> dict[int, list[dict]]:
    """torch's registry after the capture: what commtag's marks and the user's scopes recorded
    (one merged dict per node; of nested scopes the inner one wins a shared key)."""
    registry: dict[int, list[dict]] = {}
    for node, _, _, _, collective, user in NODES:
        if collective is not None:
            ann = _annotation(rank, collective)
            marked = TorchMarks.annotation(f"0.{collective}")
            TorchMarks.name_group(marked, ann.pg_name, ann.pg_desc, ann.lane_id)
            if wrapper:  # its keys as the profiler names them, and a lane per group as torch numbers them
                outer = {key: ann.eager_dict()[key] for key in (COLLECTIVE_NAME_KEY, SEQ_KEY, PG_NAME_KEY,
                                                                PG_DESC_KEY, DTYPE_KEY)}
                marked = {**outer, "stream": 60 + int(ann.pg_name), **marked}
            registry[_tools_id(node)] = [marked]
        elif user is not None:
            registry[_tools_id(node)] = [dict(user)]
    return registry


def _job(rank: int, t0: int) -> tuple[list[Activity], list[GraphReplay]]:
    """The profiled window: two replays of the graph, each a cudaGraphLaunch in a step."""
    pid = os.getpid()  # the exporter labels the device id equal to its own pid "CPU"
    activities: list[Activity] = []
    replays = []
    correlation = 1000 + rank * 100
    for replay in range(2):
        start = t0 + replay * 2_000_000 + rank * 3_000
        correlation += 1
        external = 50 + replay
        activities.append(Activity(pid, CPU_TID, start, 300_000, "user_annotation", f"ProfilerStep#{replay}",
                                   correlation=external))
        activities.append(Activity(pid, CPU_TID, start + 10_000, 40_000, "cuda_runtime", "cudaGraphLaunch",
                                   f'"{CBID_KEY}": {CUDA_GRAPH_LAUNCH_CBID}, "{CORRELATION_KEY}": {correlation}', correlation,
                                   linked_correlation=external, flow=(correlation, 2, True)))
        replays.append(GraphReplay(index=replay, start_ns=start + 5_000, end_ns=start + 60_000, tid=CPU_TID))
        at = start + 60_000
        for node, cat, name, stream, _, _ in NODES:
            dur = 30_000 if cat == "kernel" else 4_000
            metadata = (f'"device": {GPU}, "context": 1, "stream": {stream}, "correlation": {correlation}, '
                        + ('"registers per thread": 32, "shared memory": 0, "grid": [2, 1, 1], "block": [512, 1, 1], '
                           if cat == "kernel" else '"bytes": 8192, "memory bandwidth (GB/s)": 100, ')
                        + f'"graph id": {EXEC_GRAPH}, "graph node id": {_tools_id(node)}')
            activities.append(Activity(GPU, stream, at, dur, cat, name, metadata, correlation,
                                       flow=(correlation, 2, False)))
            at += dur + 2_000
    return activities, replays


def _sidecar(rank: int, trace_file: str, replays: list[GraphReplay], with_torch_ids: bool) -> Sidecar:
    groups = [group_info(pg, desc, ranks, "nccl") for pg, (desc, ranks) in GROUPS.items()]
    collectives = []
    for index in range(len(COLLECTIVES)):
        nodes = [GraphNodeRecord(index=node, node_type=DEVICE_WORK_NODE_TYPES[cat],
                                 kernel_name=name.split("(")[0] if cat == "kernel" else "",
                                 tools_id=(CAPTURE_GRAPH << TOOLS_ID_GRAPH_SHIFT) | node, local_id=node)
                 for node, cat, name, _, collective, _ in NODES if collective == index]
        collectives.append(CapturedCollective(
            annotation=_annotation(rank, index), nodes=nodes, tid=CPU_TID, reduce_op="sum" if "reduce" in
            COLLECTIVES[index][0] else None, torch_mark=f"0.{index}",
            torch_tools_ids=[_tools_id(n.index) for n in nodes] if with_torch_ids else None))
    capture = GraphCapture(capture_id=0, graph_id=CAPTURE_GRAPH, exec_graph_id=EXEC_GRAPH, start_ns=replays[0].start_ns
                           - 1_000_000, end_ns=replays[0].start_ns - 500_000, total_nodes=len(NODES),
                           collectives=collectives, replays=replays)
    return Sidecar(run_id="torch-graph-traces", rank=rank, world_size=WORLD, host="generated", pid=os.getpid(),
                   torch_version=torch.__version__, nccl_version="2.27.3", trace_file=trace_file,
                   process_groups=[ProcessGroupInfo(uid=g.uid, name=g.name, desc=g.desc, ranks=g.ranks,
                                                    backend="cuda:nccl", lane_id=g.lane_id, lane_name=g.lane_name)
                                   for g in groups],
                   collectives=[], captures=[capture])


def _distributed_info(rank: int) -> str:
    return json.dumps({"backend": "nccl", "rank": rank, "world_size": WORLD, "pg_count": len(GROUPS),
                       "pg_config": [{"pg_name": pg, "pg_desc": desc, "backend_config": "cuda:nccl",
                                      "pg_size": len(ranks), "ranks": ranks} for pg, (desc, ranks) in GROUPS.items()],
                       "nccl_version": "2.27.3"})


def write(out: Path, lanes: str, annotated: bool, wrapper: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time_ns()
    for rank in range(WORLD):
        activities, replays = _job(rank, t0)
        trace = out / f"rank{rank}.step0.pt.trace.json.gz"
        _chrome_trace_export.export_chrome_trace(
            Results(activities), str(trace), {"distributedInfo": _distributed_info(rank)},
            _torch_annotations(rank, wrapper) if annotated else None, lanes)
        write_sidecar(out / f"rank{rank}.step0.commtag.json", _sidecar(rank, trace.name, replays, True))


def write_post_processed(out: Path) -> None:
    """torch 2.14: its exporter writes the plain trace, then its post-processor's passes (what
    ``python -m torch.cuda._annotate_cuda_graph_trace`` runs on a trace and a pickle of the
    annotations) join the annotations on and move graphed events, the file rewritten as it does."""
    from torch.cuda import _annotate_cuda_graph_trace as tool

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time_ns()
    for rank in range(WORLD):
        activities, replays = _job(rank, t0)
        trace = out / f"rank{rank}.step0.pt.trace.json.gz"
        _chrome_trace_export.export_chrome_trace(Results(activities), str(trace),
                                                 {"distributedInfo": _distributed_info(rank)})
        data = tool.load_trace(trace)
        tool.annotate_trace(data, _torch_annotations(rank, False))
        tool._move_overlapping_to_stream(data)
        tool._fix_overlapping_timestamps(data)
        tool.save_trace(data, trace)
        write_sidecar(out / f"rank{rank}.step0.commtag.json", _sidecar(rank, trace.name, replays, True))


def main() -> None:
    root = Path(sys.argv[1])
    if "graph_lanes" in _chrome_trace_export.export_chrome_trace.__code__.co_varnames:
        for folder, (lanes, annotated, wrapper) in VARIANTS.items():
            write(root / folder, lanes, annotated, wrapper)
    elif importlib.util.find_spec("torch.cuda._annotate_cuda_graph_trace") is not None:
        write_post_processed(root / "annotate-tool")
    else:
        sys.exit(f"torch {torch.__version__}: no annotating exporter (2.15+) and no post-processor (2.14)")
    print(f"torch {torch.__version__}: {sorted(p.name for p in root.iterdir())}")


if __name__ == "__main__":
    main()
