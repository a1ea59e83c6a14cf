"""A long string in a trace costs the merged trace its length once per sequence, not once per slice.

A 4-rank job written by the generator (commtag.testing.nccl2) names its group with a 1.1 MB
description: every record, kernel and lane slice of the group carries it. The merged trace of
six calls is not bigger than that of two by anything near the description's size (every string
value is interned, however long), and each slice still reads back the whole description.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from commtag.testing.nccl2 import JobCall, JobGroup, job_trace
from commtag.vocab import PG_DESC_KEY
from merging import merge
from pftrace_reader import read

DESCRIPTION = "d" * 1_100_000


def _merged_size(tmp_path: Path, calls: int) -> tuple[int, Path]:
    world = JobGroup("0", DESCRIPTION, (0, 1, 2, 3))
    job = [JobCall("allreduce", world, (8,)) for _ in range(calls)]
    folder = tmp_path / f"calls{calls}"
    folder.mkdir()
    for rank in range(4):
        (folder / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(job_trace(job, rank, 4, "legacy"))))
    out = tmp_path / f"calls{calls}.pftrace"
    merge(folder, out)
    return out.stat().st_size, out


def test_a_long_description_is_written_once_per_sequence(tmp_path: Path) -> None:
    two, _ = _merged_size(tmp_path, 2)
    six, out = _merged_size(tmp_path, 6)
    # Four more calls on four ranks: 16 more records, kernels and lane slices, each naming the group.
    assert six - two < len(DESCRIPTION), (two, six)
    described = [s for s in read(out).slices if s.args.get(PG_DESC_KEY) is not None]
    assert len(described) >= 6 * 4 * 2 and all(s.args[PG_DESC_KEY] == DESCRIPTION for s in described)
