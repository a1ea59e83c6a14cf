"""Real clients: Holistic Trace Analysis 0.5.0 and its successor traceinsight 0.6.1 read the
annotated per-rank JSON of `merge --json`.

HTA parses the eager NCCL keys ("Collective name", "In msg nelems", ...) into
columns when its communication args are enabled; a gloo trace carries none of
them until commtag attaches them. The test loads the merge's per-rank JSON of
the real gloo run (tests/sleep_world.py) with HTA and runs its communication
analysis on it. traceinsight installs the same module ``hta``, so it lives outside the venv's
site-packages (launch/setup.sh: ``.venv/traceinsight``) and both run in a subprocess
(tests/hta_client.py), each with its own ``hta``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sleep_world import DEFAULT_ALLREDUCES, NUMEL, WORLD

pytestmark = pytest.mark.slow

hta = pytest.importorskip(
    "hta.trace_analysis",
    reason="HolisticTraceAnalysis is not installed (launch/setup.sh installs it with --no-deps)",
)


@pytest.fixture(scope="module")
def annotated(sleep_run: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hta")
    done = subprocess.run(
        [sys.executable, "-m", "commtag", "merge", str(sleep_run), "-o", str(out / "merged.pftrace"),
         "--json", str(out / "json")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out / "json"


def test_hta_loads_the_annotated_ranks_and_sees_our_collectives(annotated):
    from hta.configs.parser_config import ParserConfig

    ParserConfig.enable_communication_args()
    analysis = hta.TraceAnalysis(trace_dir=str(annotated))
    assert sorted(analysis.t.get_all_traces()) == list(range(WORLD))
    symbols = analysis.t.symbol_table.get_sym_table()
    for rank in range(WORLD):
        df = analysis.t.get_trace(rank)
        comm = df[df["collective_name"].ne("")]
        names = comm["collective_name"].tolist()
        assert names.count("allreduce") >= DEFAULT_ALLREDUCES + 1, (rank, names)
        default = comm[(comm["collective_name"] == "allreduce") & (comm["group_size"] == WORLD)]
        assert len(default) >= DEFAULT_ALLREDUCES
        assert set(default["in_msg_nelems"]) == {NUMEL} and set(default["msg_dtype"]) == {"Float"}
        assert "_allgather_base" in names and "broadcast" in names
        # The annotated events are the gloo/c10d ones the profiler recorded.
        assert any("gloo" in symbols[i] or "c10d" in symbols[i] for i in comm["name"])

    # HTA's communication analysis runs on it (a CPU-only run overlaps nothing with GPU compute).
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    assert sorted(overlap["rank"]) == list(range(WORLD))


#: Where launch/setup.sh installs traceinsight (beside the venv's site-packages, not in it).
TRACEINSIGHT = Path(sys.prefix) / "traceinsight"


@pytest.mark.parametrize("client", ["HolisticTraceAnalysis 0.5.0", "traceinsight 0.6.1"])
def test_hta_and_traceinsight_see_our_collectives(annotated, client):
    env = dict(os.environ)
    if client.startswith("traceinsight"):
        if not (TRACEINSIGHT / "hta").is_dir():
            pytest.skip(f"traceinsight is not installed at {TRACEINSIGHT} (launch/setup.sh installs it)")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TRACEINSIGHT), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("hta_client.py")), str(annotated)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    version = Path(seen["module"]).parent / "version.py"
    assert f"({', '.join(client.split()[1].split('.'))})" in version.read_text(), (client, seen["module"])
    assert sorted(map(int, seen["ranks"])) == list(range(WORLD)) == seen["overlap_ranks"]
    for rank, comm in seen["ranks"].items():
        rows = list(zip(comm["collective_name"], comm["group_size"], comm["in_msg_nelems"], comm["msg_dtype"]))
        default = [row for row in rows if row[:2] == ("allreduce", WORLD)]
        assert len(default) >= DEFAULT_ALLREDUCES, (rank, rows)
        assert {row[2:] for row in default} == {(NUMEL, "Float")}
        assert "_allgather_base" in comm["collective_name"] and "broadcast" in comm["collective_name"]
        assert any("gloo" in name or "c10d" in name for name in comm["names"])
