"""The rule that matches ranks' profiler steps by the Seqs of their collectives (merge.inputs.stepmatch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.load import RankInput, TraceFile
from commtag.merge.inputs.stepmatch import match, matched_steps


def _steps(first: int, count: int, seq0: int = 1, group: str = "0") -> list[tuple[int, str, int, int]]:
    """``count`` steps numbered from ``first``, two Seqs of ``group`` each from ``seq0``."""
    return [(first + k, group, seq0 + 2 * k, seq0 + 2 * k + 1) for k in range(count)]


def test_ranks_that_agree_are_not_renumbered():
    found = match({0: _steps(2, 4), 1: _steps(2, 4)})
    assert found.shifts == {0: 0, 1: 0} and not found.disagree and found.describe() == ""


def test_a_rank_that_stepped_once_more_is_shifted_by_one():
    """Its iteration with Seqs 3-4 is its step 3 and the others' step 2."""
    found = match({0: _steps(2, 4, seq0=3), 1: _steps(2, 4, seq0=1), 2: _steps(2, 4, seq0=3)})
    assert found.shifts == {0: 0, 1: 1, 2: 0}
    assert found.steps_of(1, frozenset({3})) == {4} and found.steps_of(2, frozenset({3})) == {3}
    assert "rank 1 numbers the same work 1 step above rank 0's" in found.describe()


def test_a_rank_reached_only_through_a_subgroup_is_matched_through_it():
    """Rank 2 shares no group with rank 0, only one with rank 1 (a pipeline's stages)."""
    found = match({0: _steps(2, 3, group="a"), 1: _steps(3, 3, group="a") + _steps(3, 3, group="b"),
                   2: _steps(4, 3, group="b")})
    assert found.shifts == {0: 0, 1: 1, 2: 2}


def test_steps_cut_at_other_places_are_refused_for_steps(tmp_path):
    """Rank 1's steps hold Seqs of two of rank 0's steps each: no one shift matches them."""
    found = {0: _steps(2, 4), 1: [(2, "0", 1, 4), (3, "0", 5, 8)]}
    assert 1 in match(found).unmatchable
    ranks = [RankInput(r, [TraceFile(tmp_path / f"rank{r}.json")]) for r in (0, 1)]
    with pytest.raises(MergeInputError, match="--steps cannot keep the same work on every rank: rank 1's steps"):
        matched_steps(ranks, found, frozenset({3}), [], tmp_path)


def test_a_rank_sharing_no_collective_is_said_to_be_taken_by_its_numbers(tmp_path):
    found = {0: _steps(2, 3), 1: _steps(3, 3), 2: _steps(2, 3, group="other")}
    notices: list[str] = []
    ranks = [RankInput(r, [TraceFile(Path(f"rank{r}.json"))]) for r in (0, 1, 2)]
    kept = matched_steps(ranks, found, frozenset({3}), notices, tmp_path)
    assert kept == {Path("rank1.json"): {4}}
    assert len(notices) == 1 and "rank 2 shares no collective with rank 0's steps: taken by its own numbers" in notices[0]
