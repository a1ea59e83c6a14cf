"""What `commtag validate` and `commtag summary` say about the files users hand them.

Driven through the real CLI (``python -m commtag``) on real merges of public
traces: an empty file is an error, a gzipped .pftrace (which the Perfetto UI
opens) is a .pftrace, a JSON trace is named as such, a merge of ranks without
collectives summarizes as its directory does, and ``--plot`` without
matplotlib says how to get it.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from commtag.testing import PUBLIC_TRACES as PUBLIC

pytestmark = pytest.mark.slow

DLRM = PUBLIC / "param-dlrm-8rank"
#: One real H100 rank with a graph-replayed kernel and no collective at all.
NO_COLLECTIVES = PUBLIC / "edge-cases" / "kineto_h100_graph_node_id_zero.json"


def _commtag(*args: str, probe: str = "pass") -> subprocess.CompletedProcess:
    """``python -m commtag ARGS``; ``probe`` runs first in the same interpreter."""
    code = f"import runpy, sys; {probe}; sys.argv = ['commtag', *sys.argv[1:]]; runpy.run_module('commtag', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> Path:
    """A real merge of two public DLRM ranks (the traces linked, never copied into the repo)."""
    d = tmp_path_factory.mktemp("dlrm")
    for src in sorted(DLRM.iterdir())[:2]:
        (d / src.name).symlink_to(src)
    done = _commtag("merge", "--no-progress", str(d))
    assert done.returncode == 0, done.stderr
    return d / "merged.pftrace"


def test_validate_refuses_an_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pftrace"
    empty.touch()
    done = _commtag("validate", str(empty))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"commtag validate: error: {empty}: empty file, not a .pftrace"]
    assert "OK" not in done.stdout


def test_a_gzipped_pftrace_validates_and_summarizes_like_the_plain_one(merged: Path, tmp_path: Path) -> None:
    packed = tmp_path / "merged.pftrace.gz"
    packed.write_bytes(gzip.compress(merged.read_bytes()))
    done = _commtag("validate", str(packed))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{packed}: OK\n"
    plain, zipped = _commtag("summary", str(merged)), _commtag("summary", str(packed))
    assert plain.returncode == zipped.returncode == 0, zipped.stderr
    assert plain.stdout.startswith("8 collectives on 2 of 8 ranks")
    assert zipped.stdout == plain.stdout


@pytest.mark.parametrize("gzipped", [True, False])
def test_validate_names_a_json_trace(tmp_path: Path, gzipped: bool) -> None:
    source = next(DLRM.iterdir())
    trace = tmp_path / ("rank0.json.gz" if gzipped else "rank0.json")
    trace.write_bytes(source.read_bytes() if gzipped else gzip.decompress(source.read_bytes()))
    done = _commtag("validate", str(trace))
    assert done.returncode == 2
    kind = "gzipped JSON" if gzipped else "JSON"
    assert done.stderr.splitlines() == [
        f"commtag validate: error: {trace}: this is a {kind} file (a profiler trace?), not a .pftrace: "
        "`commtag merge` turns profiler traces into one"
    ]


def test_a_merge_without_collectives_summarizes_like_its_directory(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    d.mkdir()
    (d / "rank0.json").symlink_to(NO_COLLECTIVES)
    merge = _commtag("merge", "--no-progress", str(d))
    assert merge.returncode == 0, merge.stderr
    assert "0 collective slices" in merge.stdout
    from_dir, from_file = _commtag("summary", str(d)), _commtag("summary", str(d / "merged.pftrace"))
    assert from_dir.returncode == 0, from_dir.stderr
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == from_dir.stdout
    assert "rank 0 stream 1: other 100%" in from_file.stdout  # the kernel table the merge wrote


def test_a_perfetto_trace_commtag_did_not_write_is_still_refused(tmp_path: Path) -> None:
    trace = pb.Trace()
    packet = trace.packet.add(trusted_packet_sequence_id=1, timestamp=5)
    packet.track_descriptor.uuid = 7
    packet.track_descriptor.process.pid = 42
    other = tmp_path / "other.pftrace"
    other.write_bytes(trace.SerializeToString())
    done = _commtag("summary", str(other))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"commtag summary: error: {other}: no rank processes or collective lane slices "
        "(is it a trace written by `commtag merge`?)"
    ]


def test_plot_without_matplotlib_says_how_to_get_it(merged: Path, tmp_path: Path) -> None:
    png = tmp_path / "skew.png"
    done = _commtag("summary", str(merged), "--plot", str(png), probe="sys.modules['matplotlib'] = None")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "commtag summary: --plot needs matplotlib, which is not installed: pip install 'commtag[plot]'"
    ]
    assert done.stdout == "" and not png.exists()
    # With matplotlib there, the same command draws the plot.
    drawn = _commtag("summary", str(merged), "--plot", str(png))
    assert drawn.returncode == 0, drawn.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_never_replaces_a_pipe_or_the_summarys_input(merged: Path, tmp_path: Path) -> None:
    # Renaming the drawn PNG over a FIFO (or a device: `--plot /dev/null` run as root) would
    # replace it with a regular file, and over the input would destroy the merge.
    fifo = tmp_path / "skew.png"
    os.mkfifo(fifo)
    done = _commtag("summary", str(merged), "--plot", str(fifo))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"commtag summary: {fifo}: --plot's target is a pipe (FIFO), not a regular file: "
        "writing the plot would replace it"
    ]
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    shared = tmp_path / "merged.png"  # a merged trace the user named .png: the plot's format
    shared.write_bytes(merged.read_bytes())
    done = _commtag("summary", str(shared), "--plot", str(shared))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"commtag summary: {shared}: --plot's target is the summary's input: writing the plot would overwrite it"
    ]
    assert shared.read_bytes() == merged.read_bytes()


def test_the_plot_is_readable_as_any_file_the_user_writes(merged: Path, tmp_path: Path) -> None:
    png = tmp_path / "skew.png"
    done = _commtag("summary", str(merged), "--plot", str(png), probe="import os; os.umask(0o022)")
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(png.stat().st_mode) == 0o644  # not mkstemp's private 0600
    assert [p.name for p in tmp_path.iterdir()] == ["skew.png"]


def test_one_traced_rank_of_a_larger_world_gets_no_skew_for_kernels_without_metadata(tmp_path: Path) -> None:
    # A real A100 rank 0 of 16 (distributedInfo world_size 16) whose NCCL kernels carry no
    # metadata: each send/recv has a peer that was not traced, so a skew over the one rank
    # present ("0.0 us", on time) would be a wrong answer; it is incomplete, as a named
    # missing rank makes it. The merged trace summarizes the same.
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.json.gz").symlink_to(PUBLIC / "single-rank-scale" / "hta_a100_rank0_of16.json.gz")
    from_dir = _commtag("summary", "--format", "json", str(job))
    assert from_dir.returncode == 0, from_dir.stderr
    summary = json.loads(from_dir.stdout)
    assert summary["ranks"] == [0] and summary["world_size"] == 16
    assert len(summary["collectives"]) == 80
    for c in summary["collectives"]:
        assert (c["ranks"], c["skew_us"], c["last_rank"], c.get("unnamed_missing")) == ([0], None, None, 1), c
    assert [(g["count"], g["incomplete"], g["skew_p50_us"]) for g in summary["summary"]] == [(80, 80, None)]
    merged = _commtag("merge", "--no-progress", str(job))
    assert merged.returncode == 0, merged.stderr
    from_merge = _commtag("summary", "--format", "json", str(job / "merged.pftrace"))
    assert from_merge.returncode == 0, from_merge.stderr
    assert json.loads(from_merge.stdout)["collectives"] == summary["collectives"]
