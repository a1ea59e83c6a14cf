"""``commtag merge -j N``: N merge worker processes on one host write the trace one process writes.

Byte for byte (each worker writes whole segments of ranks, commtag.merge.engine.segments), and
read back every track, slice, arg and flow equal; a failure in any worker must read as one
error, with nothing left behind.
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commtag.merge.errors import MergeFailed
from commtag.merge.pftrace.readback import read_trace
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES
from torchrun_merge import ctrl_c_as_at_a_terminal, in_started_workers

pytestmark = pytest.mark.slow

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"


def _merge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commtag.merge", *args, "--no-progress"], capture_output=True,
                          text=True, timeout=300)


def _assert_same_trace(got: Path, expected: Path) -> None:
    """Every track and slice (name, times, args, flows, depth) equal, as the UI would show them
    (slices that start together on different tracks may come in another order in the file)."""
    one, two = read_trace(expected), read_trace(got)
    assert two.tracks == one.tracks
    assert len(two.slices) == len(one.slices) > 1000
    assert sorted(two.slices, key=_place) == sorted(one.slices, key=_place)


def _place(s) -> tuple:
    return s.ts, s.track, s.end, s.name, s.depth


@pytest.mark.parametrize("jobs", ["2", "3"])
def test_workers_write_what_one_process_writes(tmp_path: Path, jobs: str) -> None:
    single, several = tmp_path / "single.pftrace", tmp_path / "several.pftrace"
    one = _merge(str(DLRM), "-o", str(single), "--align", "collectives", "-j", "1")
    assert one.returncode == 0, one.stderr
    many = _merge(str(DLRM), "-o", str(several), "--align", "collectives", "-j", jobs)
    assert many.returncode == 0, many.stderr
    assert validate_file(several) == []
    _assert_same_trace(several, single)
    assert several.read_bytes() == single.read_bytes()
    assert many.stderr == one.stderr  # the same notices, accounts and alignment, said once
    assert many.stdout.replace("several", "single") == one.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["several.pftrace", "single.pftrace"]


def test_what_a_worker_notices_while_reading_its_ranks_is_said(tmp_path: Path) -> None:
    # Every DLRM rank holds ProfilerStep#10; in this copy ranks 0-3 hold it as step 12, so ranks 4-7
    # (worker 1's) hold none of --steps 12: each file's notice comes from the worker reading it.
    job = tmp_path / "job"
    job.mkdir()
    for path in DLRM.iterdir():
        data = path.read_bytes()
        if path.name.startswith(("worker0_", "worker1_", "worker2_", "worker3_")):
            data = gzip.compress(gzip.decompress(data).replace(b'"ProfilerStep#10"', b'"ProfilerStep#12"'))
        (job / path.name).write_bytes(data)
    one = _merge(str(job), "-o", str(tmp_path / "one.pftrace"), "--steps", "12", "-j", "1")
    two = _merge(str(job), "-o", str(tmp_path / "two.pftrace"), "--steps", "12", "-j", "2")
    assert one.returncode == two.returncode == 0, two.stderr
    assert "worker7_step_12" in one.stderr and "none of --steps 12 is in it" in one.stderr
    assert two.stderr == one.stderr


def test_a_bad_rank_in_another_worker_stops_the_merge(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for r in range(4):
        (inputs / f"rank{r}.json").symlink_to(next(DLRM.glob(f"worker{r}_*")))
    (inputs / "rank3.json").unlink()
    (inputs / "rank3.json").write_text('{"traceEvents": 5}')  # worker 1's share: ranks 2 and 3
    out = tmp_path / "out" / "merged.pftrace"
    out.parent.mkdir()
    out.write_bytes(b"previous")
    proc = _merge(str(inputs), "-o", str(out), "-j", "2")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("commtag merge: error:")]
    assert len(errors) == 1 and "rank3.json: not a profiler trace" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in out.parent.iterdir()) == ["merged.pftrace"]  # no part, shard or exchange left


def test_an_output_folder_that_is_missing_reads_as_with_one_process(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "merged.pftrace"
    one, two = _merge(str(DLRM), "-o", str(out), "-j", "1"), _merge(str(DLRM), "-o", str(out), "-j", "2")
    assert one.returncode == two.returncode == 2
    assert two.stderr == one.stderr == f"commtag merge: error: {out}: cannot write the output: No such file or directory\n"
    assert list(tmp_path.iterdir()) == []


def test_skipped_ranks_are_the_same_under_two_workers(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for r in range(4):
        source = next(DLRM.glob(f"worker{r}_*"))
        (inputs / f"rank{r}{''.join(source.suffixes)}").symlink_to(source)
    (inputs / "rank3.json").write_text('{"traceEvents": 5}')  # a second rank 3, unreadable
    single, double = tmp_path / "single.pftrace", tmp_path / "double.pftrace"
    one = _merge(str(inputs), "-o", str(single), "--skip-bad-ranks", "-j", "1")
    two = _merge(str(inputs), "-o", str(double), "--skip-bad-ranks", "-j", "2")
    assert one.returncode == two.returncode == 0, two.stderr
    skipped = [line for line in two.stderr.splitlines() if "skipped:" in line]
    assert len(skipped) == 1 and "rank3.json" in skipped[0]
    _assert_same_trace(double, single)


def _in_the_background() -> None:
    """``preexec_fn``: start as a shell's ``&`` does, SIGINT ignored (inherited by the -j workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("stop, status, said, start", [
    (signal.SIGINT, 130, "interrupted", ctrl_c_as_at_a_terminal),
    (signal.SIGTERM, 143, "terminated", ctrl_c_as_at_a_terminal),
    # Worker 0 stopped the workers it started with SIGINT, which a background merge's ignore:
    # worker 1 wrote on, then found worker 0 gone, and its part stayed behind.
    (signal.SIGTERM, 143, "terminated", _in_the_background),
], ids=["ctrl-c", "sigterm", "sigterm-in-the-background"])
def test_an_interrupted_merge_stops_its_workers_and_leaves_nothing(tmp_path: Path, stop: int, status: int,
                                                                   said: str, start) -> None:
    inputs = tmp_path / "set"
    made = subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", "4", "--events", "200000",
                           "--ranks-per-node", "1", "-o", str(inputs)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "commtag.merge", str(inputs), "-o", str(out_dir / "m.pftrace"),
                             "-j", "2", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=start)
    deadline = time.monotonic() + 120
    # Both workers are writing their ranks: two parts with bytes in them.
    while len([p for p in out_dir.glob(".m.pftrace.tmp-*") if p.stat().st_size > 0]) < 2:
        assert proc.poll() is None, f"the merge ended before it was interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline, "the workers never started writing"
        time.sleep(0.005)
    proc.send_signal(stop)  # to worker 0 alone: it stops the worker it started
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert err.splitlines() == [f"commtag merge: {said}; no file was changed"]
    assert list(out_dir.iterdir()) == []


def test_a_worker_that_crashes_stops_the_merge_naming_why(tmp_path: Path) -> None:
    pythonpath = in_started_workers(tmp_path, "from commtag.merge.pftrace import lanes\n"
                                                "def write(self, *args, **kwargs):\n"
                                                "    raise RuntimeError('boom')\n"
                                                "lanes.LanesWriter.write = write\n")
    out = tmp_path / "out" / "merged.pftrace"
    out.parent.mkdir()
    out.write_bytes(b"previous")
    proc = subprocess.run([sys.executable, "-m", "commtag.merge", str(DLRM), "-o", str(out), "-j", "2", "--no-progress"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": pythonpath})
    assert proc.returncode == 2
    assert proc.stderr.count("commtag merge: error:") == 1, proc.stderr
    assert "merge worker 1 stopped (exit status 1): RuntimeError: boom" in proc.stderr
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in out.parent.iterdir()) == ["merged.pftrace"]


@pytest.mark.parametrize("mode", ["r+b", "wb"])
def test_appending_a_part_puts_its_bytes_where_the_output_ends(tmp_path: Path, mode: str) -> None:
    """Worker 0 appends the other parts with copy_file_range (kernel-side, outside Python's
    buffer): every byte lands after what the output held, and what is written next follows it."""
    from commtag.merge.engine.output import append_file

    part = tmp_path / "part"
    part.write_bytes(os.urandom(3 << 20))
    out = tmp_path / "out"
    out.write_bytes(b"ranks of worker 0")
    with open(out, mode) as sink:
        if mode == "r+b":
            sink.seek(0, os.SEEK_END)
        else:
            sink.write(b"header")  # still in the buffer when the copy starts
        with open(part, "rb") as source:
            append_file(source, sink)
        sink.write(b"lanes")
    head = b"ranks of worker 0" if mode == "r+b" else b"header"
    assert out.read_bytes() == head + part.read_bytes() + b"lanes"


def _children() -> set[int]:
    """This process's child processes (Linux: /proc/self/task/*/children)."""
    return {int(pid) for task in Path("/proc/self/task").iterdir()
            for pid in (task / "children").read_text().split()}


def test_workers_asked_for_start_while_worker_0_discovers_and_go_when_not_needed(tmp_path: Path, monkeypatch) -> None:
    """-j N: the other interpreters start before discovery, so that their imports do not delay
    their first rank; those discovery shows are not needed (2 ranks, -j 3) exit, and a merge
    that fails before its workers get their share leaves none behind."""
    from commtag.merge import merge
    from commtag.merge.engine import jobs, pipeline

    inputs = tmp_path / "in"
    inputs.mkdir()
    for r in range(2):
        (inputs / f"rank{r}.json").symlink_to(next(DLRM.glob(f"worker{r}_*")))
    before = _children()
    seen: list[int] = []
    discover = pipeline.discover

    def watched(*args, **kwargs):
        seen.append(len(_children() - before))
        return discover(*args, **kwargs)

    monkeypatch.setattr(pipeline, "discover", watched)
    monkeypatch.setattr(jobs, "usable_cpus", lambda: 8, raising=False)  # as many started ahead as asked for, on any machine
    result = merge(inputs, tmp_path / "merged.pftrace", jobs=3, progress=False)
    assert result.ranks == [0, 1] and seen == [2]
    assert _children() - before == set()
    with pytest.raises(MergeFailed, match="no such file or directory"):
        merge(tmp_path / "missing", tmp_path / "other.pftrace", jobs=2, progress=False)
    assert _children() - before == set()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "merged.pftrace"]


def test_workers_take_the_ranks_worker_0_discovered(tmp_path: Path) -> None:
    """Discovery reads every file's head (and sidecar head): the other workers take what worker 0
    found instead of reading them all again before their first rank."""
    pythonpath = in_started_workers(tmp_path, "from commtag.merge.engine import pipeline\n"
                                                "def discover(*args, **kwargs):\n"
                                                "    raise RuntimeError('discovered again')\n"
                                                "pipeline.discover = discover\n")
    single, double = tmp_path / "single.pftrace", tmp_path / "double.pftrace"
    one = _merge(str(DLRM), "-o", str(single), "-j", "1")
    two = subprocess.run([sys.executable, "-m", "commtag.merge", str(DLRM), "-o", str(double), "-j", "2",
                          "--no-progress"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": pythonpath})
    assert one.returncode == two.returncode == 0, two.stderr
    assert two.stderr == one.stderr
    _assert_same_trace(double, single)
