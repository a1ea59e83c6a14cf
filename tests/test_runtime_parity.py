"""Eager parity: every covered op, on a real 4-rank gloo world with several groups,
yields exactly the keys and values the PyTorch profiler records for an eager NCCL
collective. Expected values are computed here from the reference table
(docs/eager-metadata.md), not by commtag's helpers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gloo_world import run_world
from torch_ops import has

from commtag.vocab import EAGER_KEYS

pytestmark = pytest.mark.slow

WORLD = 4
PAIRS = ([0, 2], [1, 3])  # stride-2 groups
ODD = [0, 1, 3]  # not an arithmetic progression; rank 2 is not a member


def _ops(rank: int, world_size: int, out_dir: str) -> None:
    """Run every covered op once while profiling."""
    import commtag
    from torch.profiler import ProfilerActivity, profile

    commtag.install()
    pairs = [dist.new_group(r) for r in PAIRS]
    odd = dist.new_group(ODD)
    alone = [dist.new_group([r]) for r in range(world_size)][rank]  # a one-rank subgroup each
    pair = pairs[rank % 2]
    pair_ranks = PAIRS[rank % 2]
    f32 = torch.float32
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        dist.all_reduce(torch.ones(6, dtype=f32))
        dist.all_reduce(torch.ones(5, dtype=torch.bfloat16), group=pair)
        dist.broadcast(torch.ones(7, dtype=torch.int64), src=2)
        dist.reduce(torch.ones(4), dst=pair_ranks[1], group=pair)
        dist.all_gather([torch.zeros(3) for _ in range(world_size)], torch.ones(3))
        dist.all_gather_into_tensor(torch.zeros(3 * world_size), torch.ones(3))
        # all_gather_single from torch 2.13 on; before it, the op it replaced (same record).
        gather_single = dist.all_gather_single if has("all_gather_single") else dist.all_gather_into_tensor
        gather_single(torch.zeros(2 * 2), torch.ones(2), group=pair)
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * world_size))
        dist.all_to_all_single(torch.zeros(8), torch.ones(8))
        # Uneven: rank r sends j+1 rows of 2 to rank j, so receives r+1 rows from each.
        dist.all_to_all_single(
            torch.zeros(world_size * (rank + 1), 2),
            torch.ones(sum(range(1, world_size + 1)), 2),
            output_split_sizes=[rank + 1] * world_size,
            input_split_sizes=list(range(1, world_size + 1)),
        )
        dist.gather(torch.ones(3), [torch.zeros(3) for _ in range(world_size)] if rank == 3 else None, dst=3)
        dist.scatter(torch.zeros(2), [torch.ones(2) for _ in range(world_size)] if rank == 0 else None, src=0)
        dist.barrier()
        # send/recv on the world: 0 -> 1 (explicit source), 2 -> 3 (any source).
        if rank == 0:
            dist.send(torch.ones(5), dst=1)
        elif rank == 1:
            dist.recv(torch.zeros(5), src=0)
        elif rank == 2:
            dist.send(torch.ones(5), dst=3)
        else:
            dist.recv(torch.zeros(5))
        # send/recv on a pair group by group rank: first member -> second member.
        if rank in (0, 1):
            dist.send(torch.ones(9), group=pair, group_dst=1)
        else:
            dist.recv(torch.zeros(9), group=pair, group_src=0)
        works = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, torch.ones(4), (rank + 1) % world_size),
                dist.P2POp(dist.irecv, torch.zeros(4), (rank - 1) % world_size),
            ]
        )
        for work in works:
            work.wait()
        with dist._coalescing_manager():
            dist.all_reduce(torch.ones(2))
            dist.all_reduce(torch.ones(3))
        dist.all_reduce(torch.ones(3, dtype=torch.complex64), async_op=True).wait()
        dist.all_reduce(torch.ones(1), group=odd)  # a no-op on rank 2
        dist.reduce_scatter(torch.zeros(1), [torch.ones(1)] * world_size)
        dist.all_reduce(torch.ones(2), group=alone)


def _ranks_text(ranks: list[int]) -> str:
    return "[" + ", ".join(str(r) for r in ranks) + "]"


def _expected(rank: int) -> list[dict]:
    """The eager records for rank ``rank``, straight from the reference table."""
    world = list(range(WORLD))
    pair = PAIRS[rank % 2]
    me_in_pair = pair.index(rank)

    def rec(name, group, n_in, n_out, dtype, rank_key, seq, *, in_split="[]", out_split="[]", extra=None):
        ranks, pg_name, desc = group
        d = {
            "Collective name": name,
            "In msg nelems": n_in,
            "Out msg nelems": n_out,
            "Group size": len(ranks),
            "dtype": dtype,
            "In split size": in_split,
            "Out split size": out_split,
            "Process Group Name": pg_name,
            "Process Group Description": desc,
            "Rank": rank_key,
            "Seq": seq,
        }
        # A one-rank subgroup's stride is 0, so the profiler lists no ranks (seen on an H100, torch 2.11).
        strided = len(ranks) > 1 and all(b - a == ranks[1] - ranks[0] > 0 for a, b in zip(ranks, ranks[1:]))
        d["Process Group Ranks"] = _ranks_text(ranks) if strided else "[]"
        d["Global rank start"] = ranks[0]
        if strided:
            d["Global rank stride"] = ranks[1] - ranks[0]
        d.update(extra or {})
        return d

    # Groups are named in creation order: world "0", pairs "1"/"2", odd "3".
    w = (world, "0", "default_pg")
    p = (pair, str(1 + rank % 2), "undefined")
    o = (ODD, "3", "undefined")
    me = rank
    recs = [
        rec("allreduce", w, 6, 6, "Float", me, 1),
        rec("allreduce", p, 5, 5, "BFloat16", me_in_pair, 1),
        rec("broadcast", w, 7, 7, "Long", 2, 2),
        rec("reduce", p, 4, 4, "Float", 1, 2),
        rec("all_gather", w, 3, 3 * WORLD, "Float", me, 3),
        rec("_allgather_base", w, 3, 3 * WORLD, "Float", me, 4),
        rec("_allgather_base", p, 2, 4, "Float", me_in_pair, 3),
        rec("_reduce_scatter_base", w, 2 * WORLD, 2, "Float", me, 5),
        rec("all_to_allv", w, 8, 8, "Float", me, 6),
        rec("all_to_allv", w, 20, 2 * WORLD * (rank + 1), "Float", me, 7,
            in_split="[1, 2, 3, 4]", out_split=_ranks_text([rank + 1] * WORLD)),
        rec("gather", w, 3, 3 * WORLD, "Float", 3, 8),
        rec("scatter", w, 2 * WORLD, 2, "Float", 0, 9),
        rec("barrier", w, 0, 0, "Byte", me, 10),
    ]
    world_peer = {0: ("send", 1), 1: ("recv", 0), 2: ("send", 3), 3: ("recv", 2)}[rank]
    kind, peer = world_peer
    recs.append(rec(kind, w, 5, 5, "Float", peer, 1, extra={"Dst Rank" if kind == "send" else "Src Rank": peer}))
    pair_kind, pair_peer = ("send", pair[1]) if me_in_pair == 0 else ("recv", pair[0])
    recs.append(rec(pair_kind, p, 9, 9, "Float", pair.index(pair_peer), 1,
                    extra={"Dst Rank" if pair_kind == "send" else "Src Rank": pair_peer}))
    nxt, prv = (rank + 1) % WORLD, (rank - 1) % WORLD
    recs.append(rec("send", w, 4, 4, "Float", nxt, 2, extra={"Dst Rank": nxt}))
    recs.append(rec("recv", w, 4, 4, "Float", prv, 2, extra={"Src Rank": prv}))
    recs.append(rec("allreduce_coalesced", w, 5, 5, "Float", me, 11))
    recs.append(rec("allreduce", w, 6, 6, "Float", me, 12))  # complex64 x3 as its real view
    if rank in ODD:
        recs.append(rec("allreduce", o, 1, 1, "Float", ODD.index(rank), 1))
    recs.append(rec("reduce_scatter", w, WORLD, 1, "Float", me, 13))
    # Groups "4".."7": one rank each, created by every rank in the same order.
    recs.append(rec("allreduce", ([rank], str(4 + rank), "undefined"), 2, 2, "Float", 0, 1))
    return recs




@pytest.fixture(scope="module")
def world_output(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parity")
    run_world(_ops, WORLD, str(out))
    return out


def test_trace_and_sidecar_per_rank(world_output: Path):
    names = sorted(p.name for p in world_output.iterdir())
    assert names == sorted(
        [f"rank{r}.step0.pt.trace.json.gz" for r in range(WORLD)]
        + [f"rank{r}.step0.commtag.json" for r in range(WORLD)]
    )


def test_every_key_and_value_matches_the_reference_table(world_output: Path):
    from commtag.sidecarfile import read_sidecar

    for rank in range(WORLD):
        side = read_sidecar(world_output / f"rank{rank}.step0.commtag.json")
        got = [
            {k: v for k, v in rc.annotation.eager_dict().items() if k in EAGER_KEYS}
            for rc in sorted(side.collectives, key=lambda rc: rc.start_ns)
        ]
        assert got == _expected(rank), f"rank {rank}"


def test_commtag_fields_agree_across_ranks(world_output: Path):
    from commtag.sidecarfile import read_sidecar

    sides = [read_sidecar(world_output / f"rank{r}.step0.commtag.json") for r in range(WORLD)]
    assert len({s.run_id for s in sides}) == 1
    lanes: dict[str, set] = {}
    for side in sides:
        assert side.world_size == WORLD and side.trace_file == f"rank{side.rank}.step0.pt.trace.json.gz"
        for rc in side.collectives:
            a = rc.annotation
            assert a.lane_id >= 60 and a.pg_uid.startswith(a.pg_name + ":")
            assert a.is_p2p == (a.collective_name in ("send", "recv"))
            batched = a.is_p2p and a.pg_name == "0" and a.seq == 2
            async_allreduce = not a.is_p2p and a.pg_name == "0" and a.seq == 12
            assert a.async_op == (batched or async_allreduce)
            assert rc.start_ns <= rc.end_ns
            lanes.setdefault(a.pg_uid, set()).add((a.lane_id, a.lane_name))
    assert all(len(v) == 1 for v in lanes.values())  # one lane per group, same on every rank
    assert len({next(iter(v))[0] for v in lanes.values()}) == len(lanes) == 8  # world, two pairs, odd, four of one rank
    # A send and its recv share (group, src, dst, pair seq).
    sends = {(s.rank, rc.annotation.dst_rank, rc.annotation.pg_uid, rc.annotation.p2p_pair_seq)
             for s in sides for rc in s.collectives if rc.annotation.collective_name == "send"}
    recvs = {(rc.annotation.src_rank, s.rank, rc.annotation.pg_uid, rc.annotation.p2p_pair_seq)
             for s in sides for rc in s.collectives if rc.annotation.collective_name == "recv"}
    assert sends == recvs and len(sends) == 2 + 2 + 4


def test_recorded_thread_is_the_trace_thread_of_the_c10d_op(world_output: Path):
    import gzip
    import json

    from commtag.sidecarfile import read_sidecar

    side = read_sidecar(world_output / "rank0.step0.commtag.json")
    trace = json.loads(gzip.open(world_output / side.trace_file).read())
    c10d_tids = {e["tid"] for e in trace["traceEvents"] if e.get("name") == "c10d::allreduce_"}
    assert {rc.tid for rc in side.collectives if not rc.annotation.async_op} == c10d_tids
