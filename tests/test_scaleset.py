"""The scale-set generator (commtag.testing.scaleset) writes a set the merge can trust.

Runs the generator as a user would (a subprocess, small N and event budget) and
checks what the benchmark and the merge rely on: every sidecar validates and
names a trace next to it, traces load and carry distributedInfo, graph-replayed
kernels carry node ids that match the capture records, the process groups and
sequence numbers agree across ranks, and collectives end together once the
recorded clock offsets are removed.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from commtag.schema import Sidecar, parse_rank_list
from commtag.sidecarfile import read_sidecar

pytestmark = pytest.mark.slow

#: The generator's command line, as a user and launch/bench_merge.py run it.
GENERATOR = (sys.executable, "-m", "commtag.testing.scaleset")
RANKS = 4
EVENTS = 24_000


def _generate(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GENERATOR, "--ranks", str(RANKS), "--events", str(EVENTS), "--ranks-per-node", "1",
         "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def scaleset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scale4")
    done = _generate(out)
    assert done.returncode == 0, done.stderr
    return out


def _load(out: Path) -> list[tuple[Sidecar, dict]]:
    """(sidecar, trace) per rank, found the way a user would: sidecar -> its trace_file."""
    pairs = []
    for path in sorted(out.glob("*.commtag.json")):
        sidecar = read_sidecar(path)
        with gzip.open(path.parent / sidecar.trace_file, "rt") as handle:
            pairs.append((sidecar, json.load(handle)))
    return sorted(pairs, key=lambda pair: pair[0].rank)


def _manifest(out: Path) -> dict:
    return json.loads((out / "scaleset.manifest.json").read_text())


def test_every_rank_has_a_valid_sidecar_and_a_loadable_trace(scaleset: Path) -> None:
    pairs = _load(scaleset)
    assert [s.rank for s, _ in pairs] == list(range(RANKS))
    events = 0
    for sidecar, trace in pairs:
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (sidecar.rank, RANKS)
        assert sidecar.world_size == RANKS
        assert isinstance(trace["baseTimeNanoseconds"], int)
        assert {pg["pg_name"]: pg["ranks"] for pg in info["pg_config"]} == {
            pg.name: pg.ranks for pg in sidecar.process_groups
        }
        assert len(sidecar.process_groups) >= 3, "several process groups per rank"
        assert sidecar.collectives and sidecar.captures
        timed = [e for e in trace["traceEvents"] if e.get("ph") != "M"]
        assert all(e["ts"] >= 0 for e in timed), "Kineto never writes a ts before its base time"
        events += len(timed)
    assert events >= EVENTS
    assert _manifest(scaleset)["events"] == events


def test_replayed_kernels_carry_node_ids_matching_the_captures(scaleset: Path) -> None:
    for sidecar, trace in _load(scaleset):
        replays: dict[int, dict[int, dict]] = defaultdict(dict)
        for e in trace["traceEvents"]:
            args = e.get("args", {})
            if e.get("cat") == "kernel" and args.get("graph id"):
                node = args["graph node id"] & 0xFFFFFFFF
                assert node not in replays[args["correlation"]], "one kernel per node per replay"
                replays[args["correlation"]][node] = e
        by_graph = defaultdict(list)
        for kernels in replays.values():
            graph_ids = {k["args"]["graph id"] for k in kernels.values()}
            assert len(graph_ids) == 1
            by_graph[graph_ids.pop()].append(kernels)
        launch_ns = {
            e["args"]["correlation"]: trace["baseTimeNanoseconds"] + round(e["ts"] * 1000)
            for e in trace["traceEvents"]
            if e.get("name") == "cudaGraphLaunch"
        }
        for capture in sidecar.captures:
            launches = by_graph[capture.exec_graph_id]
            assert launches, f"rank {sidecar.rank}: capture {capture.capture_id} is never replayed"
            assert len(capture.replays) == len(launches), "the replay log lists every replay in the trace"
            logged = sorted(capture.replays, key=lambda r: r.start_ns)
            launched = sorted(launch_ns[next(iter(k.values()))["args"]["correlation"]] for k in launches)
            assert all(r.start_ns <= t <= r.end_ns for r, t in zip(logged, launched))
            assert [r.index for r in logged] == list(range(logged[0].index, logged[0].index + len(logged)))
            for kernels in launches:
                assert sorted(kernels) == list(range(capture.total_nodes))
                for captured in capture.collectives:
                    assert captured.annotation.capture_id == capture.capture_id
                    for node in captured.nodes:
                        assert kernels[node.index]["name"] == node.kernel_name
                        assert "nccl" in node.kernel_name.lower()


def test_groups_and_sequence_numbers_agree_across_ranks(scaleset: Path) -> None:
    pairs = _load(scaleset)
    seen: dict[str, dict[int, list[tuple]]] = defaultdict(dict)
    for sidecar, trace in pairs:
        calls = defaultdict(list)
        for capture in sidecar.captures:
            for captured in capture.collectives:
                a = captured.annotation
                calls[a.pg_uid].append((a.seq, a.collective_name, a.in_msg_nelems, "capture"))
        for recorded in sidecar.collectives:
            a = recorded.annotation
            calls[a.pg_uid].append((a.seq, a.collective_name, a.in_msg_nelems, "eager"))
        kernels = [e["args"] for e in trace["traceEvents"] if "Collective name" in e.get("args", {})]
        assert sorted((k["Process Group Name"], k["Seq"]) for k in kernels) == sorted(
            (r.annotation.pg_name, r.annotation.seq) for r in sidecar.collectives
        ), "every eager kernel's metadata matches a recorded call"
        for pg in sidecar.process_groups:
            seqs = [call[0] for call in sorted(calls[pg.uid])]
            assert seqs == list(range(1, len(seqs) + 1)), f"group {pg.uid}: Seq must count 1, 2, ..."
            seen[pg.uid][sidecar.rank] = sorted(calls[pg.uid])
    for uid, by_rank in seen.items():
        members = {pg.uid: pg.ranks for s, _ in pairs for pg in s.process_groups}[uid]
        assert sorted(by_rank) == sorted(members)
        assert len({tuple(calls) for calls in by_rank.values()}) == 1, f"group {uid} differs across its members"
    for sidecar, _ in pairs:
        for recorded in sidecar.collectives:
            ranks = parse_rank_list(recorded.annotation.pg_ranks)
            assert ranks is None or sidecar.rank in ranks


def test_collectives_end_together_once_clock_offsets_are_removed(scaleset: Path) -> None:
    offsets = _manifest(scaleset)["clock_offset_us"]
    assert len(set(offsets)) > 1, "ranks span hosts whose clocks differ"
    ends: dict[tuple, list[float]] = defaultdict(list)
    starts: dict[tuple, list[float]] = defaultdict(list)
    pairs = _load(scaleset)
    for sidecar, trace in pairs:
        group_of_node = {
            (c.exec_graph_id, n.index): cc.annotation.pg_uid for c in sidecar.captures for cc in c.collectives for n in cc.nodes
        }
        replay_index: dict[int, int] = {}
        for e in sorted(trace["traceEvents"], key=lambda e: e.get("ts", 0)):
            args = e.get("args", {})
            if e.get("cat") != "kernel" or "nccl" not in e["name"].lower():
                continue
            true_start = e["ts"] - offsets[sidecar.rank]
            if args.get("graph id"):
                corr = args["correlation"]
                replay_index.setdefault(corr, len(replay_index))
                node = (args["graph id"], args["graph node id"] & 0xFFFFFFFF)
                key = ("graph", group_of_node[node], node, replay_index[corr])
            else:
                key = ("eager", args["Process Group Name"], args["Seq"])
            ends[key].append(true_start + e["dur"])
            starts[key].append(true_start)
    assert ends and all(len(v) > 1 for v in ends.values()), "every collective is seen on several ranks"
    # Timestamps are written with 3 decimals (ns), so allow rounding of a few ns.
    assert all(max(v) - min(v) < 0.01 for v in ends.values()), "members of one collective end at the same true time"
    assert any(max(v) - min(v) > 1.0 for v in starts.values()), "arrival skew differs between ranks"


def test_node_ids_can_be_written_in_the_full_form(tmp_path: Path) -> None:
    done = _generate(tmp_path, "--node-id-format", "full")
    assert done.returncode == 0, done.stderr
    sidecar, trace = _load(tmp_path)[0]
    graphed = [e["args"] for e in trace["traceEvents"] if e.get("args", {}).get("graph id")]
    assert graphed
    assert all(a["graph node id"] >> 32 == a["graph id"] for a in graphed)


def test_unknown_template_is_a_clear_error(tmp_path: Path) -> None:
    done = _generate(tmp_path / "out", "--template", "no_such_trace.json.gz")
    assert done.returncode == 2
    assert "no_such_trace.json.gz" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_merge_attaches_every_collective_and_recovers_the_clocks(scaleset: Path, tmp_path: Path) -> None:
    """The set is what the merge benchmark runs on: the merge must take all of it."""
    from merging import merge
    from commtag.merge.pftrace.validate import validate_file

    result = merge(scaleset, tmp_path / "merged.pftrace", align="collectives", progress=False)
    assert validate_file(result.output) == []
    by_rank: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for inst in result.instances:
        by_rank[inst.rank][inst.source].append(inst)
    for sidecar, _ in _load(scaleset):
        mine = by_rank[sidecar.rank]
        assert len(mine["nccl-kernel"]) == len(sidecar.collectives)
        assert len(mine["graph-replay"]) == sum(len(c.replays) * len(c.collectives) for c in sidecar.captures)
        logged = {(c.collectives[0].annotation.pg_uid, r.index) for c in sidecar.captures for r in c.replays}
        assert logged <= {(i.pg_uid, i.replay) for i in mine["graph-replay"]}, "replay indices from the log"
    # each lane slice says what the kernel it came from says (flow from kernel to lane)
    from commtag.merge.pftrace.readback import read_trace
    from commtag.vocab import KERNEL_EAGER_KEYS

    slices = read_trace(result.output).slices
    source_of = {f: s for s in slices if s.name.startswith("nccl") for f in s.flows_out}
    lanes = [s for s in slices if "commtag source" in s.args]
    assert {s.args["commtag source"] for s in lanes} == {"nccl-kernel", "graph-replay"}
    for lane in lanes:
        (kernel,) = [source_of[f] for f in lane.flows_in if f in source_of]
        said = {k: v for k, v in kernel.args.items() if k in KERNEL_EAGER_KEYS or k.startswith("commtag ") or k == "Rank"}
        assert "Seq" in said and {k: lane.args[k] for k in said} == said
    truth = _manifest(scaleset)["clock_offset_us"]
    found = result.alignment.offsets
    for rank in range(RANKS):
        expected_ns = -(truth[rank] - truth[0]) * 1000
        assert abs((found[rank] - found[0]) - expected_ns) < 1000, f"rank {rank}: clock offset recovered within 1 us"


def test_regenerating_replaces_the_old_set_and_reuse_keeps_a_matching_one(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*GENERATOR, "--events", "4000", "-o", str(tmp_path), *args],
                              capture_output=True, text=True, timeout=120)

    assert run("--ranks", "4").returncode == 0
    assert run("--ranks", "2").returncode == 0
    assert [s.rank for s, _ in _load(tmp_path)] == [0, 1], "no rank of the 4-rank set is left behind"
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    again = run("--ranks", "2", "--reuse")
    assert again.returncode == 0 and json.loads(again.stdout)["ranks"] == 2
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_a_directory_of_foreign_traces_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "rank0.step1.pt.trace.json.gz"
    foreign.write_bytes(b"not ours")
    done = _generate(tmp_path)
    assert done.returncode == 2
    assert str(tmp_path) in done.stderr and foreign.read_bytes() == b"not ours"


def test_the_kernels_it_writes_are_read_as_their_collectives():
    """The generator's NCCL kernels and template kernels are named and read with commtag.vocab's rules."""
    from commtag.testing.scale.plan import NCCL_KERNEL_OF, kernel_op
    from commtag.vocab import COLLECTIVES, parse_nccl_kernel

    for op, kernel in NCCL_KERNEL_OF.items():
        assert parse_nccl_kernel(kernel).collective == COLLECTIVES[op].nccl_kernel, kernel
    assert kernel_op("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == ("allreduce", "Float")
    assert kernel_op("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == \
        ("_reduce_scatter_base", "BFloat16")
    assert kernel_op("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)") == \
        ("all_to_allv", "Float")  # SendRecv moves bytes: its name gives no data type
