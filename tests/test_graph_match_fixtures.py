"""Replay matching on the real GPU fixtures written by launch/gpu_check.py.

Until a GPU run commits tests/fixtures/gpu_graphs/ these tests skip (with
that reason); afterwards they check, on CPU, what the GPU run measured: every
replayed collective of the captured step is annotated on every replay with the
eager profiler's values, and nothing is left unmatched.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from commtag.merge.graphs import match_graph_replays
from commtag.schema import Sidecar
from commtag.vocab import KERNEL_EAGER_KEYS, P2P_PEER_KEYS

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu_graphs"
#: Keys a replay must say as the eager kernel did (its Seq is the capture's: see gpu_check).
KEYS = [key for key in KERNEL_EAGER_KEYS if key not in (*P2P_PEER_KEYS, "Seq")]

pytestmark = pytest.mark.skipif(not (FIXTURES / "PROVENANCE.md").exists(),
                                reason="no GPU fixtures yet: run launch/gpu_check.py on a GPU machine")


def _load(sub: str) -> tuple[dict, Sidecar]:
    trace_path = next((FIXTURES / sub).glob("*.pt.trace.json.gz"))
    side_path = next((FIXTURES / sub).glob("*.commtag.json"))
    with gzip.open(trace_path, "rt") as f:
        trace = json.load(f)
    return trace, Sidecar.model_validate_json(side_path.read_text())


def test_every_replayed_collective_carries_the_eager_metadata() -> None:
    eager_trace, _ = _load("eager")
    trace, sidecar = _load("graph")
    eager = {}
    for e in eager_trace["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy") and "Collective name" in e.get("args", {}):
            eager.setdefault(e["args"]["Collective name"], e["args"])
    result = match_graph_replays(trace["traceEvents"], sidecar.captures, int(trace.get("baseTimeNanoseconds", 0)))
    assert result.unmatched == []
    assert eager, "the eager fixture has no annotated device events"
    for name, expected in eager.items():
        got = [m for m in result.matches if m.annotation.collective_name == name]
        assert got, f"{name}: not annotated at replay"
        for m in got:
            args = m.args()
            assert {k: args.get(k) for k in KEYS} == {k: expected.get(k) for k in KEYS}
            assert args["commtag match"] in ("tools-id", "node-id", "order")
