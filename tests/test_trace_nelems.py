"""An absurd element count written in a trace is refused as one in a sidecar is.

The input is a public A100 trace (rank 0 of 2, NCCL kernels and record_param_comms ops
with their eager keys; from tests/data/public) with one count changed the way a corrupt or
hand-made file has it. The bound is the sidecar's, from one place
(:data:`commtag.constants.MAX_NELEMS`): the count at the bound merges, one past it does
not, in ``commtag merge`` and ``commtag summary`` alike.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest

from commtag.cli import main
from commtag.constants import MAX_NELEMS
from commtag.testing import PUBLIC_TRACES

A100_RANK0 = PUBLIC_TRACES / "eager-nccl-metadata" / "hta_a100_nccl_data.json.gz"


def _with_count(tmp_path: Path, name: str, key: str, value: object) -> Path:
    """A folder holding the trace with ``key`` of its first event named ``name`` (that carries it) set to ``value``."""
    trace = orjson.loads(gzip.decompress(A100_RANK0.read_bytes()))
    event = next(e for e in trace["traceEvents"] if e.get("name", "").startswith(name) and key in (e.get("args") or {}))
    event["args"][key] = value
    folder = tmp_path / "in"
    folder.mkdir()
    # the json module: it writes integers beyond 64 bits too
    (folder / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    return folder


@pytest.mark.parametrize("name, key, value", [
    ("ncclKernel", "In msg nelems", 10**30),
    ("ncclKernel", "Out msg nelems", MAX_NELEMS + 1),
    ("record_param_comms", "Out msg nelems", 1e30),
    ("record_param_comms", "In msg nelems", -1),
    ("record_param_comms", "In msg nelems", 8.5),
    ("ncclKernel", "Out msg nelems", 8.5),
], ids=["kernel-1e30", "kernel-bound+1", "op-float-1e30", "op-negative", "op-fraction", "kernel-fraction"])
def test_an_absurd_count_in_a_trace_is_one_line_naming_the_file(tmp_path: Path, capsys, name: str, key: str,
                                                                value: object) -> None:
    folder = _with_count(tmp_path, name, key, value)
    for command, out in (["merge", str(folder), "-o", str(tmp_path / "m.pftrace"), "--no-progress"], "merge"), \
                         (["summary", str(folder)], "summary"):
        assert main(command) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line]
        assert len(err) == 1, err
        assert err[0].startswith(f"commtag {out}: ") and str(folder / "rank0.pt.trace.json.gz") in err[0], err
        assert f"{key!r} " in err[0] and f" is not an element count in [0, {MAX_NELEMS}]" in err[0], err
    assert not (tmp_path / "m.pftrace").exists()


def test_the_count_at_the_bound_merges(tmp_path: Path, capsys) -> None:
    folder = _with_count(tmp_path, "ncclKernel", "In msg nelems", MAX_NELEMS)
    assert main(["merge", str(folder), "-o", str(tmp_path / "m.pftrace"), "--no-progress"]) == 0, capsys.readouterr().err
