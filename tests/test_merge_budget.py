"""--max-output: the merged trace's size is estimated before it is written.

The estimate must be within 25% of the size the merge then writes, on the
public traces (every rank's files, as they are) and on real gloo traces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commtag.merge import merge
from commtag.merge.engine.budget import estimate, json_bytes, parse_size, upper_bound
from commtag.merge.inputs.load import discover
from commtag.testing import PUBLIC_TRACES

SETS = [
    ("param-dlrm-8rank", None),
    ("hta-sampled-2rank", None),
    ("eager-nccl-metadata/hta_a100_nccl_data.json.gz", None),
    ("eager-nccl-metadata/tracelens_b200_eager_trace.json.gz", None),
    ("edge-cases/tracelens_vllm_hipgraph_replay.json.gz", None),
    ("edge-cases/hta_no_distributed_info.json.gz", 0),
    ("single-rank-scale/hta_a100_rank0_of16.json.gz", None),
]


@pytest.mark.parametrize(("relpath", "rank"), SETS)
def test_estimate_is_within_a_quarter_of_the_real_size(relpath: str, rank, tmp_path: Path) -> None:
    source = PUBLIC_TRACES / relpath
    ranks = discover([source], None, rank=rank)
    guess = estimate(ranks).total()
    out = tmp_path / "merged.pftrace"
    merge(source, out, rank=rank, progress=False, max_output=None)
    real = out.stat().st_size
    assert 0.75 * real <= guess <= 1.25 * real, (guess, real)
    # the cheap test that skips the estimate for small merges never claims less than the merge writes
    assert upper_bound(ranks) >= real


def test_sizes_are_read_as_people_write_them() -> None:
    assert parse_size("1.5G") == 1_500_000_000
    assert parse_size("800MB") == 800_000_000
    assert parse_size("2000") == 2000
    for bad in ("lots", "-1G", "0", "1.5X", "0.1", "inf"):
        with pytest.raises(ValueError, match="--max-output"):
            parse_size(bad)


def test_a_small_gzip_file_is_as_big_as_its_content_not_4_gib(tmp_path: Path) -> None:
    """A broken rank of a few bytes (gzip bigger than its content) counts as its content, not as
    4 GiB of JSON that would refuse a --skip-bad-ranks merge of a small job as 1.5 GB; a big file's
    wrapped record is still read as wrapped."""
    import gzip
    import struct

    tiny = tmp_path / "rank3.pt.trace.json.gz"
    tiny.write_bytes(gzip.compress(b'{"traceEvents": 5}'))
    assert json_bytes(tiny) == len(b'{"traceEvents": 5}')
    content = b'{"traceEvents": [' + b"0," * 3_000_000 + b"0]}"
    small = tmp_path / "rank0.pt.trace.json.gz"
    small.write_bytes(gzip.compress(content))
    assert json_bytes(small) == len(content)
    # A 5 MB gzip file whose record says 1 kB: only a wrap explains it (deflate gives at most 1032:1).
    big = tmp_path / "rank1.pt.trace.json.gz"
    big.write_bytes(gzip.compress(b"x") + bytes(5_000_000) + struct.pack("<I", 1000))
    assert json_bytes(big) == 1000 + (1 << 32)
