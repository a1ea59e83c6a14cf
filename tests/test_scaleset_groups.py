"""The scale-set generator's group layout: ``--tp N`` gives tensor-parallel blocks of N ranks and
data-parallel strides of world/N ranks (the 1,024-rank benchmark's 8 x 128 job), the default stays
as it was, and a width that does not divide the world is refused before anything is written.

Runs the generator as launch/bench_scale.py does (a subprocess) on a tiny set: about a second each.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts the generator as a process

GENERATOR = (sys.executable, "-m", "commtag.testing.scaleset")
WORLD = 16


def _generate(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GENERATOR, "--ranks", str(WORLD), "--events", str(WORLD * 200), "-o", str(out), *extra],
                          capture_output=True, text=True, timeout=120)


def _groups_seen(out: Path) -> dict[str, set[tuple[int, ...]]]:
    """desc -> the rank lists of that role's groups, as every rank's distributedInfo.pg_config lists them
    (checked against the sidecar's process groups of the same rank)."""
    seen: dict[str, set[tuple[int, ...]]] = {}
    for path in sorted(out.glob("*.commtag.json")):
        sidecar = json.loads(path.read_text())
        trace = json.loads(gzip.decompress((out / sidecar["trace_file"]).read_bytes()))
        config = trace["distributedInfo"]["pg_config"]
        assert [(pg["pg_name"], pg["ranks"]) for pg in config] == [
            (pg["name"], pg["ranks"]) for pg in sidecar["process_groups"]
        ]
        for pg in config:
            assert sidecar["rank"] in pg["ranks"] and pg["pg_size"] == len(pg["ranks"])
            seen.setdefault(pg["pg_desc"], set()).add(tuple(pg["ranks"]))
    return seen


@pytest.mark.parametrize("extra, tp", [(("--tp", "8"), 8), ((), 4)], ids=["tp8", "default"])
def test_tp_option_lays_out_the_groups_asked(tmp_path: Path, extra: tuple[str, ...], tp: int) -> None:
    done = _generate(tmp_path, *extra)
    assert done.returncode == 0, done.stderr
    seen = _groups_seen(tmp_path)
    dp = WORLD // tp
    assert seen["default_pg"] == {tuple(range(WORLD))}
    assert seen["tp"] == {tuple(range(b * tp, (b + 1) * tp)) for b in range(dp)}
    assert seen["dp"] == {tuple(range(o, WORLD, tp)) for o in range(tp)}
    manifest = json.loads((tmp_path / "scaleset.manifest.json").read_text())
    assert manifest["process_groups"] == {"default": [1, WORLD], "tp": [dp, tp], "dp": [tp, dp]}
    calls = manifest["collective_calls_per_rank"]
    sidecar = json.loads(next(tmp_path.glob("*.commtag.json")).read_text())
    replayed = sum(len(c["replays"]) * len(c["collectives"]) for c in sidecar["captures"])
    assert sum(calls.values()) == len(sidecar["collectives"]) + replayed


def test_a_tp_that_does_not_divide_the_world_is_refused(tmp_path: Path) -> None:
    done = _generate(tmp_path / "out", "--tp", "3")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"gen_scaleset: --tp 3 must divide the world size {WORLD}"]
    assert not (tmp_path / "out").exists()
