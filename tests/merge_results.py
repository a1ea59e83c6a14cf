"""What a merge's result says, as plain data: what tests compare across worker counts (and send
back from torchrun's workers)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

from commtag.merge import MergeResult


def said(result: MergeResult) -> dict:
    """Everything ``result`` says (its output's name aside): ranks, slices, accounts, notices, the
    instances read back with their figures, and the analysis's findings, busbw, impact, all-to-all
    traffic and coverage, as JSON data."""
    assert result.analysis is not None
    out = dataclasses.asdict(dataclasses.replace(result, output=Path("merged.pftrace"), analysis=None))
    del out["_read"]  # what ``instances`` holds once read
    analysis = result.analysis
    out["instances"] = [(i.rank, i.start_ns, i.end_ns, i.all_args()) for i in result.instances]
    out["findings"] = [f.to_dict() for f in analysis.findings]
    out["busbw"] = analysis.busbw
    out["impact"] = dataclasses.asdict(analysis.impact)
    out["all_to_all"] = [a.to_dict() for a in analysis.all_to_all]
    out["coverage"] = dataclasses.asdict(analysis.coverage)
    return orjson.loads(orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS))


def main(job: str, output: str, said_to: str) -> None:
    """Under torchrun: merge ``job`` into ``output``; the lead writes what its result says to ``said_to``."""
    from commtag.merge import merge

    result = merge(job, output, progress=False)
    if result.lead:
        Path(said_to).write_bytes(orjson.dumps(said(result)))


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:4])
