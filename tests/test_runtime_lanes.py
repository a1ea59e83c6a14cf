"""Lanes and uids: identical on every member rank, whatever order groups are created and used in.

Ranks create groups that only some of them belong to (local synchronization,
in rank-dependent order), new_subgroups and a 2x2 DeviceMesh, then run
collectives on their groups in rank-dependent orders.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gloo_world import run_world

pytestmark = pytest.mark.slow

WORLD = 4


def _groups(rank: int, world_size: int, out_dir: str) -> None:
    import commtag
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile

    commtag.install()
    # Local-synchronization groups: only members create them, each rank its own pair first.
    local = {
        0: [[0, 1], [0, 2]],
        1: [[0, 1], [1, 3]],
        2: [[2, 3], [0, 2]],
        3: [[2, 3], [1, 3]],
    }[rank]
    mine = [dist.new_group(ranks, use_local_synchronization=True) for ranks in local]
    sub, _ = dist.new_subgroups(2)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mine += [sub, mesh.get_group("dp"), mesh.get_group("tp"), dist.group.WORLD]
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        for round_ in range(2):
            # Every rank walks its groups in its own order; async so no order deadlocks.
            order = mine[rank + round_:] + mine[: rank + round_]
            works = [dist.all_reduce(torch.ones(2), group=g, async_op=True) for g in order]
            for work in works:
                work.wait()


def test_lanes_and_uids_agree_across_ranks(tmp_path: Path):
    from commtag.sidecarfile import read_sidecar

    run_world(_groups, WORLD, str(tmp_path))
    sides = [read_sidecar(tmp_path / f"rank{r}.step0.commtag.json") for r in range(WORLD)]

    per_uid: dict[str, set] = {}
    members: dict[str, set] = {}
    seqs: dict[tuple[str, int], set] = {}
    for side in sides:
        for pg in side.process_groups:
            per_uid.setdefault(pg.uid, set()).add((pg.name, tuple(pg.ranks), pg.lane_id, pg.lane_name))
        for rc in side.collectives:
            a = rc.annotation
            members.setdefault(a.pg_uid, set()).add(side.rank)
            seqs.setdefault((a.pg_uid, side.rank), set()).add(a.seq)

    # One identity per group across every rank's table.
    assert all(len(v) == 1 for v in per_uid.values()), per_uid
    rows = {uid: next(iter(v)) for uid, v in per_uid.items()}
    # Each group was recorded by exactly its member ranks.
    for uid, ranks in members.items():
        assert ranks == set(rows[uid][1]), uid
    # Same ranks, different groups (pair [0, 1] made three ways): distinct uids and lanes.
    same_ranks = [uid for uid, row in rows.items() if row[1] == (0, 1)]
    assert len(same_ranks) == 3
    lanes = [row[2] for row in rows.values()]
    assert len(set(lanes)) == len(lanes) and min(lanes) >= 60
    # 2 local pairs per rank-set (4 distinct), 2 subgroups, 4 mesh groups, world.
    assert len(rows) == 4 + 2 + 4 + 1
    # Two rounds: Seq 1 and 2 on every member, whatever the issue order.
    assert all(v == {1, 2} for v in seqs.values())
