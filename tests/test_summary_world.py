"""`commtag summary merged.pftrace` reports the world size (and the ranks without a trace) as
`commtag summary DIR` does, however the folder was merged.

Inputs: the shared real 4-rank gloo run (conftest's ``gloo_run``), as written and with
sidecars removed (one, or all: then no rank shows a collective and no profiled window
carries the world size), merged plain, with ``--align collectives`` and with ``--json``;
and public traces read from tests/data/public (DLRM's 8 ranks, 2 sampled ranks of a 128-rank job,
one CPU-only gloo rank of 300).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import orjson
import pytest

from commtag.cli import main
from commtag.testing import PUBLIC_TRACES


def _summary(capsys: pytest.CaptureFixture, path: Path) -> dict:
    assert main(["summary", str(path), "--format", "json"]) == 0, capsys.readouterr().err
    return orjson.loads(capsys.readouterr().out)


def _world(capsys: pytest.CaptureFixture, folder: Path, out: Path, *options: str) -> tuple[int, list[int]]:
    """The world size and absent ranks both summaries report (asserted equal), after merging ``folder``."""
    assert main(["merge", str(folder), "-o", str(out), "--no-progress", *options]) == 0, capsys.readouterr().err
    capsys.readouterr()
    from_dir, from_file = _summary(capsys, folder), _summary(capsys, out)
    assert (from_file["world_size"], from_file["absent_ranks"]) == (from_dir["world_size"], from_dir["absent_ranks"])
    assert from_file["ranks"] == from_dir["ranks"]
    return from_dir["world_size"], from_dir["absent_ranks"]


def _no_sidecar(rank: int) -> Callable[[Path], None]:
    return lambda d: (d / f"rank{rank}.step0.commtag.json").unlink()


def _no_sidecars(d: Path) -> None:
    for p in d.glob("*.commtag.json"):
        p.unlink()


def _two_ranks(d: Path) -> None:
    for p in d.iterdir():
        if not p.name.startswith(("rank0.", "rank2.")):
            p.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("change, options, absent", [
    (None, [], []),
    (None, ["--align", "collectives"], []),
    (None, ["--json", "JSON"], []),
    (_no_sidecar(1), [], []),
    (_no_sidecars, [], []),  # no collective on any rank: no profiled window says the world size
    (_no_sidecars, ["--align", "collectives"], []),
    (_two_ranks, [], [1, 3]),
], ids=["plain", "align", "json", "one-sidecar-missing", "no-sidecars", "no-sidecars-align", "two-ranks"])
def test_a_merged_gloo_run_says_its_world_as_its_folder_does(gloo_run: Path, tmp_path: Path, capsys, change,
                                                             options: list[str], absent: list[int]) -> None:
    folder = Path(shutil.copytree(gloo_run, tmp_path / "in"))
    if change is not None:
        change(folder)
    options = [str(tmp_path / "json") if o == "JSON" else o for o in options]
    assert _world(capsys, folder, tmp_path / "m.pftrace", *options) == (4, absent)


@pytest.mark.parametrize("source, world", [
    ("param-dlrm-8rank", 8),
    ("hta-sampled-2rank", 128),
    ("edge-cases/hta_gloo_cpu_only_rank34_of300.json.gz", 300),  # one rank, no collective slice written
], ids=["dlrm-8", "sampled-2-of-128", "gloo-rank34-of-300"])
def test_a_merged_public_set_says_its_world_as_its_folder_does(tmp_path: Path, capsys, source: str,
                                                               world: int) -> None:
    src = PUBLIC_TRACES / source
    folder = tmp_path / "in"
    folder.mkdir()
    for path in sorted(src.iterdir()) if src.is_dir() else [src]:
        (folder / path.name).symlink_to(path)
    size, absent = _world(capsys, folder, tmp_path / "m.pftrace")
    assert size == world and len(absent) == world - len(list(folder.iterdir()))
