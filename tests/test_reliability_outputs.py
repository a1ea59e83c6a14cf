"""The merge's outputs never destroy its inputs, and what it leaves behind is cleaned up.

Driven through ``python -m commtag.merge`` on real traces: a 4-rank gloo run
with sidecars, public DLRM traces, and a scale set made by
commtag.testing.scaleset, large enough that a merge of it is still writing
when the test signals it (the test waits for its temporary file to appear).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES
from torchrun_merge import ctrl_c_as_at_a_terminal, torchrun_command

pytestmark = pytest.mark.slow

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"


def _merge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commtag.merge", "--no-progress", *args],
                          capture_output=True, text=True, timeout=300)


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "commtag.merge", "--no-progress", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_as_at_a_terminal)


def _temporaries(directory: Path, name: str) -> list[Path]:
    return sorted(directory.glob(f".{name}.tmp-*"))


def _wait_for_temporary(proc: subprocess.Popen, directory: Path, name: str) -> Path:
    """The merge's temporary output, once it holds bytes (the merge is then writing ranks)."""
    deadline = time.monotonic() + 120
    while not (found := [p for p in _temporaries(directory, name) if p.stat().st_size > 0]):
        assert proc.poll() is None, f"the merge ended before its temporary appeared: {proc.communicate()}"
        assert time.monotonic() < deadline, "no temporary output appeared"
        time.sleep(0.005)
    return found[0]


def _snapshot(*dirs: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry's kind and bytes (a pipe's or link's target, not its data)."""
    out = {}
    for d in dirs:
        for p in sorted(d.iterdir()):
            if p.is_dir() and not p.is_symlink():
                continue
            if p.is_symlink():
                out[str(p)] = ("link", os.readlink(p).encode())
            elif p.is_fifo():
                out[str(p)] = ("fifo", b"")
            else:
                out[str(p)] = ("file", p.read_bytes())
    return out


@pytest.fixture
def gloo(sleep_run: Path, tmp_path: Path) -> Path:
    """A copy of a real 4-rank gloo run (traces and sidecars) the test may change."""
    d = tmp_path / "traces"
    shutil.copytree(sleep_run, d)
    return d


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dlrm")
    for src in sorted(DLRM.iterdir())[:2]:
        (d / src.name).symlink_to(src)
    return d


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A generated 4-rank scale set: a few seconds to merge on the CI machines."""
    out = tmp_path_factory.mktemp("scale") / "set"
    done = subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", "4", "--events", "200000",
                           "--ranks-per-node", "1", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def _input_trace(d: Path) -> Path:
    return next(d.glob("rank0*.pt.trace.json.gz"))


def _sidecar(d: Path) -> Path:
    return next(d.glob("rank0*.commtag.json"))


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _below(d: Path) -> Path:
    (d / "out").mkdir()
    return d / "out"


def _device(tmp: Path) -> Path:
    (tmp / "null").symlink_to(os.devnull)  # a character device, reached through a link
    return tmp / "null"


_REPLACED = "not a regular file: the merge would replace it"
_READ = ("the output lies where the merge reads its inputs (a .json or .json.gz under an input folder, a sidecar "
         "beside an input trace): the next merge would read it as one")


@pytest.mark.parametrize("name, target, says", [
    ("an input trace", lambda d, tmp: _input_trace(d), "the output is an input of this merge: the merge would overwrite it"),
    ("a sidecar", lambda d, tmp: _sidecar(d), "the output is an input of this merge: the merge would overwrite it"),
    ("a pipe", lambda d, tmp: _fifo(tmp), f"the output is a pipe (FIFO), {_REPLACED}"),
    ("a character device", lambda d, tmp: _device(tmp), f"the output is a character device, {_REPLACED}"),
    ("a trace name in the input directory", lambda d, tmp: d / "merged.json", _READ),
    ("a trace name in a folder below the input", lambda d, tmp: _below(d) / "merged.json.gz", _READ),
])
def test_an_output_that_would_harm_an_input_is_refused(gloo: Path, tmp_path: Path, name: str,
                                                         target: Callable[[Path, Path], Path], says: str) -> None:
    out = target(gloo, tmp_path)
    before = _snapshot(gloo, tmp_path)
    done = _merge(str(gloo), "-o", str(out))
    assert done.returncode == 2, (name, done.stderr)
    assert done.stderr.splitlines() == [f"commtag merge: error: {out}: {says}"]
    assert _snapshot(gloo, tmp_path) == before  # nothing written, nothing replaced


def test_json_into_another_input_directory_is_refused(gloo: Path, tmp_path: Path) -> None:
    second = tmp_path / "more"
    second.mkdir()
    for p in gloo.glob("rank[23]*"):
        p.rename(second / p.name)
    before = _snapshot(gloo, second)
    done = _merge(str(gloo), str(second), "-o", str(tmp_path / "out.pftrace"), "--json", str(second))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"commtag merge: error: {second}: --json's folder lies where the merge reads its inputs (an input folder "
        "or one under it): the next merge would read the annotated copies as traces"
    ]
    assert _snapshot(gloo, second) == before and not (tmp_path / "out.pftrace").exists()


def test_json_over_a_pipe_is_refused(gloo: Path, tmp_path: Path) -> None:
    json_dir = tmp_path / "annotated"
    json_dir.mkdir()
    pipe = json_dir / _input_trace(gloo).name
    os.mkfifo(pipe)
    done = _merge(str(gloo), "--json", str(json_dir))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"commtag merge: error: {pipe}: --json's file is a pipe (FIFO), not a regular file: the merge would replace it"
    ]
    assert pipe.is_fifo() and not (gloo / "merged.pftrace").exists()


def test_the_default_output_in_the_input_directory_still_works(gloo: Path) -> None:
    for _ in range(2):  # the second merge does not read the first one's output
        done = _merge(str(gloo))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"{gloo / 'merged.pftrace'}: 4 ranks")
    assert validate_file(gloo / "merged.pftrace") == []


def test_the_next_merge_removes_a_killed_merges_temporary_but_not_a_running_ones(big: Path, dlrm: Path,
                                                                                   tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    killed = _start(str(big), "-o", str(out_dir / "killed.pftrace"))
    left = _wait_for_temporary(killed, out_dir, "killed.pftrace")
    killed.kill()
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert left.stat().st_size > 0  # SIGKILL: no cleanup ran
    running = _start(str(big), "-o", str(out_dir / "running.pftrace"))
    try:
        live = _wait_for_temporary(running, out_dir, "running.pftrace")
        running.send_signal(signal.SIGSTOP)  # alive, and holding its temporary, while the next merge runs
        done = _merge(str(dlrm), "-o", str(out_dir / "small.pftrace"))
        assert done.returncode == 0, done.stderr
        assert not left.exists()
        assert live.exists()
    finally:
        running.send_signal(signal.SIGCONT)
    _, err = running.communicate(timeout=300)
    assert running.returncode == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["running.pftrace", "small.pftrace"]


def test_ctrl_c_says_one_line_exits_130_and_keeps_the_previous_output(big: Path, dlrm: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged.pftrace"
    assert _merge(str(dlrm), "-o", str(out)).returncode == 0
    previous = out.read_bytes()
    proc = _start(str(big), "-o", str(out))
    _wait_for_temporary(proc, tmp_path, out.name)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.splitlines() == ["commtag merge: interrupted; no file was changed"]
    assert out.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged.pftrace"]


def test_the_next_merge_removes_what_a_killed_torchrun_merge_left(big: Path, dlrm: Path, tmp_path: Path) -> None:
    """SIGKILL to torchrun and its workers while they write their ranks (the second pass of
    --align collectives, after their first exchange): their shards and exchange folder stay, and
    the next merge into that folder removes them."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    cmd, env = torchrun_command([str(big), "-o", str(out_dir / "merged.pftrace"), "--align", "collectives",
                                 "--no-progress"])
    launch = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while len(writing := [p for p in _temporaries(out_dir, "merged.pftrace") if p.stat().st_size > 0]) < 2 \
                or not list(out_dir.glob(".commtag-merge-*")):
            assert launch.poll() is None, "the merge ended before it was killed"
            assert time.monotonic() < deadline, "the workers never started writing"
            time.sleep(0.005)
    finally:
        launch.kill()
    # torchrun's workers run in sessions of their own: each is killed by its pid, which its
    # temporary's name gives.
    for temporary in writing:
        os.kill(int(temporary.name.rpartition("-")[2]), signal.SIGKILL)
    launch.wait(timeout=60)
    left = sorted(p.name for p in out_dir.iterdir())
    assert any(name.startswith(".commtag-merge-") for name in left) and len(left) >= 2, left
    done = _merge(str(dlrm), "-o", str(out_dir / "small.pftrace"))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["small.pftrace"]
