"""A batch_isend_irecv captured in a CUDA graph, on a real 2-rank gloo world over the in-memory
graph API of tests/test_capture_bookkeeping.py (no GPU here): the runtime keeps one snapshot of
the graph for the whole batch, which each of its records shares (legacy: one record per op;
nccl2: one batch_op_issue), with or without the profiler. The captured records it writes, put in
the place of the generator's (commtag.testing.nccl2_graph) beside the generator's replay trace,
merge to the same analysis: each replayed kernel of the batch joins each of its ops."""

from __future__ import annotations

from typing import Any

import pytest

from commtag.schema import CapturedCollective
from commtag.testing.nccl2 import JobCall, JobGroup
from commtag.vocab import COLLECTIVE_NAME_KEY, LEGACY_FORMAT, NCCL2_BATCH_P2P, NCCL2_FORMAT
from merging import matched

PAIR = JobGroup("0", "default_pg", (0, 1))
#: Each rank sends 4 floats to the other and receives 4 from it, in one batch.
JOB = (JobCall(NCCL2_BATCH_P2P, PAIR, (4,), pairs=((0, 1), (1, 0))),)


def _captured_batch(rank: int, world: int, fmt: str, profiled: bool, out_dir: str, broken: bool = False
                    ) -> dict[str, Any]:
    """commtag installed, a capture open on the fake graph: a GEMM node, then the batch, whose
    original adds one kernel node while it runs (NCCL launches a batch's kernels at the group's end).
    ``broken``: taking the capture snapshot raises inside commtag."""
    import contextlib
    import dataclasses

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.profiler import ProfilerActivity, profile
    from test_capture_bookkeeping import MAIN, FakeGraphAPI

    import commtag
    from commtag.runtime import capture
    from commtag.runtime.describe import groups
    from commtag.runtime.install import hooks
    from commtag.testing.nccl2 import kernel_name
    from commtag.testing.nccl2_graph import GEMM
    from commtag.vocab import COLLECTIVE_NAME_KEY, SEND

    api = FakeGraphAPI()
    real = c10d.batch_isend_irecv

    def launching(p2p_op_list: Any) -> Any:
        works = real(p2p_op_list)
        api.launch(MAIN, name=kernel_name({COLLECTIVE_NAME_KEY: SEND}, fmt))
        return works

    class Owner:
        def raw_cuda_graph_exec(self) -> int:
            return 0xE1

    c10d.batch_isend_irecv = dist.batch_isend_irecv = launching
    commtag.install()
    capture.use_tracker(capture.CaptureTracker(api))
    original_stream = capture.current_stream
    capture.current_stream = lambda: MAIN  # type: ignore[assignment]
    if fmt == NCCL2_FORMAT:
        groups.GROUP_STATES[dist.group.WORLD] = dataclasses.replace(
            groups.state_for(None), backend_impls={"cuda": "nccl2"}, record_format=NCCL2_FORMAT)
    if broken:
        def boom(marked: bool = True) -> Any:
            raise RuntimeError("snapshot failed")

        capture.before_collective = boom  # type: ignore[assignment]
    peer = 1 - rank
    sent, got = torch.full((4,), float(rank + 1)), torch.zeros(4)
    ops = [dist.P2POp(dist.isend, sent, peer), dist.P2POp(dist.irecv, got, peer)]
    owner = Owner()
    profiler = (profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir))
                if profiled else contextlib.nullcontext())
    try:
        with profiler:
            hooks.capture_begin_hook(lambda self: api.begin(MAIN))(owner)
            api.launch(MAIN, name=GEMM)
            works = dist.batch_isend_irecv(ops if rank == 0 else ops[::-1])
            for work in works:
                work.wait()
            hooks.capture_end_hook(lambda self: api.end(MAIN, 0xE1))(owner)
        (record,) = capture.captures_snapshot()
    finally:
        capture.current_stream = original_stream  # type: ignore[assignment]
        capture.use_tracker(None)
        commtag.uninstall()
        c10d.batch_isend_irecv = dist.batch_isend_irecv = real
    return {"got": got.tolist(), "sent": sent.tolist(), "batch_is_wrapped_again": dist.batch_isend_irecv is real,
            "collectives": [c.model_dump(mode="json") for c in record.collectives]}


#: What the runtime's records may hold that the generator's do not: the recording thread, that a
#: batch is async (the generator leaves it out of its annotations).
_OWN = {"thread", "async_op"}


def _comparable(captured: dict[str, Any], fmt: str) -> dict[str, Any]:
    annotation = {k: v for k, v in captured["annotation"].items() if k not in _OWN}
    if fmt == NCCL2_FORMAT:
        # nccl2's batch takes its group's last collective's Seq from nccl2's counter; a gloo group
        # has none, so the runtime gives its own p2p count (tests/test_runtime_backends.py).
        annotation.pop("seq")
    return {**{k: v for k, v in captured.items() if k != "tid"}, "annotation": annotation}


def _merged(tmp_path, fmt: str, runtime: list[list[dict]] | None):
    """The generator's replay traces merged with its sidecars, whose captured records are the
    runtime's where ``runtime`` gives them (per rank)."""
    import gzip

    import orjson

    from commtag.merge import merge
    from commtag.runtime.record.sidecar import write_sidecar
    from commtag.testing.nccl2_graph import graph_job

    directory = tmp_path / f"{fmt}-{'runtime' if runtime else 'generator'}"
    directory.mkdir()
    for rank in range(2):
        trace, side = graph_job(JOB, rank, 2, fmt, replays=3, skew_us=5.0 * rank)
        if runtime is not None:
            (cap,) = side.captures
            records = [CapturedCollective.model_validate(c) for c in runtime[rank]]
            side = side.model_copy(update={"captures": [cap.model_copy(update={"collectives": records})]})
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        write_sidecar(directory / f"rank{rank}.commtag.json", side)
    return merge(directory, tmp_path / f"{directory.name}.pftrace", jobs=1)


def _view(result) -> tuple[list, list]:
    rows = sorted((m.collective, m.pg_uid, m.replay, tuple(sorted(m.members)), m.missing_ranks, m.bytes,
                   tuple(sorted((r, inst.source, inst.arg(COLLECTIVE_NAME_KEY)) for r, inst in m.members.items())))
                  for m in matched(result))
    return rows, sorted((f.kind.value, f.replay, f.ranks) for f in result.analysis.findings)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [LEGACY_FORMAT, NCCL2_FORMAT])
@pytest.mark.parametrize("profiled", [False, True])
def test_a_captured_batch_is_recorded_once_for_its_graph_and_joins_its_replayed_kernel(tmp_path, fmt, profiled) -> None:
    from gloo_world import run_world

    from commtag.testing.nccl2_graph import graph_job

    results = run_world(_captured_batch, 2, fmt, profiled, str(tmp_path))
    for rank, res in enumerate(results):
        assert res["got"] == [float(2 - rank)] * 4  # the batch ran with the caller's own arguments
        assert res["batch_is_wrapped_again"]
        _, side = graph_job(JOB, rank, 2, fmt)
        expected = [_comparable(c.model_dump(mode="json"), fmt) for c in side.captures[0].collectives]
        assert [_comparable(c, fmt) for c in res["collectives"]] == expected
        # One snapshot for the batch: its records share the one node it added (node 0 is the GEMM).
        assert {tuple(n["index"] for n in c["nodes"]) for c in res["collectives"]} == {(1,)}
        assert len(res["collectives"]) == (1 if fmt == NCCL2_FORMAT else 2)
    runtime = _merged(tmp_path, fmt, [res["collectives"] for res in results])
    assert _view(runtime) == _view(_merged(tmp_path, fmt, None))
    rows, findings = _view(runtime)
    assert not findings and not [n for n in runtime.notices if "left unannotated" in n], runtime.notices
    # Each replay joins the batch on both ranks: legacy per op (a send and a recv per direction).
    assert len(rows) == 3 * (1 if fmt == NCCL2_FORMAT else 2)
    assert all(row[3] == (0, 1) and not row[4] for row in rows)
    assert {source for row in rows for _, source, _ in row[6]} == {"graph-replay"}


@pytest.mark.slow
def test_a_batch_whose_capture_snapshot_fails_still_runs_with_its_own_arguments() -> None:
    from gloo_world import run_world

    for rank, res in enumerate(run_world(_captured_batch, 2, LEGACY_FORMAT, False, "", True)):
        assert (res["got"], res["sent"]) == ([float(2 - rank)] * 4, [float(rank + 1)] * 4)
        assert res["collectives"] == []  # left out of the capture, never half-recorded


def test_records_sharing_one_snapshot_ask_torch_for_no_mark_and_share_its_nodes() -> None:
    """A mark names one record in the merge; a legacy batch's records share their node, so the
    snapshot they share opens no torch scope and each record keeps the node (joined by node id)."""
    from test_capture_bookkeeping import MAIN, FakeGraphAPI, annotation_of
    from test_torch_graph_annotations import TorchRegistry

    from commtag.runtime.capture import CaptureTracker
    from commtag.runtime.capture.torch_marks import TorchMarks

    api = FakeGraphAPI(tools_ids=True)
    torch_side = TorchRegistry(api)
    tracker = CaptureTracker(api, marks=TorchMarks(torch_side.mark_kernels, torch_side.get_kernel_annotations))
    owner = object()
    api.begin(MAIN)
    tracker.begin_capture(owner, MAIN)
    token = tracker.begin_collective(MAIN, marked=False)
    api.launch(MAIN, name="ncclDevKernel_SendRecv")
    tracker.end_collective(token, annotation_of("send", seq=1))
    tracker.end_collective(token, annotation_of("recv", seq=1))
    tracker.end_capture(owner, lambda: api.end(MAIN, 0xE0), lambda: 0xE0)
    assert torch_side.kwargs == [] and torch_side.open == 0
    (record,) = tracker.captures()
    assert [(c.annotation.collective_name, c.torch_mark, [n.index for n in c.nodes]) for c in record.collectives] == [
        ("send", None, [0]), ("recv", None, [0])]
