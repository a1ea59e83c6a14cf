"""torchrun with 2 merge workers writes what the single-process merge writes.

Not byte for byte: each worker writes its ranks on a packet sequence of its
own, so interned ids differ. Every track, slice, arg and flow must be equal.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.merge.pftrace.readback import read_trace
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES
from torchrun_merge import in_started_workers, torchrun_merge, traceback_in_commtag

pytestmark = pytest.mark.slow

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"


def _assert_same_trace(got: Path, expected: Path) -> None:
    """Every track, slice (name, times, args, flows, depth) equal, as the UI would show them."""
    one, two = read_trace(expected), read_trace(got)
    assert two.tracks == one.tracks
    assert len(two.slices) == len(one.slices) > 1000
    assert two.slices == one.slices


def test_two_workers_equal_one(tmp_path: Path) -> None:
    single = tmp_path / "single.pftrace"
    one = subprocess.run([sys.executable, "-m", "commtag.merge", str(DLRM), "-o", str(single), "--align",
                          "collectives", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    double = tmp_path / "double.pftrace"
    proc = torchrun_merge([str(DLRM), "-o", str(double), "--align", "collectives", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert validate_file(double) == []
    _assert_same_trace(double, single)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["double.pftrace", "single.pftrace"]


def test_one_torchrun_worker_is_one_merge_process_whatever_j_says(tmp_path: Path) -> None:
    """-j is ignored under torchrun, also when it starts one worker: that worker merges alone, not
    with -j's default (2 workers here for big inputs)."""
    marker = tmp_path / "started"
    env = {"PYTHONPATH": in_started_workers(tmp_path, f"open({str(marker)!r}, 'a').write('worker\\n')")}
    out = tmp_path / "one.pftrace"
    proc = torchrun_merge([str(DLRM), "-o", str(out), "-j", "2", "--no-progress"], workers=1, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert validate_file(out) == []
    assert not marker.exists(), "the torchrun worker started -j workers of its own"
    # The same command outside torchrun does start them (what makes the check above mean something).
    plain = subprocess.run([sys.executable, "-m", "commtag.merge", str(DLRM), "-o", str(tmp_path / "two.pftrace"),
                            "-j", "2", "--no-progress"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env})
    assert plain.returncode == 0, plain.stderr
    assert marker.read_text() == "worker\n"


def test_a_bad_rank_stops_every_worker(tmp_path: Path) -> None:
    for r in range(4):
        (tmp_path / f"rank{r}.json").symlink_to(next(DLRM.glob(f"worker{r}_*")))
    (tmp_path / "rank3.json").unlink()
    (tmp_path / "rank3.json").write_text('{"traceEvents": 5}')
    out = tmp_path / "out.pftrace"
    proc = torchrun_merge([str(tmp_path), "-o", str(out), "--no-progress"])
    assert proc.returncode != 0
    assert "rank3.json: not a profiler trace" in proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.pftrace*"))


def test_skipped_ranks_are_the_same_under_two_workers(tmp_path: Path) -> None:
    # rank 3's trace breaks mid-file, so worker 1 finds it while converting, not at discovery
    inputs = tmp_path / "in"
    inputs.mkdir()
    for r in range(4):
        source = next(DLRM.glob(f"worker{r}_*"))
        if r == 3:
            trace = orjson.loads(gzip.decompress(source.read_bytes()) if source.suffix == ".gz" else source.read_bytes())
            timed = [e for e in trace["traceEvents"] if "ts" in e]
            timed[len(timed) // 2]["ts"] = -5
            (inputs / "rank3.json").write_bytes(orjson.dumps(trace))
        else:
            (inputs / f"rank{r}{''.join(source.suffixes)}").symlink_to(source)
    single, double = tmp_path / "single.pftrace", tmp_path / "double.pftrace"
    one = subprocess.run([sys.executable, "-m", "commtag.merge", str(inputs), "-o", str(single), "--skip-bad-ranks",
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    proc = torchrun_merge([str(inputs), "-o", str(double), "--skip-bad-ranks", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    for out in (one.stdout, proc.stdout):
        assert ": 3 ranks," in out
    skipped = [line for line in proc.stderr.splitlines() if "skipped:" in line]
    assert len(skipped) == 1 and "rank3.json" in skipped[0] and "rank 3 skipped" in skipped[0]
    _assert_same_trace(double, single)


def test_a_worker_failing_on_its_lanes_stops_every_worker(tmp_path: Path) -> None:
    # Worker 1's disk fills up while it writes the lanes of its ranks, after its rank blocks.
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import errno, os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    from commtag.merge.pftrace import lanes\n"
        "    def write(self, stream, *args, **kwargs):\n"
        "        stream.write(b'\\x0a\\x05half')\n"
        "        raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "    lanes.LanesWriter.write = write\n"
    )
    out = tmp_path / "out" / "merged.pftrace"
    out.parent.mkdir()
    out.write_bytes(b"previous")
    pythonpath = os.pathsep.join(filter(None, [str(inject), os.environ.get("PYTHONPATH")]))
    proc = torchrun_merge([str(DLRM), "-o", str(out), "--no-progress"], env={"PYTHONPATH": pythonpath})
    assert proc.returncode != 0
    assert f"commtag merge: error: {out}: cannot write the output: No space left on device" in proc.stderr
    assert proc.stderr.count("commtag merge: error:") == 1  # worker 0 says why every worker stopped
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in out.parent.iterdir()) == ["merged.pftrace"]  # no shard or temporary left


def test_a_bad_input_is_one_line_and_every_worker_exits_2(tmp_path: Path) -> None:
    """What a user sees: commtag's line once (worker 0), then torchrun's own report of the failed
    workers (each with exit code 2), and torchrun's exit status for failed workers, 1."""
    for r in range(2):
        (tmp_path / f"rank{r}.json.gz").symlink_to(next(DLRM.glob(f"worker{r}_*")))
    (tmp_path / "rank2.json").write_text('{"traceEvents": 5}')
    out = tmp_path / "out.pftrace"
    proc = torchrun_merge([str(tmp_path), "-o", str(out), "--no-progress"])
    seen = proc.stdout + proc.stderr
    assert [line for line in seen.splitlines() if line.startswith("commtag merge:")] == [
        f"commtag merge: error: {tmp_path / 'rank2.json'}: not a profiler trace: no traceEvents list"
    ]
    assert not traceback_in_commtag(seen)
    exits = dict(re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*: (-?\d+)", proc.stderr))
    assert exits == {"0": "2", "1": "2"}, proc.stderr[-3000:]
    assert proc.returncode == 1  # torchrun's own status when a worker failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json.gz", "rank1.json.gz", "rank2.json"]


def test_a_record_it_cannot_read_is_the_same_notice_under_two_workers(tmp_path: Path) -> None:
    """A generated 4-rank job whose rank 1 wrote a Seq beyond int64: two torchrun workers merge it
    (no TypeError packing the Seq) and say the one process's notice of the record, once."""
    from commtag.testing.nccl2 import JobCall, JobGroup, job_trace

    world = JobGroup("0", "default_pg", (0, 1, 2, 3))
    job = [JobCall("allreduce", world, (8,)) for _ in range(3)]
    folder = tmp_path / "in"
    folder.mkdir()
    for rank in range(4):
        trace = job_trace(job, rank, 4, "legacy")
        if rank == 1:
            for e in trace["traceEvents"]:
                if (e.get("args") or {}).get("Seq") == 2:
                    e["args"]["Seq"] = 2**70
        (folder / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))

    def said(stderr: str) -> list[str]:
        return [line for line in stderr.splitlines() if "cannot read" in line]
    one = subprocess.run([sys.executable, "-m", "commtag.merge", str(folder), "-o", str(tmp_path / "one.pftrace"),
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    two = torchrun_merge([str(folder), "-o", str(tmp_path / "two.pftrace"), "--no-progress"])
    assert two.returncode == 0 and not traceback_in_commtag(two.stderr), two.stderr[-3000:]
    assert said(two.stderr) == said(one.stderr) and len(said(one.stderr)) == 1, (one.stderr, two.stderr[-3000:])
