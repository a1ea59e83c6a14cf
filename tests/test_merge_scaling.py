"""The merge's work grows linearly with a sidecar's records, however few time spans they share.

Counted, not timed: the lines of the attach pass (commtag.merge.rank's attach, events, gloo and
eager modules: the gloo join and the index it reads) that run while a rank is merged
(``sys.settrace``, a count that does not depend on the machine's speed or load). The
rank is rank 0 of a real gloo run (conftest's ``gloo_run``) whose sidecar records every
call ``copies`` times, each copy a call of its own (its Seq moved past the others) at the
same times: many calls of one group and op in each time span, the shape that makes
attach compare calls with one another.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import orjson
import pytest

from commtag.merge.rank import attach, eager, events, gloo
from merging import merge

pytestmark = pytest.mark.slow


def _rank0_with_copies(gloo_run: Path, out: Path, copies: int) -> Path:
    out.mkdir()
    for path in gloo_run.glob("rank0.*"):
        shutil.copy(path, out)
    (sidecar,) = out.glob("*.commtag.json")
    data = orjson.loads(sidecar.read_bytes())
    records = data["collectives"]
    step = max(r["annotation"]["Seq"] for r in records) + 1
    data["collectives"] = [{**r, "annotation": {**r["annotation"], "Seq": r["annotation"]["Seq"] + k * step}}
                           for k in range(copies) for r in records]
    sidecar.write_bytes(orjson.dumps(data))
    return out


def _attach_lines(folder: Path) -> int:
    """Lines of the attach pass run while ``folder`` is merged."""
    count = 0
    targets = {module.__file__ for module in (attach, eager, events, gloo)}

    def count_lines(frame, event, arg):
        nonlocal count
        count += event == "line"
        return count_lines

    sys.settrace(lambda frame, event, arg: count_lines if frame.f_code.co_filename in targets else None)
    try:
        merge(folder, folder / "merged.pftrace", progress=False)
    finally:
        sys.settrace(None)
    return count


def test_attach_work_is_linear_in_records_sharing_few_spans(gloo_run: Path, tmp_path: Path) -> None:
    few, many = 20, 80
    small = _attach_lines(_rank0_with_copies(gloo_run, tmp_path / "few", few))
    large = _attach_lines(_rank0_with_copies(gloo_run, tmp_path / "many", many))
    # Four times the records: four times the work, give or take what does not grow with them.
    assert large <= 1.1 * (many / few) * small, (small, large, large / small)
