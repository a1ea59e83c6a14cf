"""A 4-rank gloo run with commtag installed and profiled (conftest's shared ``gloo_run``), merged.

Real ranks, real torch.profiler traces, real sidecars from commtag's trace
handler. Checks what a user opening the merged file would check: each group
has its lane on every member rank with the same name and place; each
collective slice carries the eager keys; flows link the same (group, Seq)
on all members; the gloo ops in the trace carry the keys too (--json).
"""

from __future__ import annotations

import gzip
import shutil
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from merging import merge
from commtag.merge.pftrace.validate import validate_file
from commtag.vocab import KERNEL_EAGER_KEYS, P2P_PEER_KEYS
from pftrace_reader import read

pytestmark = pytest.mark.slow

#: The keys every collective's slice carries (all but a p2p call's peer).
EAGER = [key for key in KERNEL_EAGER_KEYS if key not in P2P_PEER_KEYS]


@pytest.fixture(scope="module")
def gloo_traces(gloo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's copy of the shared run: the merge writes its default output beside the inputs."""
    return Path(shutil.copytree(gloo_run, tmp_path_factory.mktemp("gloo4") / "traces"))


@pytest.fixture(scope="module")
def merged(gloo_traces: Path, tmp_path_factory: pytest.TempPathFactory):
    json_dir = tmp_path_factory.mktemp("annotated")
    result = merge(gloo_traces, json_dir=json_dir)
    return result, read(result.output), json_dir


def _lanes(parsed) -> dict[int, list[tuple[int, str]]]:
    """rank -> [(sibling order, lane name)] of the process-group view's groups it has a row in."""
    out = defaultdict(set)
    for d in parsed.tracks.values():
        head = parsed.tracks.get(d.parent_uuid) if d.HasField("parent_uuid") else None
        if head is not None and not head.HasField("parent_uuid") and not head.HasField("process") \
                and d.name.startswith("rank "):
            out[int(d.name.split(" ")[1])].add((head.sibling_order_rank, head.name))
    return {r: sorted(v) for r, v in out.items()}


def test_output_validates(merged) -> None:
    result, _, _ = merged
    assert result.output.name == "merged.pftrace"
    assert validate_file(result.output) == []


def test_every_group_has_its_lane_on_each_member_with_one_name_and_place(merged) -> None:
    result, parsed, _ = merged
    lanes = _lanes(parsed)
    assert sorted(lanes) == [0, 1, 2, 3]
    by_name: dict[str, set[int]] = defaultdict(set)
    place: dict[str, set[int]] = defaultdict(set)
    for rank, rows in lanes.items():
        for order, name in rows:
            by_name[name].add(rank)
            place[name].add(order)
    groups = {i.lane_name: set(i.group_ranks) for i in result.instances}
    assert len(groups) == 4  # default, even, odd, pair
    for name, members in groups.items():
        assert by_name[name] == members, name
        assert len(place[name]) == 1, f"{name} sits at different places: {place[name]}"
    # and the relative order of lanes is the same on every rank
    order = sorted(place, key=lambda n: next(iter(place[n])))
    for rows in lanes.values():
        names = [n for _, n in rows]
        assert names == [n for n in order if n in names]


def test_each_collective_slice_carries_the_eager_keys(merged) -> None:
    result, parsed, _ = merged
    lane_slices = [s for s in parsed.slices if "commtag source" in s.args]
    assert len(lane_slices) == len(result.instances) >= 4 * 8
    for s in lane_slices:
        missing = [k for k in EAGER if k not in s.args]
        assert not missing, (s.name, missing)
        assert s.args["commtag source"] == "gloo"
        assert s.end > s.ts
    names = {s.args["Collective name"] for s in lane_slices}
    assert {"allreduce", "broadcast", "_allgather_base", "send", "recv", "barrier"} <= names


def test_cross_rank_flows_connect_the_same_group_and_seq(merged) -> None:
    _, parsed, _ = merged
    lane_slices = [s for s in parsed.slices if "commtag source" in s.args and not s.args.get("commtag p2p")]
    by_key = defaultdict(list)
    for s in lane_slices:
        by_key[(s.args["commtag pg uid"], s.args["Seq"])].append(s)
    for key, members in by_key.items():
        ranks = {s.args["commtag rank"] for s in members}
        assert len(ranks) == len(members) == s.args["Group size"] if (s := members[0]) else False
        for a in members:  # every member is linked to every other one
            linked = {f for f in a.flows_out + a.flows_in}
            for b in members:
                if b is not a:
                    assert linked & set(b.flows_out + b.flows_in), (key, a.arg("commtag rank"), b.arg("commtag rank"))
    # a flow never links two different collectives
    owner = defaultdict(set)
    for s in lane_slices:
        for f in s.flows_out + s.flows_in:
            owner[f].add((s.args["commtag pg uid"], s.args["Seq"]))
    cross = {f: k for f, k in owner.items() if len(k) > 1}
    assert not cross


def test_send_is_linked_to_its_recv(merged) -> None:
    _, parsed, _ = merged
    p2p = [s for s in parsed.slices if "commtag source" in s.args and s.args.get("commtag p2p")]
    send = next(s for s in p2p if s.args["Collective name"] == "send")
    recv = next(s for s in p2p if s.args["Collective name"] == "recv")
    assert set(send.flows_out + send.flows_in) & set(recv.flows_out + recv.flows_in)


def test_gloo_ops_and_worker_events_carry_the_keys(merged, gloo_traces: Path) -> None:
    _, parsed, json_dir = merged
    for path in sorted(json_dir.iterdir()):
        events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        ops = [e for e in events if e.get("name", "").startswith("c10d::")]
        work = [e for e in events if e.get("name", "").startswith("gloo:")]
        assert ops and work
        assert all("Collective name" in e["args"] and "commtag pg uid" in e["args"] for e in ops), path
        assert all("Collective name" in e["args"] for e in work), path
    # the source op starts a flow that its lane slice ends
    ops = [s for s in parsed.slices if s.name.startswith("c10d::")]
    lane_ends = {f for s in parsed.slices if "commtag source" in s.args for f in s.flows_in}
    assert all(set(s.flows_out) & lane_ends for s in ops)
