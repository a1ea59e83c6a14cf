"""Many hosts without a shared filesystem: two torchrun agents (``--nnodes=2``, c10d
rendezvous) on this machine, each given a folder of its own, write the trace one process
writes from all the ranks.

Each agent stands for a node: its workers see only its folder, as a node sees only its local
disk; the ranks and the parts of the trace travel to worker 0 over the gloo group.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Sequence

import pytest

from commtag.merge.pftrace.readback import read_trace
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES
from commtag.testing.bench import free_port
from torchrun_merge import traceback_in_commtag

pytestmark = pytest.mark.slow

HOST = socket.gethostname()
DLRM = PUBLIC_TRACES / "param-dlrm-8rank"
#: No launch here takes more than a minute; a hang fails the test instead of blocking it.
_TIMEOUT_S = 240


def _nodes(folders: list[Path], args: list[str], per_node: int = 1,
           own: Sequence[list[str]] = ()) -> list[subprocess.CompletedProcess]:
    """Run ``python -m commtag.merge <folder> *args`` under one torchrun agent per folder, all of one
    c10d rendezvous (``--nnodes=len(folders)``), agent ``i`` given ``own[i]`` after ``args`` too;
    each agent's result, stdout and stderr as text."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    endpoint, run_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    agents = []
    logs = []
    for node, folder in enumerate(folders):
        out, err = (open(folder.parent / f".{folder.name}.{s}", "w+") for s in ("out", "err"))
        logs.append((out, err))
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(folders)}",
             f"--nproc-per-node={per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
             f"--rdzv-id={run_id}", "--max-restarts=0", "-m", "commtag.merge", str(folder), *args,
             *(own[node] if node < len(own) else ()), "--no-progress"],
            stdout=out, stderr=err, text=True, env=env))
    results = []
    try:
        for agent, (out, err) in zip(agents, logs):
            agent.wait(timeout=_TIMEOUT_S)
            out.seek(0), err.seek(0)
            results.append(subprocess.CompletedProcess(agent.args, agent.returncode, out.read(), err.read()))
    finally:
        for agent, (out, err) in zip(agents, logs):
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            out.close(), err.close()
            Path(out.name).unlink(), Path(err.name).unlink()
    return results


def _split(run: Path, tmp: Path, *shares: list[int]) -> list[Path]:
    """A folder per node, each holding a copy of the traces and sidecars of its ``shares`` of ranks."""
    folders = []
    for node, ranks in enumerate(shares):
        folder = tmp / f"node{node}"
        folder.mkdir()
        for path in sorted(run.iterdir()):
            if any(f"rank{r}." in path.name or f"rank{r}_" in path.name for r in ranks):
                shutil.copy(path, folder / path.name)
        folders.append(folder)
    return folders


def _assert_same_trace(got: Path, expected: Path) -> None:
    """Every track and slice (name, times, args, flows, depth) equal, as the UI would show them."""
    one, two = read_trace(expected), read_trace(got)
    assert two.tracks == one.tracks
    assert len(two.slices) == len(one.slices) > 100
    assert sorted(two.slices, key=_place) == sorted(one.slices, key=_place)


def _place(s) -> tuple:
    return s.ts, s.track, s.end, s.name, s.depth


def _single(run: Path, out: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "commtag.merge", str(run), "-o", str(out), "-j", "1",
                           "--no-progress"], capture_output=True, text=True, timeout=_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return proc


def _rank_files(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir())


@pytest.fixture(scope="module")
def single(gloo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single-process merge of every rank of the shared gloo run."""
    out = tmp_path_factory.mktemp("single") / "single.pftrace"
    _single(gloo_run, out)
    return out


@pytest.mark.parametrize("per_node", [1, 2])
def test_two_nodes_each_with_half_the_ranks_write_what_one_process_writes(
        gloo_run: Path, single: Path, tmp_path: Path, per_node: int) -> None:
    folders = _split(gloo_run, tmp_path, [0, 1], [2, 3])
    assert _rank_files(folders[0]) and _rank_files(folders[1])
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out)], per_node)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-3000:] for r in results]
    assert validate_file(out) == []
    _assert_same_trace(out, single)
    assert ": 4 ranks," in "".join(r.stdout for r in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged.pftrace", "node0", "node1"]


def test_a_dangling_link_on_one_node_is_left_out_with_a_notice(gloo_run: Path, single: Path, tmp_path: Path) -> None:
    folders = _split(gloo_run, tmp_path, [0, 1], [2, 3])
    link = folders[1] / "rank9.step0.pt.trace.json.gz"
    link.symlink_to(tmp_path / "gone.pt.trace.json.gz")
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out)])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-3000:] for r in results]
    _assert_same_trace(out, single)
    said = "".join(r.stderr for r in results)
    assert (f"notice: node 1 ({HOST}): {link}: a symbolic link to {tmp_path / 'gone.pt.trace.json.gz'}, which does "
            "not exist; left out") in said


def test_a_rank_on_both_nodes_with_the_same_content_is_taken_once(gloo_run: Path, single: Path,
                                                                  tmp_path: Path) -> None:
    folders = _split(gloo_run, tmp_path, [0, 1, 2], [1, 2, 3])  # ranks 1 and 2 on both, copied apart
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out)])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-3000:] for r in results]
    _assert_same_trace(out, single)


@pytest.mark.parametrize("size", ["same size", "other size"])
def test_a_rank_on_both_nodes_with_different_content_stops_the_merge(gloo_run: Path, tmp_path: Path,
                                                                    size: str) -> None:
    folders = _split(gloo_run, tmp_path, [0, 1, 2], [2, 3])
    sidecar = next(p for p in folders[1].iterdir() if p.name.startswith("rank2.") and "commtag" in p.name)
    text = sidecar.read_text()
    if size == "same size":  # another run's sidecar of rank 2: its pid differs in one digit
        at = text.index('"pid":') + len('"pid":')
        text = text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1:]
    else:
        text += "\n"
    sidecar.write_text(text)
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out)])
    assert all(r.returncode != 0 for r in results)
    said = [line for r in results for line in r.stderr.splitlines() if line.startswith("commtag merge: error:")]
    assert len(said) == 1, [r.stderr[-3000:] for r in results]
    assert said == [f"commtag merge: error: {sidecar}: rank 2 on node 1 ({HOST}) differs in "
                    f"{'content' if size == 'same size' else 'size'} from {folders[0] / sidecar.name} on node 0 "
                    f"({HOST}): a rank found on several nodes must be the same files on each"]
    assert not traceback_in_commtag("".join(r.stderr for r in results))  # torchrun's own, at most
    assert not out.exists()


def test_a_node_that_finds_no_trace_merges_none_and_says_so(gloo_run: Path, tmp_path: Path) -> None:
    folders = _split(gloo_run, tmp_path, [0, 1, 2, 3], [])
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out)])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-3000:] for r in results]
    stderr = "".join(r.stderr for r in results)
    assert f"node 1 ({HOST}): no PyTorch profiler trace under {folders[1]}; it merges no rank" in stderr
    expected = tmp_path / "single.pftrace"
    _single(folders[0], expected)
    _assert_same_trace(out, expected)


def test_a_node_whose_folder_is_missing_stops_the_merge_naming_it(gloo_run: Path, tmp_path: Path) -> None:
    folders = _split(gloo_run, tmp_path, [0, 1, 2, 3], [])
    folders[1].rmdir()
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out)])
    assert all(r.returncode != 0 for r in results)
    said = [line for r in results for line in r.stderr.splitlines() if line.startswith("commtag merge: error:")]
    assert said == [f"commtag merge: error: {folders[1]}: no such file or directory (on node 1 ({HOST}))"]
    assert not out.exists()


def test_max_output_stops_every_node_before_writing(gloo_run: Path, single: Path, tmp_path: Path) -> None:
    """Each worker measures its own node's ranks; the estimate is everyone's, so all stop together."""
    folders = _split(gloo_run, tmp_path, [0, 1], [2, 3])
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out), "--max-output", "1000"])
    assert all(r.returncode != 0 for r in results)
    said = [line for r in results for line in r.stderr.splitlines() if line.startswith("commtag merge: error:")]
    found = re.fullmatch(rf"commtag merge: error: {re.escape(str(out))}: the merged trace would take about "
                         r"([\d.]+) kB, above --max-output 1.00 kB; .*", said[0]) if len(said) == 1 else None
    assert found, said
    assert 0.75 < float(found.group(1)) * 1000 / single.stat().st_size < 1.5  # all four ranks, not one node's
    assert not out.exists()


@pytest.mark.parametrize(("option", "said"), [(["--window", "1e6:2e6"], "--window 1000000:2000000 keeps no event of any rank"),
                                              (["--detail", "7"], "--detail names rank 7, which no trace here holds")])
def test_a_selection_of_nothing_stops_every_node_in_one_line(gloo_run: Path, tmp_path: Path, option: list[str],
                                                             said: str) -> None:
    folders = _split(gloo_run, tmp_path, [0, 1], [2, 3])
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out), *option])
    assert all(r.returncode != 0 for r in results)
    lines = [line for r in results for line in r.stderr.splitlines() if line.startswith("commtag merge: error:")]
    assert len(lines) == 1 and said in lines[0], [r.stderr[-3000:] for r in results]
    assert not out.exists()


@pytest.mark.parametrize("options", [["--align", "collectives"], ["--skip-bad-ranks"]])
def test_two_nodes_with_options_write_what_one_process_writes(gloo_run: Path, tmp_path: Path,
                                                              options: list[str]) -> None:
    """--align's first pass and --skip-bad-ranks' list (node 1's rank 3 is broken) travel between
    the nodes like the records; one process merging both folders is the reference."""
    folders = _split(gloo_run, tmp_path, [0, 1], [2, 3])
    if "--skip-bad-ranks" in options:
        broken = next(p for p in folders[1].iterdir() if p.name.startswith("rank3.") and ".pt.trace" in p.name)
        broken.write_bytes(gzip.compress(b'{"traceEvents": 5}'))
    expected = tmp_path / "single.pftrace"
    one = subprocess.run([sys.executable, "-m", "commtag.merge", *map(str, folders), "-o", str(expected), "-j", "1",
                          "--no-progress", *options], capture_output=True, text=True, timeout=_TIMEOUT_S)
    assert one.returncode == 0, one.stderr
    out = tmp_path / "merged.pftrace"
    results = _nodes(folders, ["-o", str(out), *options])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-3000:] for r in results]
    _assert_same_trace(out, expected)
    if "--skip-bad-ranks" in options:
        skipped = [line for r in results for line in r.stderr.splitlines() if line.startswith("commtag merge: skipped")]
        assert skipped == [line for line in one.stderr.splitlines() if line.startswith("commtag merge: skipped")]
        assert str(broken) in skipped[0] and "rank 3 skipped" in skipped[0], skipped
        assert ": 3 ranks," in "".join(r.stdout for r in results) and ": 3 ranks," in one.stdout


@pytest.mark.parametrize(("own", "said"), [
    (["--detail", "0,1"], 'node 1 ({host}) was given detail [0,1], node 0 ({host}) detail (not given)'),
    (["--steps", "12"], 'node 1 ({host}) was given steps [12], node 0 ({host}) steps (not given)'),
    (["-o", "{elsewhere}"], 'node 1 ({host}) was given output "{elsewhere}", node 0 ({host}) output "{out}"'),
])
def test_nodes_given_other_options_stop_in_one_line_naming_both(tmp_path: Path, own: list[str], said: str) -> None:
    """Each node would apply its own options to its ranks (a half-filtered trace, exit 0, written where
    worker 0's node said): the workers compare them first. DLRM's ranks, half on each node, hold step 12."""
    folders = []
    for node, ranks in enumerate((range(4), range(4, 8))):
        folders.append(tmp_path / f"node{node}")
        folders[-1].mkdir()
        for r in ranks:
            source = next(DLRM.glob(f"worker{r}_*"))
            (folders[-1] / source.name).symlink_to(source)
    out, elsewhere = tmp_path / "merged.pftrace", tmp_path / "elsewhere.pftrace"
    fill = {"host": HOST, "out": out, "elsewhere": elsewhere}
    results = _nodes(folders, ["-o", str(out)], own=[[], [arg.format(**fill) for arg in own]])
    assert all(r.returncode != 0 for r in results), [r.stderr[-3000:] for r in results]
    lines = [line for r in results for line in r.stderr.splitlines() if line.startswith("commtag merge:")]
    assert lines == [f"commtag merge: error: {out}: {said.format(**fill)}: every node of a merge must be given "
                     "the same options (all but its input folders)"], [r.stderr[-3000:] for r in results]
    exits = dict(re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*: (-?\d+)",
                            "".join(r.stderr for r in results)))
    assert exits == {"0": "2", "1": "2"}, [r.stderr[-3000:] for r in results]
    assert not any(traceback_in_commtag(r.stderr) for r in results)
    assert not out.exists() and not elsewhere.exists()
