"""Which worker merges which ranks on several hosts (:func:`commtag.merge.engine.hosts.assign`): each
worker takes consecutive ranks its own node holds, so the parts fit together in rank order."""

from __future__ import annotations

from pathlib import Path

import pytest

from commtag.merge.errors import MergeInputError
from commtag.merge.engine.hosts import Node, assign
from commtag.merge.inputs.load import RankInput, TraceFile

A, B = Node(0, "a"), Node(1, "b")


def _ranks(holders: list[set[Node]], size: int = 100) -> list[dict[Node, RankInput]]:
    """Rank r as each node holding it found it: ``<host>/rank<r>.json``."""
    return [{node: RankInput(r, [TraceFile(Path(node.host, f"rank{r}.json"), None, size)]) for node in held}
            for r, held in enumerate(holders)]


def _numbers(assigned: dict[int, list[RankInput]]) -> dict[int, list[int]]:
    return {w: [r.rank for r in ranks] for w, ranks in assigned.items()}


def test_each_node_s_block_goes_to_its_own_workers() -> None:
    ranks = _ranks([{A}] * 4 + [{B}] * 4)
    assert _numbers(assign(ranks, [(0, A), (1, A), (2, B), (3, B)])) == {
        0: [0, 1], 1: [2, 3], 2: [4, 5], 3: [6, 7]}


def test_ranks_every_node_holds_are_shared_by_every_worker() -> None:
    assert _numbers(assign(_ranks([{A, B}] * 6), [(0, A), (1, B)])) == {0: [0, 1, 2], 1: [3, 4, 5]}


def test_a_node_without_ranks_has_workers_without_ranks() -> None:
    assert _numbers(assign(_ranks([{B}] * 3), [(0, A), (1, B)])) == {0: [], 1: [0, 1, 2]}


def test_scattered_ranks_need_a_worker_per_block() -> None:
    scattered = _ranks([{A}, {B}, {A}, {B}])
    with pytest.raises(MergeInputError, match=r"ranks 2-2: only node 0 \(a\) holds them"):
        assign(scattered, [(0, A), (1, B)])
    assert _numbers(assign(scattered, [(0, A), (1, A), (2, B), (3, B)])) == {0: [0], 1: [2], 2: [1], 3: [3]}


def test_a_worker_reads_a_rank_from_its_own_node_s_copy() -> None:
    assigned = assign(_ranks([{A, B}] * 4), [(0, A), (1, B)])
    assert {w: [str(f.path) for r in ranks for f in r.files] for w, ranks in assigned.items()} == {
        0: ["a/rank0.json", "a/rank1.json"], 1: ["b/rank2.json", "b/rank3.json"]}
