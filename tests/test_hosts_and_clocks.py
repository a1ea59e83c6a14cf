"""Which hosts each collective crossed, and how the merged trace's clocks were aligned.

On a generated 8-rank set laid out 4 ranks a host (tensor-parallel groups of 4, so each on one
host; data-parallel pairs and the world across both), whose two hosts' clocks are set apart by an
offset the generator records in its manifest:

- each instance's ``nodes`` is the number of hosts its ranks ran on, each group is intra- or
  inter-node and its time and busbw are split so, a busbw above 1,000 GB/s is flagged and left
  out; the same from the directory and from the merged file;
- without ``--align`` the alignment entry says nothing was measured, with ``--align collectives``
  it gives the second host's offset (the generator's, within a few us) against the first and each
  host's residual; the summary reads the same entry back from the merged file, and ``-j 2``
  writes every byte as ``-j 1`` does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.merge.analysis.align import NOT_MEASURED
from commtag.report.inputs import load
from commtag.report.tables import to_json
from pftrace_reader import read

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("job") / "job"
    subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", "8", "--events", "20000",
                    "--ranks-per-node", "4", "-o", str(out)], check=True, capture_output=True, timeout=300)
    return out


def _merge(job: Path, out: Path, *args: str) -> Path:
    done = subprocess.run([sys.executable, "-m", "commtag.merge", str(job), "-o", str(out), *args, "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def _entry(merged: Path) -> dict:
    parsed = read(merged)
    (marker,) = [s for s in parsed.slices if s.args.get("commtag marker") == "alignment"]
    assert marker.instant and parsed.name_path(marker.track)[0].startswith("rank 0 ")  # the lowest rank's markers
    return orjson.loads(marker.args["commtag alignment"])


def _summary(path: Path) -> dict:
    return orjson.loads(to_json(*load(path)))


def test_an_unaligned_merge_says_its_clocks_were_not_measured(job: Path, tmp_path: Path) -> None:
    merged = _merge(job, tmp_path / "plain.pftrace")
    entry = _entry(merged)
    assert entry["method"] == "none" and entry["unit"] == "host" and entry["reference"] == "node000"
    assert entry["uncertainty"] == NOT_MEASURED and entry["residual_median_us"] is None
    assert [(c["clock"], c["ranks"], c["offset_us"], c["residual_us"]) for c in entry["clocks"]] == [
        ("node000", [0, 1, 2, 3], 0.0, None), ("node001", [4, 5, 6, 7], 0.0, None)]
    assert _summary(merged)["alignment"] == entry == _summary(job)["alignment"]


def test_an_aligned_merge_gives_each_hosts_offset_and_residual(job: Path, tmp_path: Path) -> None:
    offsets = orjson.loads((job / "scaleset.manifest.json").read_bytes())["clock_offset_us"]
    merged = _merge(job, tmp_path / "aligned.pftrace", "--align", "collectives")
    entry = _entry(merged)
    assert entry["method"] == "collectives" and entry["reference"] == "node000" and entry["uncertainty"] is None
    assert entry["matched"] > 0 and entry["residual_max_us"] is not None
    first, second = entry["clocks"]
    assert (first["clock"], first["ranks"], first["offset_us"]) == ("node000", [0, 1, 2, 3], 0.0)
    assert (second["clock"], second["ranks"]) == ("node001", [4, 5, 6, 7])
    # The generator moved node001's clock by offsets[4] - offsets[0]; aligning takes it back.
    assert second["offset_us"] == pytest.approx(offsets[0] - offsets[4], abs=5.0)
    assert all(c["residual_us"] is not None and c["residual_us"] <= entry["residual_max_us"] for c in entry["clocks"])
    assert _summary(merged)["alignment"] == entry
    assert _merge(job, tmp_path / "j2.pftrace", "--align", "collectives", "-j", "2").read_bytes() == merged.read_bytes()


def test_each_instance_says_how_many_hosts_it_crossed(job: Path, tmp_path: Path) -> None:
    merged = _merge(job, tmp_path / "plain.pftrace")
    from_dir, from_file = _summary(job), _summary(merged)
    records = from_dir["collectives"]
    assert records and all(r["nodes"] == len({rank // 4 for rank in r["ranks"]}) for r in records)
    scopes = {(r["lane"], r["collective"]): r["nodes"] for r in from_dir["summary"]}
    assert {lane: scope for (lane, _), scope in scopes.items() if "(tp)" in lane} == {
        "PG 1 (tp) [0, 1, 2, 3]": "intra-node", "PG 2 (tp) [4, 5, 6, 7]": "intra-node"}
    assert {scope for (lane, _), scope in scopes.items() if "(tp)" not in lane} == {"inter-node"}
    for row in from_dir["summary"]:
        (part,) = row["by_nodes"].values()
        assert list(row["by_nodes"]) == [row["nodes"]] and part["count"] == row["count"]
        assert part["total_time_us"] == pytest.approx(row["total_time_us"], abs=0.01)
    # A busbw no link carries is flagged and left out, never reported as a figure.
    implausible = [r for r in records if r["busbw_implausible"]]
    assert implausible and all(r["busbw_gbps"] is None and r["algbw_gbps"] is None for r in implausible)
    for r in implausible:  # what it would have been: nccl-tests' busbw of an allreduce
        n = len(r["ranks"])
        assert r["bytes"] / (r["transfer_us"] * 1e-6) / 1e9 * 2 * (n - 1) / n > 1000
    assert all(r["busbw_gbps"] is None or r["busbw_gbps"] <= 1000 for r in records)
    assert sum(row["busbw_implausible"] for row in from_dir["summary"]) == len(implausible)
    # The merged file says the same, from the hosts its alignment entry names.
    assert [(r["nodes"], r["cause"], r["busbw_implausible"]) for r in from_file["collectives"]] == [
        (r["nodes"], r["cause"], r["busbw_implausible"]) for r in records]
    assert from_file["summary"] == from_dir["summary"]
