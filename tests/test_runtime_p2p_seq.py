"""Point-to-point ops, however issued, never shift the Seq of a gloo group's later collectives.

gloo's per-group count, which numbers gloo collectives, also advances for every
send and receive a rank issues, on that rank only. The real pipeline-shaped job
of tests/pipeline_world.py has stages that issue different numbers of them
(direct isend/irecv, batch_isend_irecv, send/recv) between world and subgroup
collectives; merged, its collectives must match across ranks with no desync,
and the one rank that slept must be the straggler found at its call (as in
tests/test_summary_gloo.py, a rank the shared machine really held up for a few
ms may be named too, but none beyond that noise).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gloo_world import NOISE_BOUND
from pipeline_world import SLEEP_S, SLEEPER, SLEEP_STEP, STEPS, WORLD, WORLD_COLLECTIVES_PER_STEP, run_pipeline_world


def test_install_wraps_the_groups_p2p_methods_and_uninstall_puts_them_back():
    import commtag
    from torch.distributed import distributed_c10d as c10d

    from commtag.runtime.install.p2p_count import P2P_METHODS

    originals = {name: c10d.ProcessGroup.__dict__[name] for name in P2P_METHODS}
    methods = {name: getattr(c10d.ProcessGroup, name) for name in P2P_METHODS}
    commtag.install()
    try:
        for name in P2P_METHODS:
            assert c10d.ProcessGroup.__dict__[name].__commtag_original__ is methods[name]
    finally:
        commtag.uninstall()
    assert {name: c10d.ProcessGroup.__dict__[name] for name in P2P_METHODS} == originals


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> tuple[Path, list[int]]:
    out = tmp_path_factory.mktemp("pipeline") / "traces"
    return out, run_pipeline_world(out)


@pytest.mark.slow
def test_every_stage_numbers_the_worlds_collectives_alike(pipeline):
    _, next_seqs = pipeline
    # The warm-up all_reduce, then the warm-up step's and the profiled steps' world collectives:
    # the same count on every rank, whatever number of p2p ops each issued on the world.
    assert next_seqs == [2 + (1 + STEPS) * WORLD_COLLECTIVES_PER_STEP] * WORLD


@pytest.mark.slow
def test_the_merged_pipeline_has_no_desync_and_one_straggler(pipeline, tmp_path):
    from commtag.merge.analysis.hook import MergeAnalysis
    from merging import matched, merge

    traces, _ = pipeline
    result = merge(traces, tmp_path / "merged.pftrace", analysis=MergeAnalysis(), progress=False)
    analysis = result.analysis
    assert [f.message for f in analysis.desyncs] == []
    collectives = matched(result)
    world = [m for m in collectives if not m.is_p2p and m.group_size == WORLD]
    allreduces = sorted((m for m in world if m.collective == "allreduce"), key=lambda m: m.seq)
    barriers = [m for m in world if m.collective == "barrier"]
    # Every profiled world collective matched on all three ranks, as what it is.
    assert len(allreduces) == len(barriers) == STEPS
    assert all(sorted(m.members) == list(range(WORLD)) for m in world)
    late = allreduces[SLEEP_STEP]
    assert late.straggler and late.last_rank == SLEEPER
    assert abs(late.skew_ns / 1e9 - SLEEP_S) <= 0.2 * SLEEP_S
    others = [(m.collective, m.seq, m.last_rank, m.skew_ns) for m in collectives if m.straggler and m is not late]
    assert all(skew < NOISE_BOUND * SLEEP_S * 1e9 for *_, skew in others), others
