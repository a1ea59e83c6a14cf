"""A trace whose distributedInfo comes after its events still tells its rank (some CUPTI-based
writers put it at the end), in a gzip file or a plain one, however long the events run."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.merge.inputs.load import discover
from commtag.testing import PUBLIC_TRACES as PUBLIC
from pftrace_reader import read

TWO_RANKS = PUBLIC / "hta-sampled-2rank"


def _info_last(src: Path) -> bytes:
    """The real trace with its top-level keys reordered: the events first, distributedInfo last."""
    trace = orjson.loads(gzip.decompress(src.read_bytes()))
    reordered = {"traceEvents": trace.pop("traceEvents"), **{k: v for k, v in trace.items() if k != "distributedInfo"},
                 "distributedInfo": trace["distributedInfo"]}
    text = orjson.dumps(reordered, option=orjson.OPT_INDENT_2)
    assert text.index(b'"distributedInfo"') > 1 << 20  # far beyond the first bytes discovery reads
    return text


def _nameless_pair(folder: Path) -> None:
    """Rank 0 gzipped and rank 1 as plain JSON, under names that tell no rank."""
    folder.mkdir()
    (folder / "trace_a.json.gz").write_bytes(gzip.compress(_info_last(TWO_RANKS / "sampled_rank-0.json.gz")))
    (folder / "trace_b.json").write_bytes(_info_last(TWO_RANKS / "sampled_rank-1.json.gz"))


def test_ranks_come_from_distributed_info_after_the_events(tmp_path: Path) -> None:
    _nameless_pair(tmp_path / "in")
    found = discover([tmp_path / "in"])
    assert [(r.rank, [f.path.name for f in r.files]) for r in found] == [(0, ["trace_a.json.gz"]), (1, ["trace_b.json"])]


@pytest.mark.slow
def test_such_traces_merge_like_any_other(tmp_path: Path) -> None:
    _nameless_pair(tmp_path / "in")
    out = tmp_path / "merged.pftrace"
    proc = subprocess.run([sys.executable, "-m", "commtag", "merge", str(tmp_path / "in"), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    names = sorted(d.process.process_name.split(" · ")[0] for d in read(out).processes())
    assert names == ["rank 0", "rank 1"]


@pytest.mark.slow
def test_a_truncated_gzip_read_for_its_tail_is_one_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    whole = gzip.compress(_info_last(TWO_RANKS / "sampled_rank-0.json.gz"))
    bad = folder / "trace_a.json.gz"
    bad.write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "merged.pftrace"
    proc = subprocess.run([sys.executable, "-m", "commtag", "merge", str(folder), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr and "gzip" in proc.stderr
    assert not out.exists()
