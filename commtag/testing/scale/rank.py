"""One rank of a scale set: its trace (the template's events, eager metadata, graph replays) and its sidecar."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

from commtag.runtime.record.sidecar import trace_name
from commtag.schema import (
    CapturedCollective,
    CollectiveAnnotation,
    GraphCapture,
    GraphNodeRecord,
    GraphReplay,
    ProcessGroupInfo,
    RecordedCollective,
    Sidecar,
)
from commtag.vocab import (
    CBID_KEY, CORRELATION_KEY, CUDA_GRAPH_LAUNCH_CBID, EXTERNAL_ID_KEY, GRAPH_ID_KEY, GRAPH_NODE_ID_KEY,
    KERNEL_CATEGORY, KERNEL_EAGER_KEYS, KERNEL_NODE_TYPE, TOOLS_ID_GRAPH_SHIFT,
)
from commtag.testing.scale.plan import (
    BASE_TIME_NS, COMPUTE_NODES, GRAPH_STREAM, GRAPHS, LAUNCH_LEAD_US, LAUNCHER_TID_OFFSET, NCCL_KERNEL_OF, NCCL_VERSION,
    STEP, TORCH_VERSION, WARMUP_REPLAYS, Group, SetPlan, annotation, capture_seqs, groups_of, kernel_op,
)
from commtag.testing.scale.template import MAX_JITTER_US, Template, is_gpu


def _pid(rank: int) -> int:
    """The rank's process id in its trace (distinct per rank, as real pids are)."""
    return 100_000 + rank


def _launcher_tid(rank: int) -> int:
    """The thread that launches graph replays (its own thread, so its slices never cross others)."""
    return _pid(rank) + LAUNCHER_TID_OFFSET


def _jitter(seed: int, rank: int, key: int, limit: float) -> float:
    """Deterministic arrival delay of ``rank`` at collective ``key``."""
    return random.Random((seed * 1_000_003 + key) * 65_537 + rank).uniform(0.0, limit)


@dataclass(frozen=True)
class RankLayout:
    """Where one rank's events go: its process and device ids, graph-launcher thread, clock and file."""

    rank: int
    #: The template's CPU and GPU pids, which become this rank's ``pid`` and ``device``.
    template_cpu_pid: int
    template_gpu_pid: int
    pid: int
    device: int
    launcher_tid: int
    offset_us: float
    trace_name: str

    @classmethod
    def of(cls, plan: SetPlan, rank: int) -> RankLayout:
        return cls(rank=rank, template_cpu_pid=plan.template.cpu_pid, template_gpu_pid=plan.template.gpu_pid,
                   pid=_pid(rank), device=rank % plan.ranks_per_node, launcher_tid=_launcher_tid(rank),
                   offset_us=plan.clock_offset_us[rank], trace_name=trace_name(rank, STEP))

    def remap_pid(self, p: object) -> object:
        """The template's CPU pid becomes the rank's, its GPU pid the rank's device (and back)."""
        if p == self.template_cpu_pid:
            return self.pid
        if p == self.template_gpu_pid:
            return self.device
        if p == self.device:
            return self.template_gpu_pid
        return p


def build_rank(plan: SetPlan, rank: int) -> tuple[dict, Sidecar, int]:
    """One rank's trace (as a dict), its sidecar and its event count."""
    layout = RankLayout.of(plan, rank)
    mine = groups_of(rank, plan.groups)
    body, eager = _template_events(plan, layout, mine)
    events = _meta_events(plan.template, layout) + body
    events += _replays(plan, rank, mine, layout.pid, layout.device, layout.launcher_tid, layout.offset_us)
    trace = _rank_trace(plan, layout, mine, events)
    sidecar = _rank_sidecar(plan, layout, mine, eager, _captures(plan, rank, mine))
    return trace, sidecar, sum(1 for e in events if e.get("ph") != "M")


def _meta_events(tpl: Template, layout: RankLayout) -> list[dict]:
    """The template's metadata events on this rank's ids, and names for the graph launcher and stream."""
    events: list[dict] = []
    for e in tpl.meta:
        m = dict(e)
        m["pid"] = layout.remap_pid(m.get("pid"))
        if m.get("tid") == tpl.cpu_pid:
            m["tid"] = layout.pid
        if "ts" in m:
            m["ts"] = 0.0
        events.append(m)
    events += [
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": layout.pid, "tid": layout.launcher_tid,
         "args": {"name": "graph launcher"}},
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": layout.device, "tid": GRAPH_STREAM,
         "args": {"name": f"stream {GRAPH_STREAM}"}},
    ]
    return events


def _template_events(plan: SetPlan, layout: RankLayout, mine: dict[str, Group]) -> tuple[list[dict], list[RecordedCollective]]:
    """The template's events in this rank's clock and ids: its NCCL kernels become eager collectives
    (kernel keys and a recorded call each, arrivals jittered), its own graph kernels get graph ids."""
    tpl = plan.template
    nccl_at = {i: (role, jitter, k) for k, (i, role, jitter) in enumerate(tpl.nccl)}
    events: list[dict] = []
    eager: list[RecordedCollective] = []
    for i, src in enumerate(tpl.events):
        e = dict(src)
        if "ts" in e:
            e["ts"] = round(e["ts"] + layout.offset_us, 3)
        if "pid" in e:
            e["pid"] = layout.remap_pid(e["pid"])
        if e.get("tid") == tpl.cpu_pid:
            e["tid"] = layout.pid
        if i in nccl_at:
            role, limit, k = nccl_at[i]
            op, dtype = kernel_op(e["name"])
            ann = annotation(op, dtype, 1 << (10 + k % 12), mine[role], layout.rank, plan.eager_seq[k])
            late = _jitter(plan.seed, layout.rank, k, limit)
            e["ts"] = round(e["ts"] - limit + late, 3)
            e["dur"] = round(float(e.get("dur", 0.0)) + limit - late, 3)
            e["args"] = _kernel_args(e, ann, layout.device)
            eager.append(_recorded(ann, tpl, e, layout.offset_us, layout.pid))
        elif i in tpl.template_graph_nodes:
            graph, node = tpl.template_graph_nodes[i]
            args = dict(e["args"])
            args[GRAPH_ID_KEY] = graph
            args[GRAPH_NODE_ID_KEY] = _node_id(graph, node, plan.node_id_format)
            e["args"] = args
        elif is_gpu(e) and "device" in e.get("args", {}):
            e["args"] = {**e["args"], "device": layout.device}
        events.append(e)
    return events, eager


def _rank_trace(plan: SetPlan, layout: RankLayout, mine: dict[str, Group], events: list[dict]) -> dict:
    """The Kineto trace around ``events``: the template's top-level fields, this rank's distributedInfo."""
    dist = {
        "backend": "nccl",
        "rank": layout.rank,
        "world_size": plan.world,
        "pg_count": len(mine),
        "pg_config": [
            {"pg_name": g.name, "pg_desc": g.desc, "backend_config": "cuda:nccl",
             "pg_size": len(g.ranks), "ranks": list(g.ranks)}
            for g in sorted(mine.values(), key=lambda g: int(g.name))
        ],
        "nccl_version": NCCL_VERSION,
    }
    trace = {k: v for k, v in plan.template.top.items() if k not in ("traceName", "trace_id", "distributedInfo")}
    trace.update(
        {
            "distributedInfo": dist,
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_TIME_NS,
            "traceName": layout.trace_name,
            "traceEvents": events,
        }
    )
    return trace


def _rank_sidecar(plan: SetPlan, layout: RankLayout, mine: dict[str, Group], eager: list[RecordedCollective],
                  captures: list[GraphCapture]) -> Sidecar:
    """The sidecar commtag's trace handler would have written beside the rank's trace."""
    return Sidecar(
        run_id=f"scaleset-{plan.world}-{plan.seed}",
        rank=layout.rank,
        world_size=plan.world,
        host=f"node{layout.rank // plan.ranks_per_node:03d}",
        pid=layout.pid,
        torch_version=TORCH_VERSION,
        nccl_version=NCCL_VERSION,
        trace_file=layout.trace_name,
        process_groups=[
            ProcessGroupInfo(uid=g.uid, name=g.name, desc=g.desc, ranks=list(g.ranks), backend="nccl",
                             lane_id=g.lane_id, lane_name=g.lane_name)
            for g in sorted(mine.values(), key=lambda g: int(g.name))
        ],
        collectives=eager,
        captures=captures,
    )


def _node_id(graph: int, node: int, form: str) -> int:
    return (graph << TOOLS_ID_GRAPH_SHIFT) | node if form == "full" else node


def _kernel_args(kernel: dict, ann: CollectiveAnnotation, device: int) -> dict:
    args = dict(kernel.get("args", {}))
    args["device"] = device
    eager = ann.eager_dict()
    for key in KERNEL_EAGER_KEYS:  # in the order the profiler copies them onto the kernel
        if key in eager:
            args[key] = eager[key]
    return args


def _ns(ts_us: float) -> int:
    return BASE_TIME_NS + round(ts_us * 1000)


def _recorded(ann: CollectiveAnnotation, tpl: Template, kernel: dict, offset: float, pid: int) -> RecordedCollective:
    """The Python-side call around the kernel's launch (or just before the kernel)."""
    launch_at = tpl.launches.get(kernel["args"].get(CORRELATION_KEY))
    if launch_at is not None:
        launch = tpl.events[launch_at]
        start = launch["ts"] + offset - 6.0
        end = launch["ts"] + offset + float(launch.get("dur", 0.0)) + 4.0
        tid = pid if launch.get("tid") == tpl.cpu_pid else launch.get("tid", pid)
    else:
        start, end, tid = kernel["ts"] - 30.0, kernel["ts"] - 5.0, pid
    return RecordedCollective(annotation=ann, start_ns=_ns(start), end_ns=_ns(end), tid=int(tid))


def _captures(plan: SetPlan, rank: int, mine: dict[str, Group]) -> list[GraphCapture]:
    seqs = capture_seqs()
    captures = []
    for spec in GRAPHS:
        collectives = []
        for node, kind in enumerate(spec.nodes):
            if not isinstance(kind, tuple):
                continue
            role, op, dtype = kind
            ann = annotation(op, dtype, 1 << 20, mine[role], rank, seqs[(spec.capture_id, node)][1], spec.capture_id)
            collectives.append(
                CapturedCollective(
                    annotation=ann,
                    nodes=[GraphNodeRecord(index=node, node_type=KERNEL_NODE_TYPE, kernel_name=NCCL_KERNEL_OF[op])],
                    reduce_op=None if op == "_allgather_base" else "sum",
                )
            )
        replays = [
            GraphReplay(
                index=WARMUP_REPLAYS + k,
                start_ns=_ns(launch - 4.0 + plan.clock_offset_us[rank]),
                end_ns=_ns(launch + 12.0 + plan.clock_offset_us[rank]),
                tid=_launcher_tid(rank),
            )
            for k, launch in enumerate(_launch_times(plan, spec.capture_id))
        ]
        start = _ns(-2_000_000.0 + 50_000.0 * spec.capture_id + plan.clock_offset_us[rank])
        captures.append(
            GraphCapture(
                capture_id=spec.capture_id,
                graph_id=spec.graph_id,
                exec_graph_id=spec.exec_graph_id,
                start_ns=start,
                end_ns=start + 20_000_000,
                total_nodes=len(spec.nodes),
                collectives=collectives,
                replays=replays,
            )
        )
    return captures


def _launch_times(plan: SetPlan, capture_id: int) -> list[float]:
    """True-time ts (µs) of every cudaGraphLaunch of one graph."""
    return [when - LAUNCH_LEAD_US for when, g in plan.replay_times if GRAPHS[g].capture_id == capture_id]


def _replays(
    plan: SetPlan, rank: int, mine: dict[str, Group], pid: int, device: int, launcher_tid: int, offset: float
) -> Iterator[dict]:
    """Launch, flow and replayed kernels of every graph replay, in this rank's clock."""
    corr_base = plan.template.id_ceiling
    for j, (when, g) in enumerate(plan.replay_times):
        spec = GRAPHS[g]
        corr = corr_base + j
        launch_ts = round(when + offset - LAUNCH_LEAD_US, 3)
        yield {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": pid, "tid": launcher_tid,
               "ts": launch_ts, "dur": 8.0, "args": {EXTERNAL_ID_KEY: corr, CBID_KEY: CUDA_GRAPH_LAUNCH_CBID, CORRELATION_KEY: corr}}
        yield {"ph": "s", "id": corr, "pid": pid, "tid": launcher_tid, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"}
        t = when
        for node, kind in enumerate(spec.nodes):
            if isinstance(kind, tuple):
                role, op, _ = kind
                start = t + _jitter(plan.seed, rank, 1_000_000 + j * 16 + node, MAX_JITTER_US)
                end = t + MAX_JITTER_US + 35.0
                name = NCCL_KERNEL_OF[op]
            else:
                name, dur = COMPUTE_NODES[kind]
                start, end = t, t + dur
            kernel = {"ph": "X", "cat": KERNEL_CATEGORY, "name": name, "pid": device, "tid": GRAPH_STREAM,
                      "ts": round(start + offset, 3), "dur": round(end - start, 3),
                      "args": {EXTERNAL_ID_KEY: corr, "device": device, "stream": GRAPH_STREAM,
                               CORRELATION_KEY: corr, GRAPH_ID_KEY: spec.exec_graph_id,
                               GRAPH_NODE_ID_KEY: _node_id(spec.exec_graph_id, node, plan.node_id_format)}}
            if node == 0:
                yield {"ph": "f", "id": corr, "pid": device, "tid": GRAPH_STREAM, "ts": kernel["ts"],
                       "cat": "ac2g", "name": "ac2g", "bp": "e"}
            yield kernel
            t = end + 1.0
