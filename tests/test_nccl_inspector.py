"""NCCL Inspector dumps joined to the merged collectives (``--nccl-inspector``).

On a generated 8-rank set, with dumps shaped exactly as NCCL's plugin writes them for its
collectives (tests/inspector_dumps.py, each field citing NCCL's source; ``coll_sn`` counted per
NCCL function, as NCCL does): ranks 0-3 dump as they go with records of operations before the
profiled window, operations the traces do not show and no record of operations below the
plugin's minimum size; ranks 4-7 dump once at teardown; rank 0 also dumps records of a
communicator no trace shows. Every planted record joins exactly its
instance and no instance gets another's, what joined nothing is counted, the summary of the
directory and of the merged file agree, ``-j 2`` writes the same bytes, and a damaged dump stops
the merge in one line. On their own, a dump's records keep the order of its lines (NCCL's
completion order) whatever their ``coll_sn``, p2p lines are passed over, and a line in a layout
NCCL does not write is refused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.merge.engine.pipeline import collect
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.inspector import read_inspector
from commtag.merge.pftrace.readback import read_merged
from commtag.report.inputs import load
from commtag.report.tables import to_json
from inspector_dumps import write_dumps
from merging import merge

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("job")
    traces = root / "job"
    subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", "8", "--events", "20000",
                    "--ranks-per-node", "4", "-o", str(traces)], check=True, capture_output=True, timeout=300)
    _, instances = collect([traces])
    sidecars = [orjson.loads(path.read_bytes()) for path in traces.glob("*.commtag.json")]
    processes = {s["rank"]: (s["host"], s["pid"]) for s in sidecars}
    planted = write_dumps(instances, processes, root / "inspector", teardown_ranks=frozenset({4, 5, 6, 7}))
    return traces, root / "inspector", planted


def test_each_record_joins_its_own_instance(job, tmp_path: Path) -> None:
    traces, dumps, planted = job
    out = tmp_path / "merged.pftrace"
    result = merge(traces, out, analysis=True, nccl_inspector=dumps)
    instances, _, _ = read_merged(out)
    found = {(i.rank, i.pg_uid, i.seq, i.replay): i.arg("commtag nccl busbw GB/s") for i in instances}
    assert {key: value for key, value in found.items() if value is not None} == planted
    joined = [i for i in instances if i.arg("commtag nccl busbw GB/s") is not None]
    assert all(i.arg("commtag nccl timing source") == "kernel_gpu" and i.arg("commtag nccl exec us") == 42
               for i in joined)
    assert {r for r, *_ in planted} == set(range(8))
    # Ranks 0-3: per world communicator 2 records from before the window and 34 of operations the
    # traces do not show; the teardown dumps of ranks 4-7 join whole.
    assert ("ranks 0-3: NCCL Inspector: 36 of 120 records of communicator 'default_pg:0' joined no collective "
            "(operations before or after the profiled window, ones the traces do not show, or past a point where "
            "the order was ambiguous)") in result.notices
    assert not any("ranks 4-7" in n or "rank 4:" in n for n in result.notices if "Inspector" in n)
    # Rank 0's process also dumped 3 records of a communicator no trace shows.
    assert ("rank 0: NCCL Inspector: 3 records joined no collective: no trace here shows an NCCL collective of their "
            "communicator and rank ('pp:9')") in result.notices


def test_the_summary_gives_nccls_figures_beside_commtags(job, tmp_path: Path) -> None:
    traces, dumps, planted = job
    out = tmp_path / "merged.pftrace"
    merge(traces, out, analysis=True, nccl_inspector=dumps)
    notices: list[str] = []
    from_dir = orjson.loads(to_json(*load(traces, nccl_inspector=dumps, notices=notices)))
    assert any("36 of 120 records of communicator 'default_pg:0'" in n for n in notices)
    assert ("NCCL Inspector: 3 records joined no collective: no trace here shows an NCCL collective of their "
            "communicator and rank ('pp:9')") in notices
    from_file = orjson.loads(to_json(*load(out)))
    assert [r["nccl"] for r in from_file["collectives"]] == [r["nccl"] for r in from_dir["collectives"]]
    with_nccl = [r for r in from_dir["collectives"] if r["nccl"]]
    assert with_nccl
    for r in with_nccl:  # the rank commtag measures busbw on (the last arrival) where it has a record
        nccl = r["nccl"]
        assert set(nccl) == {"busbw_gbps", "algbw_gbps", "exec_time_us", "source", "rank"}
        assert nccl["algbw_gbps"] == pytest.approx(nccl["busbw_gbps"] / 2)
        own = (r["last_rank"], r["pg"], r["seq"], r["replay"])
        assert nccl["rank"] == r["last_rank"] if own in planted else nccl["rank"] != r["last_rank"]
        assert nccl["busbw_gbps"] == planted[(nccl["rank"], r["pg"], r["seq"], r["replay"])]


def test_workers_write_the_joined_figures_alike(job, tmp_path: Path) -> None:
    traces, dumps, _ = job
    runs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}.pftrace"
        done = subprocess.run([sys.executable, "-m", "commtag.merge", str(traces), "-o", str(out), "-j", jobs,
                               "--nccl-inspector", str(dumps), "--no-progress"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append(out.read_bytes())
    assert runs[0] == runs[1] and b"commtag nccl busbw GB/s" in runs[0]


def test_a_damaged_dump_stops_the_merge_in_one_line(job, tmp_path: Path) -> None:
    traces, dumps, _ = job
    bad = tmp_path / "inspector"
    bad.mkdir()
    for path in dumps.iterdir():
        (bad / path.name).write_bytes(path.read_bytes())
    victim = sorted(bad.iterdir())[0]
    victim.write_bytes(victim.read_bytes() + b"{not json\n")
    out = tmp_path / "merged.pftrace"
    for command in (["merge", str(traces), "-o", str(out)], ["summary", str(traces)]):
        done = subprocess.run([sys.executable, "-m", "commtag", *command, "--nccl-inspector", str(bad)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        lines = [line for line in done.stderr.splitlines() if str(victim) in line]
        assert len(lines) == 1 and "is not JSON" in lines[0], done.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["inspector"]


def _line(coll: str, sn: int, *, version: str = "v4.0", dump_us: int = 7) -> dict:
    """One line as NCCL's inspector_json.cc (inspectorCommInfoDumpColl, 5067397c) writes it."""
    return {"header": {"id": "0x5", "comm_name": "default_pg:0", "rank": 1, "n_ranks": 2, "nnodes": 1},
            "metadata": {"inspector_output_format_version": version, "git_rev": "0000000",
                         "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": dump_us,
                         "hostname": "node0", "pid": 11},
            "coll_perf": {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": 4096, "coll_exec_time_us": 3,
                          "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 1.5, "coll_busbw_gbs": 2.25}}


def _write(folder: Path, docs: list[dict]) -> Path:
    folder.mkdir()
    (folder / "node0-pid11.log").write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return folder


def test_records_keep_nccls_completion_order_across_functions(tmp_path: Path) -> None:
    # NCCL numbers each function apart: AllReduce 0, 1, 2 and AllGather 0, 1 interleaved.
    order = [("AllReduce", 0), ("AllReduce", 1), ("AllGather", 0), ("AllReduce", 2), ("AllGather", 1)]
    p2p = {"header": _line("AllReduce", 0)["header"], "metadata": _line("AllReduce", 0)["metadata"],
           "p2p_perf": {"p2p": "Send", "p2p_sn": 1, "p2p_peer": 0, "p2p_msg_size_bytes": 64}}
    docs = [_line(coll, sn, dump_us=10 + k) for k, (coll, sn) in enumerate(order)]
    dumps = read_inspector(_write(tmp_path / "d", docs[:2] + [p2p] + docs[2:]))
    assert [(r.coll, r.sn) for r in dumps[("default_pg:0", 1)]] == order
    assert dumps[("default_pg:0", 1)][0].exec_us == 3.0 and dumps[("default_pg:0", 1)][0].dump_ns == 10_000


@pytest.mark.parametrize("doc", [
    {"dump_stats": {"header": _line("AllReduce", 0)["header"], "metadata": _line("AllReduce", 0)["metadata"]}},
    {"coll_perf": _line("AllReduce", 0)["coll_perf"]},
    _line("AllReduce", 0, version="v4.3"),
], ids=["header-once", "perf-alone", "version"])
def test_a_layout_nccl_does_not_write_is_refused(tmp_path: Path, doc: dict) -> None:
    folder = _write(tmp_path / "d", [_line("AllReduce", 0), doc])
    with pytest.raises(MergeInputError) as caught:
        read_inspector(folder)
    assert "node0-pid11.log" in str(caught.value) and "line 2" in str(caught.value)
