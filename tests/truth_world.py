"""A seeded random collective workload on 4 gloo ranks that writes down what it called.

Every rank draws the same global plan from one seed and runs it in order,
skipping the steps it is not a member of. A blocking call's members all
reach it (every earlier step has finished on each of them), so no seed can
deadlock; async works are waited later in the same profiler step, in a
random order. The plan covers every op commtag patches on gloo, sync and
async, several process groups (overlapping ones among them), uneven
all_to_all splits, p2p in both directions, several profiler windows and,
in most seeds, one re-init of the world (destroy_process_group, then
init_process_group and the subgroups again) between two windows.

The ground truth is computed here from what was called, following the
reference table (docs/eager-metadata.md), not from
commtag: the annotation keys each call should carry, with the Seq, p2p Seq
and pair Seq counted per group. Each call's first input also has a size no
other call of the plan has (its *marker*), so with ``record_shapes`` the
c10d op and the gloo events of a call show, in their "Input Dims", which
call they belong to.

Output per rank: ``truth{R}.json``, one entry per call (``window``: the
profiler step, ``recorded``: whether that step was recorded, ``life``: how
many re-inits came before it).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

from commtag.atomic import write_atomic

WORLD = 4
#: Candidate subgroups (besides the world); a plan creates a random subset, overlapping ones included.
SUBGROUPS = ([0, 1], [2, 3], [1, 2], [0, 2, 3], [1, 3], [0, 1, 2, 3], [0, 3], [1, 2, 3])
#: op -> may it be issued with async_op=True.
COLLECTIVES = {
    "all_reduce": True, "broadcast": True, "reduce": True, "all_gather": True,
    "all_gather_into_tensor": True, "reduce_scatter": True, "reduce_scatter_tensor": True,
    "all_to_all_single": True, "all_to_all": True, "gather": True, "scatter": True, "barrier": True,
    "all_reduce_coalesced": True, "coalescing_manager": False,
}
#: dtype name -> the c10 name the profiler prints.
DTYPES = {"float32": "Float", "float64": "Double", "int32": "Int", "int64": "Long", "bfloat16": "BFloat16"}
#: Reducing ops draw plain float and int dtypes (bfloat16 elsewhere: gloo's bfloat16 sums are not needed here).
_REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced",
             "coalescing_manager")
WAIT, WARMUP, ACTIVE = 1, 1, 2
#: Where the seeds that move with each commit are drawn from (past the fixed and soak seeds).
MOVING_SEEDS_FROM, MOVING_SEEDS_SPAN = 15, 10_000
#: How many seeds each commit picks.
MOVING_SEED_COUNT = 2


def moving_seeds(count: int = MOVING_SEED_COUNT) -> tuple[int, ...]:
    """``count`` consecutive seeds the checked-out commit picks: each commit tries other plans,
    and a failure repeats on its commit. ``COMMTAG_TRUTH_SEEDS="27,33"`` names them instead."""
    named = os.environ.get("COMMTAG_TRUTH_SEEDS", "").strip()
    if named:
        return tuple(int(seed) for seed in named.split(","))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                                capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""  # not a checkout: the same seeds every time
    first = MOVING_SEEDS_FROM + int(hashlib.sha256(commit.encode()).hexdigest(), 16) % MOVING_SEEDS_SPAN
    return tuple(range(first, first + count))


@dataclass
class Step:
    """One action of the global plan (the same object on every rank)."""

    kind: str  # an op of COLLECTIVES, "send_recv", "batch_p2p" or "wait"
    group: int = 0  # index into the plan's groups (0: the world)
    op_id: int = 0
    async_op: bool = False
    dtype: str = "float32"
    root: int = 0  # group rank of the root (rooted ops)
    src: int = 0  # global ranks of a p2p pair
    dst: int = 0
    any_source: bool = False
    #: all_to_all_single: elements group rank i sends to group rank j.
    splits: list[list[int]] = field(default_factory=list)
    waits: int = -1  # "wait": the op_id whose work is waited


@dataclass
class Plan:
    """A seed's groups (0: the world) and its steps, one list per profiler step."""

    groups: list[list[int]]
    windows: list[list[Step]]
    #: Windows before which every rank destroys the world and inits it again (new groups, Seq from 1).
    reinit_before: frozenset[int] = frozenset()


def marker(op_id: int) -> int:
    """The element count only this op's first input has (divisible by every group size)."""
    return 12 * (op_id + 2)


def make_plan(seed: int, windows: int, ops_per_window: int) -> Plan:
    """The global plan of a seed: the same on every rank."""
    rng = random.Random(seed)
    groups = [list(range(WORLD))] + [list(g) for g in rng.sample(SUBGROUPS, rng.randint(3, 5))]
    op_id = 0
    out = []
    for _ in range(windows):
        steps: list[Step] = []
        pending: list[int] = []
        for _ in range(ops_per_window):
            op_id += 1
            g = rng.randrange(len(groups))
            members = groups[g]
            roll = rng.random()
            if roll < 0.12 and len(members) >= 2:
                a, b = rng.sample(members, 2)
                steps.append(Step("send_recv", g, op_id, dtype=rng.choice(["float32", "int64"]), src=a, dst=b,
                                  any_source=rng.random() < 0.2))
            elif roll < 0.2 and len(members) >= 2:
                a, b = rng.sample(members, 2)
                steps.append(Step("batch_p2p", g, op_id, async_op=True, src=a, dst=b))
                pending.append(op_id)
            else:
                kind = rng.choice(list(COLLECTIVES))
                async_op = COLLECTIVES[kind] and rng.random() < 0.4
                dtype = rng.choice(["float32", "float64", "int32", "int64"] if kind in _REDUCING
                                   else list(DTYPES))
                size = len(members)
                splits = []
                if kind == "all_to_all_single":
                    splits = [[rng.randint(0, 5) for _ in range(size)] for _ in range(size)]
                    for i in range(size):  # each rank sends marker() elements in all: its own share absorbs the rest
                        own = marker(op_id) - sum(n for j, n in enumerate(splits[i]) if j != i)
                        splits[i][i] = own
                steps.append(Step(kind, g, op_id, async_op, dtype, root=rng.randrange(size), splits=splits))
                if async_op:
                    pending.append(op_id)
            if pending and rng.random() < 0.3:
                steps.append(Step("wait", waits=pending.pop(rng.randrange(len(pending)))))
        rng.shuffle(pending)
        steps.extend(Step("wait", waits=w) for w in pending)
        out.append(steps)
    reinit = frozenset({rng.randrange(1, windows)}) if windows > 1 and rng.random() < 0.7 else frozenset()
    return Plan(groups, out, reinit)


def ranks_text(ranks: list[int]) -> str:
    return "[" + ", ".join(str(r) for r in ranks) + "]"


class _Truth:
    """This rank's counters and what it wrote down."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.life = 0
        self.coll_seq: dict[int, int] = {}
        self.p2p_seq: dict[int, int] = {}
        self.pair_seq: dict[tuple[int, int, int], int] = {}
        self.calls: list[dict[str, Any]] = []

    def reinit(self) -> None:
        """A new life of the world: its groups count from the start."""
        self.life += 1
        self.coll_seq.clear()
        self.p2p_seq.clear()
        self.pair_seq.clear()

    def collective(self, g: int) -> int:
        self.coll_seq[g] = self.coll_seq.get(g, 0) + 1
        return self.coll_seq[g]

    def p2p(self, g: int) -> int:
        self.p2p_seq[g] = self.p2p_seq.get(g, 0) + 1
        return self.p2p_seq[g]

    def pair(self, g: int, src: int, dst: int) -> int:
        key = (g, src, dst)
        self.pair_seq[key] = self.pair_seq.get(key, 0) + 1
        return self.pair_seq[key]


def _expected(name: str, n_in: int, n_out: int, dtype: str, rank_key: int, seq: int, group: list[int],
              async_op: bool, *, in_split: str = "[]", out_split: str = "[]", p2p: Optional[tuple] = None) -> dict:
    """The annotation keys the reference table gives this call."""
    keys = {
        "Collective name": name, "In msg nelems": n_in, "Out msg nelems": n_out, "Group size": len(group),
        "dtype": DTYPES[dtype], "In split size": in_split, "Out split size": out_split, "Rank": rank_key,
        "Seq": seq, "commtag async": async_op, "commtag p2p": p2p is not None,
    }
    if p2p is not None:
        kind, peer, pair_seq = p2p
        keys["Dst Rank" if kind == "send" else "Src Rank"] = peer
        keys["commtag p2p pair seq"] = pair_seq
    return keys


def run(rank: int, world_size: int, out_dir: str, seed: int, cycles: int, ops_per_step: int) -> int:
    """One rank of the workload (a gloo_world body): run the plan under the profiler, write the truth."""
    import torch.distributed as dist
    from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

    import commtag

    assert world_size == WORLD
    plan = make_plan(seed, cycles * (WAIT + WARMUP + ACTIVE), ops_per_step)
    commtag.install()
    try:
        handles, names = _groups(rank, plan)
        all_names = [names]
        truth = _Truth(rank)
        sched = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=0)
        recording = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched,
                     on_trace_ready=commtag.trace_handler(out_dir)) as prof:
            for index, steps in enumerate(plan.windows):  # one plan window per profiler step
                if index in plan.reinit_before:
                    dist.destroy_process_group()
                    dist.init_process_group("gloo", init_method=f"file://{out_dir}.store{truth.life + 1}", rank=rank,
                                            world_size=world_size, timeout=timedelta(seconds=120))
                    truth.reinit()
                    handles, names = _groups(rank, plan)
                    all_names.append(names)
                _run_window(rank, steps, plan, handles, names, truth, prof.step_num,
                            prof.current_action in recording)
                prof.step()
    finally:
        commtag.uninstall()
    truth_doc = {"rank": rank, "seed": seed, "groups": plan.groups, "group_names": all_names, "calls": truth.calls}
    write_atomic(os.path.join(out_dir, f"truth{rank}.json"), json.dumps(truth_doc).encode())
    return len(truth.calls)


def _groups(rank: int, plan: Plan) -> tuple[list, list[Optional[str]]]:
    """The plan's groups in this life (every rank creates each, in the same order), and their names."""
    import torch.distributed as dist

    handles = [dist.group.WORLD] + [dist.new_group(g) for g in plan.groups[1:]]
    return handles, [h.group_name if rank in g else None for h, g in zip(handles, plan.groups)]


def _run_window(rank: int, steps: list[Step], plan: Plan, handles: list, names: list, truth: _Truth,
                window: int, recorded: bool) -> None:
    import torch
    import torch.distributed as dist

    works: dict[int, Any] = {}
    for step in steps:
        if step.kind == "wait":
            for work in works.pop(step.waits, ()):
                work.wait()
            continue
        members = plan.groups[step.group]
        if rank not in members:
            continue
        group = handles[step.group]
        me = members.index(rank)
        size = len(members)
        dtype = getattr(torch, step.dtype)
        m = marker(step.op_id)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, dtype=dtype)

        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype)

        record = {"window": window, "recorded": recorded, "life": truth.life, "op": step.kind, "op_id": step.op_id,
                  "marker": m, "async": step.async_op, "pg_name": names[step.group], "group": members}
        kind = step.kind
        a = step.async_op
        root = members[step.root]
        result: Any = None
        if kind == "send_recv":
            if rank not in (step.src, step.dst):
                continue
            seq = truth.p2p(step.group)
            pair_seq = truth.pair(step.group, step.src, step.dst)
            # The step's own tag: a recv from any source takes only this step's message, not
            # another peer's (a batched isend still in flight, a later step's send).
            if rank == step.src:
                dist.send(ones(m), dst=step.dst, group=group, tag=step.op_id)
                exp = _expected("send", m, m, step.dtype, members.index(step.dst), seq, members, False,
                                p2p=("send", step.dst, pair_seq))
            else:
                got = dist.recv(zeros(m), src=None if step.any_source else step.src, group=group, tag=step.op_id)
                assert got == step.src
                exp = _expected("recv", m, m, step.dtype, members.index(step.src), seq, members, False,
                                p2p=("recv", step.src, pair_seq))
            record["op"] = "recv_any_source" if rank == step.dst and step.any_source else (
                "send" if rank == step.src else "recv")
            truth.calls.append({**record, "expected": exp})
            continue
        if kind == "batch_p2p":
            if rank not in (step.src, step.dst):
                continue
            peer = step.dst if rank == step.src else step.src
            seq = truth.p2p(step.group)
            # Both directions at once: each side sends one tensor and receives the other's.
            send_n, recv_n = (m, m + 6) if rank == step.src else (m + 6, m)
            ops = [dist.P2POp(dist.isend, ones(send_n), peer, group),
                   dist.P2POp(dist.irecv, zeros(recv_n), peer, group)]
            works[step.op_id] = dist.batch_isend_irecv(ops)
            for p2p_kind, n, src, dst in (("send", send_n, rank, peer), ("recv", recv_n, peer, rank)):
                exp = _expected(p2p_kind, n, n, step.dtype, members.index(peer), seq, members, True,
                                p2p=(p2p_kind, peer, truth.pair(step.group, src, dst)))
                truth.calls.append({**record, "op": "batch_" + p2p_kind, "marker": n, "expected": exp})
            continue
        seq = truth.collective(step.group)
        if kind == "all_reduce":
            result = dist.all_reduce(ones(m), group=group, async_op=a)
            exp = _expected("allreduce", m, m, step.dtype, me, seq, members, a)
        elif kind == "broadcast":
            result = dist.broadcast(ones(m), src=root, group=group, async_op=a)
            exp = _expected("broadcast", m, m, step.dtype, step.root, seq, members, a)
        elif kind == "reduce":
            result = dist.reduce(ones(m), dst=root, group=group, async_op=a)
            exp = _expected("reduce", m, m, step.dtype, step.root, seq, members, a)
        elif kind == "all_gather":
            result = dist.all_gather([zeros(m) for _ in range(size)], ones(m), group=group, async_op=a)
            exp = _expected("all_gather", m, m * size, step.dtype, me, seq, members, a)
        elif kind == "all_gather_into_tensor":
            result = dist.all_gather_into_tensor(zeros(m * size), ones(m), group=group, async_op=a)
            exp = _expected("_allgather_base", m, m * size, step.dtype, me, seq, members, a)
        elif kind == "reduce_scatter":
            result = dist.reduce_scatter(zeros(m), [ones(m) for _ in range(size)], group=group, async_op=a)
            exp = _expected("reduce_scatter", m * size, m, step.dtype, me, seq, members, a)
        elif kind == "reduce_scatter_tensor":
            result = dist.reduce_scatter_tensor(zeros(m // size), ones(m), group=group, async_op=a)
            exp = _expected("_reduce_scatter_base", m, m // size, step.dtype, me, seq, members, a)
        elif kind == "all_to_all_single":
            send = step.splits[me]
            recv = [row[me] for row in step.splits]
            result = dist.all_to_all_single(zeros(sum(recv)), ones(sum(send)), output_split_sizes=recv,
                                            input_split_sizes=send, group=group, async_op=a)
            exp = _expected("all_to_allv", sum(send), sum(recv), step.dtype, me, seq, members, a,
                            in_split=ranks_text(send), out_split=ranks_text(recv))
        elif kind == "all_to_all":
            # gloo's list all_to_all takes equal tensors only (uneven splits: all_to_all_single).
            send = recv = [m] * size
            result = dist.all_to_all([zeros(n) for n in recv], [ones(n) for n in send], group=group, async_op=a)
            exp = _expected("all_to_all", sum(send), sum(recv), step.dtype, me, seq, members, a,
                            in_split=ranks_text(send), out_split=ranks_text(recv))
        elif kind == "gather":
            result = dist.gather(ones(m), [zeros(m) for _ in range(size)] if rank == root else None, dst=root,
                                 group=group, async_op=a)
            exp = _expected("gather", m, m * size, step.dtype, step.root, seq, members, a)
        elif kind == "scatter":
            result = dist.scatter(zeros(m), [ones(m) for _ in range(size)] if rank == root else None, src=root,
                                  group=group, async_op=a)
            exp = _expected("scatter", m * size, m, step.dtype, step.root, seq, members, a)
        elif kind == "barrier":
            result = dist.barrier(group=group, async_op=a)
            exp = _expected("barrier", 0, 0, "float32", me, seq, members, a)
            exp["dtype"] = "Byte"
            record["marker"] = None  # a gloo barrier shows no input
        elif kind == "all_reduce_coalesced":
            result = dist.all_reduce_coalesced([ones(m), ones(7)], group=group, async_op=a)
            exp = _expected("allreduce_coalesced", m + 7, m + 7, step.dtype, me, seq, members, a)
        elif kind == "coalescing_manager":
            with dist._coalescing_manager(group=group):
                dist.all_reduce(ones(m), group=group)
                dist.all_reduce(ones(5), group=group)
            exp = _expected("allreduce_coalesced", m + 5, m + 5, step.dtype, me, seq, members, False)
        else:
            raise AssertionError(kind)
        if a:
            works[step.op_id] = [result]
        truth.calls.append({**record, "expected": exp})
    for pending in works.values():
        for work in pending:
            work.wait()
