"""The analysis of a real scheduled run (tests/window_world.py): what a user reads.

Real gloo ranks, the real profiler with ``schedule(..., repeat=2)``, the real
trace handler, the merge's collection stage or the merged .pftrace read back.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from window_world import PROFILED_STEPS, WORLD, window_world

#: Per profiled step, one message each way in each of the two pairs.
TRANSFERS = PROFILED_STEPS * 2 * 2


@pytest.fixture(scope="module")
def traces() -> Path:
    return window_world()


@pytest.fixture(scope="module")
def merged(traces, tmp_path_factory) -> Path:
    from commtag.merge.analyze import MergeAnalysis
    from commtag.merge.pipeline import merge

    out = tmp_path_factory.mktemp("merged") / "merged.pftrace"
    merge(traces, out, analysis=MergeAnalysis(), progress=False)
    return out


def _summary(source: Path, form: str = "text") -> str:
    """What ``commtag summary SOURCE --format FORM`` prints (the CLI only formats this)."""
    from commtag import report
    from commtag.summary import load

    analysis, kernels = load(source)
    if form == "json":
        return report.to_json(analysis, kernels).decode()
    return report.to_text(analysis, kernels)


def _rows(text: str) -> dict[str, list[str]]:
    """The text summary's table rows, by op name (two-word names like send/recv stay whole)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if line.startswith("  ") and len(cells) > 2 and cells[0] != "op":
            rows.setdefault(cells[0], []).append(line)
    return rows


def test_each_transfer_is_counted_once_as_a_send_recv_pair(traces, merged):
    from commtag.merge.readback import read_instances
    from commtag.summary import load

    analysis, _ = load(traces)
    p2p = [m for m in analysis.collectives if m.is_p2p]
    assert len(p2p) == TRANSFERS
    assert {m.collective for m in p2p} == {"send/recv"}
    assert all(sorted(i.collective for i in m.members.values()) == ["recv", "send"] for m in p2p)

    for source in (traces, merged):
        text = _summary(source)
        rows = _rows(text)
        assert "send" not in rows and "recv" not in rows, text
        (row,) = rows["send/recv"]
        assert re.split(r"\s{2,}", row.strip())[1] == str(TRANSFERS)
        doc = orjson.loads(_summary(source, "json"))
        assert [r["count"] for r in doc["summary"] if r["collective"] == "send/recv"] == [TRANSFERS]

    # Each rank's lane slice keeps its own direction: one send and one receive per transfer.
    lanes = [i for i in read_instances(merged) if i.is_p2p]
    assert sorted(i.collective for i in lanes) == ["recv"] * TRANSFERS + ["send"] * TRANSFERS
    assert {i.rank for i in lanes if i.collective == "send"} == set(range(WORLD))
