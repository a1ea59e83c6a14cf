"""Build an N-rank scale set (Kineto traces + commtag sidecars) from a public single-rank trace.

Why: nobody here has a 128-rank GPU job, yet the merge must be measured on one.
Every rank is a clone of the same window of a real Kineto trace (SPMD), so the
background is real data; on top of it this adds what a commtag-instrumented job
would contain:

* ``distributedInfo`` with a ``pg_config`` of several process groups
  (default, tensor-parallel blocks of ``--tp`` ranks, data-parallel strides);
* the template's own NCCL kernels as eager collectives: eager metadata on the
  kernel (as the profiler writes it) and a recorded call in the sidecar;
* CUDA-graph replays: a ``cudaGraphLaunch`` on a launcher thread and the
  replayed kernels (compute and NCCL) carrying ``"graph id"``/``"graph node
  id"``, and the matching :class:`~commtag.schema.GraphCapture` records;
* the template's own ``cudaGraphLaunch`` kernels (graphs without
  collectives) get graph ids too, as Kineto writes them;
* a per-node clock offset and per-rank arrival jitter; collectives end
  together in true time, as they do on real hardware.

Usage: ``python -m commtag.testing.scaleset --ranks 32 -o /tmp/commtag-scale-32`` (or
``python launch/gen_scaleset.py ...``); tests and ``launch/bench_merge.py`` call it so, and
``launch/bench_scale.py`` with ``--ranks 1024 --tp 8 --ranks-per-node 8``.
The ground truth (clock offsets, counts) goes to ``scaleset.manifest.json``.
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

import orjson

from commtag import identity
from commtag.atomic import write_atomic
from commtag.constants import SIDECAR_SUFFIX, TRACE_SUFFIX
from commtag.runtime.record.sidecar import dumps, sidecar_name, trace_name
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
from commtag.testing import PUBLIC_TRACES
from commtag.vocab import (
    CBID_KEY, CORRELATION_KEY, CUDA_GRAPH_LAUNCH_CBID, DEVICE_WORK_NODE_TYPES, EXTERNAL_ID_KEY, GRAPH_ID_KEY, GRAPH_NODE_ID_KEY,
    KERNEL_CATEGORY, KERNEL_EAGER_KEYS, KERNEL_NODE_TYPE, KINETO_ID_ARGS, LAUNCH_CATEGORIES, TOOLS_ID_GRAPH_SHIFT,
    is_graph_launch, nccl_kind, parse_nccl_kernel,
)

TEMPLATE_DIR = PUBLIC_TRACES / "single-rank-scale"
TEMPLATES = {
    "v100": "hta_v100_df_index_resolver.json.gz",
    "a100": "hta_a100_rank0_of16.json.gz",
    "mi300": "tracelens_mi300_xdit_sd35.json.gz",
}
MANIFEST_NAME = "scaleset.manifest.json"
#: Bumped whenever the generated content changes, so benchmarks regenerate stale sets.
GENERATOR_VERSION = 4
#: realtime ns of ts == 0 on every rank (floored, as Kineto's baseTimeNanoseconds is).
BASE_TIME_NS = 1_767_000_000_000_000_000
TORCH_VERSION = "2.13.0"
NCCL_VERSION = "2.27.5"
GRAPH_STREAM = 4242
LAUNCHER_TID_OFFSET = 1_000_000
#: cudaGraphLaunch precedes its first kernel by this much, µs.
LAUNCH_LEAD_US = 30.0
#: Share of a rank's events that graph replays add.
GRAPH_FRACTION = 0.05
#: Replays of each graph before the profiler started (warm-up), so replay indices do not start at 0.
WARMUP_REPLAYS = 3
#: Largest arrival skew between members of a collective, µs.
MAX_JITTER_US = 40.0
#: Clock error between nodes, µs.
MAX_CLOCK_OFFSET_US = 500.0
#: The window starts this late after baseTimeNanoseconds, so no clock offset makes a ts negative
#: (Kineto floors its base below the first event: ts is never negative).
LEAD_IN_US = 2 * MAX_CLOCK_OFFSET_US
#: Default GPUs per node: 4, so even the 8-rank set spans hosts whose clocks differ.
RANKS_PER_NODE = 4
#: The profiler step the traces claim to come from (file names: commtag.trace_handler's scheme).
STEP = 10


# --------------------------------------------------------------------------- groups


@dataclass(frozen=True)
class Group:
    """One process group of the synthetic job."""

    role: str
    name: str
    desc: str
    #: Always an arithmetic progression here, so the profiler lists them.
    ranks: tuple[int, ...]

    @property
    def uid(self) -> str:
        return identity.group_uid(self.name, self.ranks)

    @property
    def lane_id(self) -> int:
        return identity.lane_id(self.uid)

    @property
    def lane_name(self) -> str:
        return identity.lane_name(self.name, self.desc, self.ranks)

    def ranks_text(self) -> str:
        return identity.format_list(self.ranks)


def default_tp(world: int) -> int:
    """Tensor-parallel width when none is asked: 4 from 8 ranks up, else half the world."""
    return 4 if world >= 8 else max(1, world // 2)


def build_groups(world: int, tp: Optional[int] = None) -> list[Group]:
    """default_pg, then tp blocks of ``tp`` ranks, then dp strides, named in creation order as c10d does."""
    tp = default_tp(world) if tp is None else tp
    if tp < 1 or world % tp:
        raise ValueError(f"--tp {tp} must divide the world size {world}")
    members = [("default", "default_pg", tuple(range(world)))]
    members += [("tp", "tp", tuple(range(b * tp, (b + 1) * tp))) for b in range(world // tp)]
    members += [("dp", "dp", tuple(range(o, world, tp))) for o in range(tp)]
    return [Group(role, str(n), desc, ranks) for n, (role, desc, ranks) in enumerate(members)]


def groups_of(rank: int, groups: Sequence[Group]) -> dict[str, Group]:
    """The group of each role that ``rank`` belongs to."""
    return {g.role: g for g in groups if rank in g.ranks}


# --------------------------------------------------------------------------- template


@dataclass
class Template:
    """A window of template events, rebased to ts 0, and where its collectives are."""

    name: str
    top: dict
    meta: list[dict]
    events: list[dict]
    span_us: float
    cpu_pid: int
    gpu_pid: int
    #: Indices into ``events`` of NCCL kernels, with their role and max jitter.
    nccl: list[tuple[int, str, float]]
    #: correlation -> index of the cuda_runtime launch event.
    launches: dict[int, int]
    #: Index of a template graph-replayed GPU event -> (graph id, node index).
    template_graph_nodes: dict[int, tuple[int, int]]
    id_ceiling: int


def _is_gpu(event: dict) -> bool:
    return event.get("cat") in DEVICE_WORK_NODE_TYPES


def _ts(event: dict) -> float:
    return float(event.get("ts", 0.0))


def load_template(path: Path, per_rank_events: int) -> Template:
    """Take the first ``per_rank_events`` events by time, tiling the template if it is shorter."""
    top = orjson.loads(gzip.decompress(path.read_bytes()))
    raw = top.pop("traceEvents")
    meta = [e for e in raw if e.get("ph") == "M"]
    body = sorted((e for e in raw if e.get("ph") != "M"), key=_ts)
    del raw
    if not body:
        raise ValueError(f"{path}: template has no events")
    id_ceiling = 1 + max(
        (int(v) for e in body for k, v in e.get("args", {}).items() if k in KINETO_ID_ARGS and isinstance(v, int)),
        default=0,
    )
    id_ceiling = max(id_ceiling, 1 + max((int(e["id"]) for e in body if isinstance(e.get("id"), int)), default=0))
    stride = 10 ** len(str(id_ceiling))
    if per_rank_events < len(body):
        body = _densest_window(body, per_rank_events)
    t0 = _ts(body[0])
    span = max(_ts(e) + float(e.get("dur", 0.0)) for e in body) - t0
    events: list[dict] = []
    tile = 0
    while len(events) < per_rank_events:
        shift = tile * (span + 1000.0)
        for event in body:
            if len(events) == per_rank_events:
                break
            events.append(_rebase(event, shift - t0 + LEAD_IN_US, tile * stride))
        tile += 1
    gpu_counts: dict[int, int] = {}
    cpu_counts: dict[int, int] = {}
    for e in events:
        if "pid" in e:
            target = gpu_counts if _is_gpu(e) else cpu_counts
            target[e["pid"]] = target.get(e["pid"], 0) + 1
    gpu_pid = max(gpu_counts, key=gpu_counts.get) if gpu_counts else 0
    cpu_pid = max(cpu_counts, key=cpu_counts.get)
    window_end = max(_ts(e) + float(e.get("dur", 0.0)) for e in events)
    launches = {
        e["args"][CORRELATION_KEY]: i
        for i, e in enumerate(events)
        if e.get("cat") in LAUNCH_CATEGORIES and CORRELATION_KEY in e.get("args", {})
    }
    return Template(
        name=path.name,
        top=top,
        meta=meta,
        events=events,
        span_us=window_end,
        cpu_pid=cpu_pid,
        gpu_pid=gpu_pid,
        nccl=_find_nccl(events),
        launches=launches,
        template_graph_nodes=_template_graph_nodes(events, launches),
        id_ceiling=stride * tile,
    )


def _is_nccl(event: dict) -> bool:
    return event.get("cat") == KERNEL_CATEGORY and nccl_kind(event.get("name", "")) is not None


def _densest_window(body: list[dict], size: int) -> list[dict]:
    """The ``size`` consecutive events (by time) holding the most NCCL kernels: a busy training step."""
    flags = [_is_nccl(e) for e in body]
    best_start, best = 0, sum(flags[:size])
    count = best
    for start in range(1, len(body) - size + 1):
        count += flags[start + size - 1] - flags[start - 1]
        if count > best:
            best_start, best = start, count
    return body[best_start : best_start + size]


def _rebase(event: dict, shift: float, id_offset: int) -> dict:
    out = dict(event)
    if "ts" in out:
        out["ts"] = round(_ts(out) + shift, 3)
    if id_offset:
        if isinstance(out.get("id"), int):
            out["id"] += id_offset
        args = out.get("args")
        if args and any(k in args for k in KINETO_ID_ARGS):
            args = dict(args)
            for key in KINETO_ID_ARGS:
                if isinstance(args.get(key), int) and args[key] >= 0:
                    args[key] += id_offset
            out["args"] = args
    return out


def _find_nccl(events: list[dict]) -> list[tuple[int, str, float]]:
    """NCCL kernels, their role (one role per NCCL stream) and how early each may start."""
    last_end: dict[int, float] = {}
    found: list[tuple[int, int, float]] = []
    for i, e in enumerate(events):
        if not _is_gpu(e):
            continue
        stream = e.get("args", {}).get("stream", e.get("tid"))
        if _is_nccl(e):
            gap = _ts(e) - last_end.get(stream, _ts(e) - MAX_JITTER_US)
            found.append((i, stream, max(0.0, min(MAX_JITTER_US, 0.9 * gap))))
        last_end[stream] = max(last_end.get(stream, 0.0), _ts(e) + float(e.get("dur", 0.0)))
    roles = ("default", "tp", "dp")
    streams = sorted({s for _, s, _ in found})
    role_of = {s: roles[k % len(roles)] for k, s in enumerate(streams)}
    return [(i, role_of[s], jitter) for i, s, jitter in found]


def _template_graph_nodes(events: list[dict], launches: dict[int, int]) -> dict[int, tuple[int, int]]:
    """GPU events launched by the template's own cudaGraphLaunch: one graph per kernel-name sequence."""
    graph_corrs = {c for c, i in launches.items() if is_graph_launch(events[i]["name"])}
    by_corr: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        if _is_gpu(e) and e.get("args", {}).get(CORRELATION_KEY) in graph_corrs:
            by_corr.setdefault(e["args"][CORRELATION_KEY], []).append(i)
    graph_ids: dict[tuple[str, ...], int] = {}
    nodes: dict[int, tuple[int, int]] = {}
    for indices in by_corr.values():
        signature = tuple(events[i]["name"] for i in indices)
        graph = graph_ids.setdefault(signature, 100 + len(graph_ids))
        for node, i in enumerate(indices):
            nodes[i] = (graph, node)
    return nodes


# --------------------------------------------------------------------------- collectives


#: The eager call a template's NCCL kernel stands for, by the kernel's collective (vocab's
#: parse_nccl_kernel); any other kernel stands for an allreduce.
_EAGER_OP_OF_KERNEL = {
    "AllReduce": "allreduce", "AllGather": "_allgather_base", "ReduceScatter": "_reduce_scatter_base",
    "Broadcast": "broadcast", "SendRecv": "all_to_allv",
}


def kernel_op(kernel: str) -> tuple[str, str]:
    """Collective name and dtype an NCCL kernel name implies (Float where the name gives no data type)."""
    parsed = parse_nccl_kernel(kernel)
    op = _EAGER_OP_OF_KERNEL.get(parsed.collective if parsed else "", "allreduce")
    return op, (parsed.dtype if parsed and parsed.dtype else "Float")


def annotation(
    op: str, dtype: str, nelems: int, group: Group, rank: int, seq: int, capture_id: Optional[int] = None
) -> CollectiveAnnotation:
    """The annotation commtag's recorder would write for this call."""
    size = len(group.ranks)
    in_n, out_n = nelems, nelems
    if op == "_allgather_base":
        out_n = nelems * size
    elif op == "_reduce_scatter_base":
        in_n = nelems * size
    return CollectiveAnnotation(
        collective_name=op, in_msg_nelems=in_n, out_msg_nelems=out_n, group_size=size, dtype=dtype,
        global_rank_start=group.ranks[0],
        global_rank_stride=(group.ranks[1] - group.ranks[0]) if size > 1 else None,
        pg_name=group.name, pg_desc=group.desc, pg_ranks=group.ranks_text(), rank=group.ranks.index(rank), seq=seq,
        lane_id=group.lane_id, lane_name=group.lane_name, pg_uid=group.uid, capture_id=capture_id,
    )




@dataclass(frozen=True)
class GraphSpec:
    """A captured graph: node kinds in capture order; an entry (role, op, dtype) is a collective."""

    capture_id: int
    graph_id: int
    exec_graph_id: int
    nodes: tuple[object, ...]


_COMPUTE_NODES = (
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>", 18.0),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", 55.0),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", 12.0),
)
#: The NCCL kernel each captured collective replays as (names as NCCL 2.19+ writes them; their
#: collective is the one vocab.COLLECTIVES gives the op, tests/test_scaleset.py checks it).
NCCL_KERNEL_OF = {
    "allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "_allgather_base": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "_reduce_scatter_base": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
}
GRAPHS = (
    GraphSpec(0, 11, 21, (0, 1, ("tp", "allreduce", "BFloat16"), 2, ("dp", "_reduce_scatter_base", "BFloat16"))),
    GraphSpec(1, 12, 22, (1, ("dp", "_allgather_base", "BFloat16"), 0)),
)


def _capture_seqs() -> dict[tuple[int, int], tuple[str, int]]:
    """(capture, node) -> (role, capture-time Seq): captures run before any eager call."""
    counters: dict[str, int] = {}
    seqs = {}
    for spec in GRAPHS:
        for node, kind in enumerate(spec.nodes):
            if isinstance(kind, tuple):
                counters[kind[0]] = counters.get(kind[0], 0) + 1
                seqs[(spec.capture_id, node)] = (kind[0], counters[kind[0]])
    return seqs


# --------------------------------------------------------------------------- per rank


@dataclass
class SetPlan:
    """Everything shared by all ranks of one set."""

    world: int
    template: Template
    groups: list[Group]
    clock_offset_us: list[float]
    replay_times: list[tuple[float, int]]
    seed: int
    node_id_format: str
    ranks_per_node: int
    eager_seq: list[int] = field(default_factory=list)


def replay_budget(per_rank_events: int, graph_fraction: float) -> tuple[int, int]:
    """How many graph replays a rank gets, and how many trace events they add."""
    events_per_replay = 3 + sum(len(g.nodes) for g in GRAPHS) / len(GRAPHS)
    replays = max(2 * len(GRAPHS), round(graph_fraction * per_rank_events / events_per_replay))
    return replays, sum(3 + len(GRAPHS[j % len(GRAPHS)].nodes) for j in range(replays))


def plan_set(
    world: int, template: Template, seed: int, replays: int, node_id_format: str, ranks_per_node: int,
    tp: Optional[int] = None,
) -> SetPlan:
    rng = random.Random(seed)
    nodes = math.ceil(world / ranks_per_node)
    node_offsets = [rng.uniform(-MAX_CLOCK_OFFSET_US, MAX_CLOCK_OFFSET_US) for _ in range(nodes)]
    step = (template.span_us - LEAD_IN_US) / (replays + 1)
    replay_times = [(round(LEAD_IN_US + step * (j + 1), 3), j % len(GRAPHS)) for j in range(replays)]
    base = {role: 0 for role in ("default", "tp", "dp")}
    for role, seq in _capture_seqs().values():
        base[role] = max(base[role], seq)
    eager_seq = []
    for _, role, _ in template.nccl:
        base[role] += 1
        eager_seq.append(base[role])
    return SetPlan(
        world=world,
        template=template,
        groups=build_groups(world, tp),
        clock_offset_us=[node_offsets[r // ranks_per_node] for r in range(world)],
        replay_times=replay_times,
        seed=seed,
        node_id_format=node_id_format,
        ranks_per_node=ranks_per_node,
        eager_seq=eager_seq,
    )


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
        elif _is_gpu(e) and "device" in e.get("args", {}):
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
    seqs = _capture_seqs()
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
                name, dur = _COMPUTE_NODES[kind]
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


# --------------------------------------------------------------------------- writing


@dataclass
class SetSummary:
    """What was written, for the manifest and the benchmark."""

    out_dir: str
    generator_version: int
    #: The arguments it was made with: a later run with the same ones may reuse it.
    requested: dict
    ranks: int
    template: str
    events: int
    json_bytes: int
    gz_bytes: int
    largest_rank_json_bytes: int
    collectives_per_rank: int
    replays_per_rank: int
    captures_per_rank: int
    clock_offset_us: list[float]
    #: role -> [number of groups, ranks in each]: what the job's pg_configs hold together.
    process_groups: dict[str, list[int]]
    #: role -> collective calls each rank makes in its group of that role (eager ones and those inside
    #: graph replays); their sum is the rank's lane slices.
    collective_calls_per_rank: dict[str, int]


def requested_args(total_events: int, template: str, seed: int, graph_fraction: float, node_id_format: str,
                   ranks_per_node: int, tp: Optional[int]) -> dict:
    """The arguments a set is made with, as its manifest keeps them (``tp`` only when asked, so sets made
    before the option existed are still reused)."""
    requested = {"events": total_events, "template": template, "seed": seed, "graph_fraction": graph_fraction,
                 "node_id_format": node_id_format, "ranks_per_node": ranks_per_node}
    if tp is not None:
        requested["tp"] = tp
    return requested


def calls_by_role(plan: SetPlan) -> dict[str, int]:
    """Collective calls of one rank per group role: the template's eager ones, then those of every replay."""
    calls = {role: 0 for role in ("default", "tp", "dp")}
    for _, role, _ in plan.template.nccl:
        calls[role] += 1
    for _, graph in plan.replay_times:
        for kind in GRAPHS[graph].nodes:
            if isinstance(kind, tuple):
                calls[kind[0]] += 1
    return calls


def generate(
    out_dir: Path,
    ranks: int,
    total_events: int = 1_000_000,
    template: str = "v100",
    seed: int = 0,
    graph_fraction: float = GRAPH_FRACTION,
    node_id_format: str = "low",
    ranks_per_node: int = RANKS_PER_NODE,
    compresslevel: int = 6,
    progress: bool = False,
    tp: Optional[int] = None,
) -> SetSummary:
    """Write ``ranks`` traces and sidecars with at least ``total_events`` events in all; ``tp`` ranks per
    tensor-parallel group (default :func:`default_tp`), ``ranks / tp`` per data-parallel group."""
    if ranks < 2:
        raise ValueError("a scale set needs at least 2 ranks")
    build_groups(ranks, tp)  # a tp that does not divide the world is refused before anything is written
    path = TEMPLATE_DIR / TEMPLATES.get(template, template)
    if not path.is_file():
        raise FileNotFoundError(f"template {path} not found (known: {', '.join(TEMPLATES)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [p for p in out_dir.iterdir() if p.name.endswith((TRACE_SUFFIX, SIDECAR_SUFFIX))]
    if stale and not (out_dir / MANIFEST_NAME).is_file():
        raise ValueError(f"{out_dir} holds traces that are not a generated scale set; choose another directory")
    for old in stale:  # an earlier generated set: its ranks must not mix with the new ones
        old.unlink()
    requested = requested_args(total_events, template, seed, graph_fraction, node_id_format, ranks_per_node, tp)
    per_rank = math.ceil(total_events / ranks)
    replays, added = replay_budget(per_rank, graph_fraction)
    template_window = load_template(path, max(100, per_rank - added))
    plan = plan_set(ranks, template_window, seed, replays, node_id_format, ranks_per_node, tp)
    events = json_bytes = gz_bytes = largest = 0
    for rank in range(ranks):
        trace, sidecar, count = build_rank(plan, rank)
        raw = orjson.dumps(trace)
        packed = gzip.compress(raw, compresslevel=compresslevel)
        write_atomic(out_dir / sidecar.trace_file, packed)
        write_atomic(out_dir / sidecar_name(rank, STEP), dumps(sidecar))
        events += count
        json_bytes += len(raw)
        gz_bytes += len(packed)
        largest = max(largest, len(raw))
        if progress:
            print(f"\r{out_dir}: rank {rank + 1}/{ranks}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    summary = SetSummary(
        out_dir=str(out_dir),
        generator_version=GENERATOR_VERSION,
        requested=requested,
        ranks=ranks,
        template=path.name,
        events=events,
        json_bytes=json_bytes,
        gz_bytes=gz_bytes,
        largest_rank_json_bytes=largest,
        collectives_per_rank=len(plan.template.nccl),
        replays_per_rank=len(plan.replay_times),
        captures_per_rank=len(GRAPHS),
        clock_offset_us=[round(x, 3) for x in plan.clock_offset_us],
        process_groups=_group_counts(plan.groups),
        collective_calls_per_rank=calls_by_role(plan),
    )
    write_atomic(out_dir / MANIFEST_NAME, orjson.dumps(summary.__dict__, option=orjson.OPT_INDENT_2))
    return summary


def _group_counts(groups: Sequence[Group]) -> dict[str, list[int]]:
    counts: dict[str, list[int]] = {}
    for g in groups:
        counts.setdefault(g.role, [0, len(g.ranks)])[0] += 1
    return counts


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="world size N (default 8)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events in all ranks together (default 1M)")
    parser.add_argument("--template", default="v100", help=f"one of {', '.join(TEMPLATES)} or a file name")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--node-id-format", choices=("low", "full"), default="low",
                        help="'graph node id' as the node index or as (graph id << 32) | index")
    parser.add_argument("--ranks-per-node", type=int, default=RANKS_PER_NODE,
                        help="ranks sharing a host clock (default %(default)s)")
    parser.add_argument("--tp", type=int, default=None,
                        help="ranks per tensor-parallel group, a divisor of --ranks; the data-parallel groups "
                             "take one rank of each (default: 4 from 8 ranks up, else half the world)")
    parser.add_argument("-o", "--out", type=Path, default=None, help="output directory (default /tmp/commtag-scale-N)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the set already in the directory if it was made with the same arguments")
    args = parser.parse_args(argv)
    out = args.out or Path(f"/tmp/commtag-scale-{args.ranks}")
    if args.reuse and (out / MANIFEST_NAME).is_file():
        manifest = orjson.loads((out / MANIFEST_NAME).read_bytes())
        wanted = requested_args(args.events, args.template, args.seed, GRAPH_FRACTION, args.node_id_format,
                                args.ranks_per_node, args.tp)
        if (manifest.get("generator_version"), manifest.get("ranks"), manifest.get("requested")) == (
            GENERATOR_VERSION, args.ranks, wanted
        ):
            print(orjson.dumps(manifest).decode())
            return 0
    try:
        summary = generate(out, args.ranks, args.events, args.template, args.seed,
                           node_id_format=args.node_id_format, ranks_per_node=args.ranks_per_node,
                           progress=sys.stderr.isatty(), tp=args.tp)
    except (ValueError, FileNotFoundError) as error:
        print(f"gen_scaleset: {error}", file=sys.stderr)
        return 2
    print(orjson.dumps(summary.__dict__).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
