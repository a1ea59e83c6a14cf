"""One merge, whatever the number of workers: the same result and the same bytes.

Generated jobs (odd and even rank counts, several tensor- and data-parallel groups, ranks whose
files are missing, CUDA-graph replays) are merged with ``jobs=1, 2, 3``, with the analysis's
buckets and pieces drawn small (in every worker) so that their edges fall inside the job, and a
worker's records held as objects up to a drawn bound (0: all packed). Every worker count must give the lead
the same :class:`MergeResult` (ranks, slices, accounts, notices, the instances read back with their
figures, the findings, busbw, impact and all-to-all traffic) and the same file. Then torchrun's
2 workers return that result too.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commtag.merge import MergeResult, merge
from commtag.merge.engine import routes, shards
from commtag.testing.scaleset import generate
from merge_results import said
from torchrun_merge import in_started_workers, torchrun_command

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("COMMTAG_ONE_RESULT_EXAMPLES", "6"))


@st.composite
def jobs(draw: st.DrawFn) -> dict:
    ranks = draw(st.integers(3, 9))
    tp = draw(st.sampled_from([d for d in range(1, ranks + 1) if ranks % d == 0]))
    missing = draw(st.sets(st.integers(0, ranks - 1), max_size=ranks - 2))
    return {"ranks": ranks, "tp": tp, "missing": sorted(missing), "seed": draw(st.integers(0, 3)),
            "events": draw(st.integers(1500, 4000)), "graphs": draw(st.sampled_from([0.0, 0.05, 0.3])),
            "bucket_rows": draw(st.sampled_from([1, 7, 64, shards.BUCKET_ROWS])),
            "piece_rows": draw(st.sampled_from([3, routes.PIECE_ROWS])),
            "held": draw(st.sampled_from([0, 50, routes.HELD_AS_OBJECTS]))}


def _generate(spec: dict, folder: Path) -> Path:
    job = folder / "job"
    generate(job, spec["ranks"], spec["events"], seed=spec["seed"], graph_fraction=spec["graphs"], tp=spec["tp"])
    for rank in spec["missing"]:  # a rank whose files never arrived: its groups' collectives lack a member
        for path in job.glob(f"rank{rank}.*"):
            path.unlink()
    return job


def _run(job: Path, out: Path, workers: int) -> MergeResult:
    """What :func:`commtag.merge.merge` with ``jobs=workers`` returns, the output renamed to one name."""
    result = merge(job, out, jobs=workers, progress=False)
    assert result.lead
    return result


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(spec=jobs())
def test_any_number_of_workers_returns_one_result_and_writes_one_file(spec: dict, tmp_path_factory,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path_factory.mktemp("one-result")
    job = _generate(spec, folder)
    # The analysis's buckets and pieces drawn small, and a worker's records held as objects up to a
    # drawn bound (packed beyond it), here and in the workers -j starts.
    small = (f"from commtag.merge.engine import routes, shards\n"
             f"shards.BUCKET_ROWS = {spec['bucket_rows']}\nroutes.SEAL_ROWS = routes.PIECE_ROWS = {spec['piece_rows']}\n"
             f"routes.HELD_AS_OBJECTS = {spec['held']}")
    monkeypatch.setenv("PYTHONPATH", in_started_workers(folder, small))
    saved = shards.BUCKET_ROWS, routes.SEAL_ROWS, routes.PIECE_ROWS, routes.HELD_AS_OBJECTS
    shards.BUCKET_ROWS, routes.SEAL_ROWS, routes.PIECE_ROWS, routes.HELD_AS_OBJECTS = \
        spec["bucket_rows"], spec["piece_rows"], spec["piece_rows"], spec["held"]
    try:
        results = {workers: _run(job, folder / f"j{workers}.pftrace", workers) for workers in (1, 2, 3)}
    finally:
        shards.BUCKET_ROWS, routes.SEAL_ROWS, routes.PIECE_ROWS, routes.HELD_AS_OBJECTS = saved
    one = results[1]
    assert one.instances and one.slices == len(one.instances)
    assert len(one.ranks) == spec["ranks"] - len(spec["missing"])
    for workers in (2, 3):
        assert results[workers].output.read_bytes() == one.output.read_bytes(), workers
        assert said(results[workers]) == said(one), workers


def test_the_facade_returns_one_result_for_any_jobs_and_torchrun(tmp_path: Path) -> None:
    job = _generate({"ranks": 5, "tp": 5, "missing": [3], "seed": 1, "events": 6000, "graphs": 0.2}, tmp_path)
    one = merge(job, tmp_path / "j1.pftrace", jobs=1, progress=False)
    assert one.instances and one.analysis is not None
    for jobs in (2, 3):
        several = merge(job, tmp_path / f"j{jobs}.pftrace", jobs=jobs, progress=False)
        assert several.output.read_bytes() == one.output.read_bytes()
        assert said(several) == said(one), jobs
    torchrun, told = tmp_path / "torchrun.pftrace", tmp_path / "torchrun.json"
    cmd, env = torchrun_command([], 2)  # its workers run merge_results.py instead of the CLI
    cmd = cmd[:-2] + [str(Path(__file__).with_name("merge_results.py")), str(job), str(torchrun), str(told)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert torchrun.read_bytes() == one.output.read_bytes()
    assert orjson.loads(told.read_bytes()) == said(one)
