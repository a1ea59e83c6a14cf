"""Outputs appear whole or not at all: a failed merge leaves the previous good output as it was.

The merge writes into a temporary file beside the output and renames it at
the end; --json files are staged the same way and renamed only once the
merge succeeded. Failures are injected where they happen to users: a bad
rank found after others were written, the disk filling up while a rank or
the lanes are written, the process killed mid-write.
"""

from __future__ import annotations

import errno
import gzip
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from commtag.cli import main
from commtag.merge.pftrace import lanes, writer
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    """Four real ranks of the public DLRM run (small and quick to merge)."""
    d = tmp_path / "traces"
    d.mkdir()
    for src in sorted(DLRM.iterdir())[:4]:
        shutil.copy(src, d / src.name)
    return d


def _good_outputs(traces: Path, out: Path, json_dir: Path, capsys) -> dict[Path, bytes]:
    assert main(["merge", "--no-progress", str(traces), "-o", str(out), "--json", str(json_dir)]) == 0
    capsys.readouterr()
    assert validate_file(out) == []
    files = {out: out.read_bytes(), **{p: p.read_bytes() for p in json_dir.iterdir()}}
    assert len(files) == 5
    return files


def _everything(*dirs: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


def _break_rank(traces: Path, index: int) -> Path:
    """Make the index-th rank's trace unreadable (the merge meets it after the ranks before it)."""
    victim = sorted(traces.iterdir())[index]
    data = orjson.loads(gzip.decompress(victim.read_bytes()))
    data["traceEvents"][10]["ts"] = -1.0
    victim.write_bytes(gzip.compress(orjson.dumps(data)))
    return victim


def test_bad_rank_found_late_keeps_every_previous_output(traces: Path, tmp_path: Path, capsys):
    out, json_dir = tmp_path / "out" / "merged.pftrace", tmp_path / "json"
    out.parent.mkdir()
    good = _good_outputs(traces, out, json_dir, capsys)
    # Rank 0 changed since (so its new --json would differ), rank 3 is now bad: ranks 0-2 are
    # written, and their --json staged, before the merge meets rank 3.
    first = sorted(traces.iterdir())[0]
    data = orjson.loads(gzip.decompress(first.read_bytes()))
    data["traceEvents"].append({"ph": "i", "s": "t", "name": "new marker", "pid": 0, "tid": 0, "ts": 1})
    first.write_bytes(gzip.compress(orjson.dumps(data)))
    victim = _break_rank(traces, 3)
    code = main(["merge", "--no-progress", str(traces), "-o", str(out), "--json", str(json_dir)])
    assert code == 2 and str(victim) in capsys.readouterr().err
    # The .pftrace and all four --json files are the earlier merge's, byte for byte; no temporaries.
    assert _everything(out.parent, json_dir) == good


@pytest.mark.parametrize("stage", ["rank", "lanes"])
def test_disk_full_mid_write_keeps_the_previous_output(stage: str, traces: Path, tmp_path: Path,
                                                       capsys, monkeypatch):
    out, json_dir = tmp_path / "out" / "merged.pftrace", tmp_path / "json"
    out.parent.mkdir()
    good = _good_outputs(traces, out, json_dir, capsys)
    calls = []

    def full_disk(stream, *args, **kwargs):
        # What the merge has written so far: the lanes go to a temporary of their own, after the
        # ranks' part beside it is closed, so the hidden files beside the output count too.
        calls.append(stream.tell() + sum(p.stat().st_size for p in out.parent.glob(f".{out.name}*")))
        if stage == "rank" and len(calls) < 3:
            return real(stream, *args, **kwargs)
        stream.write(b"\x0a\x05half")  # some bytes made it out before the disk filled up
        raise OSError(errno.ENOSPC, "No space left on device")

    if stage == "rank":
        real = writer.write_rank
        monkeypatch.setattr(writer, "write_rank", full_disk)
    else:
        real = lanes.LanesWriter.write
        monkeypatch.setattr(lanes.LanesWriter, "write", lambda self, stream, *a, **kw: full_disk(stream, *a, **kw))
    code = main(["merge", "--no-progress", str(traces), "-o", str(out), "--json", str(json_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"commtag merge: error: {out}: cannot write the output: No space left on device"]
    assert calls and calls[-1] > 0  # the failure came after part of the file had been written
    assert _everything(out.parent, json_dir) == good


def test_no_partial_file_when_the_output_is_new(traces: Path, tmp_path: Path, capsys):
    _break_rank(traces, 2)
    out = tmp_path / "fresh" / "merged.pftrace"
    out.parent.mkdir()
    assert main(["merge", "--no-progress", str(traces), "-o", str(out), "--json", str(tmp_path / "json")]) == 2
    assert list(out.parent.iterdir()) == []
    assert not (tmp_path / "json").exists() or list((tmp_path / "json").iterdir()) == []


@pytest.mark.slow
def test_killed_mid_write_leaves_the_previous_output(traces: Path, tmp_path: Path, capsys):
    """SIGKILL while the third rank is written: no cleanup runs, the old output is still whole."""
    out, json_dir = tmp_path / "out" / "merged.pftrace", tmp_path / "json"
    out.parent.mkdir()
    good = _good_outputs(traces, out, json_dir, capsys)
    script = textwrap.dedent(f"""
        import os, signal, sys
        from commtag.merge.pftrace import writer
        real, calls = writer.write_rank, []
        def write_rank(stream, *args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                stream.write(b"partial")
                stream.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return real(stream, *args, **kwargs)
        writer.write_rank = write_rank
        from commtag.cli import main
        sys.exit(main(["merge", "--no-progress", {str(traces)!r}, "-o", {str(out)!r}, "--json", {str(json_dir)!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    after = _everything(out.parent, json_dir)
    # Only hidden temporaries may remain; every visible output is the earlier merge's.
    visible = {p: data for p, data in after.items() if not p.name.startswith(".")}
    assert visible == good
    assert all(".tmp-" in p.name for p in after if p not in good)
    assert validate_file(out) == []
