"""What every rank of a scale set shares: the job's constants, its process groups, its collectives and
graphs, and the plan (clock offsets, replay times, eager Seqs) made from one seed."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from commtag import identity
from commtag.schema import CollectiveAnnotation
from commtag.testing.scale.template import LEAD_IN_US, MAX_CLOCK_OFFSET_US, Template
from commtag.vocab import parse_nccl_kernel

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
    """A captured graph: node kinds in capture order; an entry (role, op, dtype) is a collective,
    an int an index into COMPUTE_NODES."""

    capture_id: int
    graph_id: int
    exec_graph_id: int
    nodes: tuple[Union[int, tuple[str, str, str]], ...]


COMPUTE_NODES = (
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


def capture_seqs() -> dict[tuple[int, int], tuple[str, int]]:
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
    for role, seq in capture_seqs().values():
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
