"""torch 2.15+'s c10d pre/post hooks: calls the patched functions never see are recorded, each once.

On real gloo ranks under the profiler: functional collectives and a direct backend call (outside
any capture) are recorded through c10d's hooks, the patched calls through their wrappers, and no
call twice; uninstall leaves each group's hooks registered and inert (torch's hook table is not safe
to change while another thread issues a call: tests/test_runtime_toggle.py crashed on 2.15 when they
were unregistered), and a second install records each call once again. CI's torch 2.13 has no such hooks: the
tests skip there and run in the compatibility run (launch/compat.sh).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from commtag.runtime.install import c10d_hooks
from gloo_world import run_world
from merging import matched

needs_hooks = pytest.mark.skipif(not c10d_hooks.available(),
                                 reason="c10d ProcessGroup pre/post hooks that name every op are torch 2.15+ "
                                        "(the compat run covers them)")


def _mixed_calls(rank: int, world: int) -> dict:
    import torch.distributed._functional_collectives as funcol
    from torch.profiler import ProfilerActivity, profile

    import commtag
    from commtag.runtime.record import recorder

    warnings.simplefilter("ignore")
    commtag.install()
    pair = dist.new_group([0, 1])  # made after install: gets its hooks when torch attaches its own
    x = torch.ones(4)
    with profile(activities=[ProfilerActivity.CPU]):
        dist.all_reduce(x)                                        # patched
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))            # hooks only
        funcol.wait_tensor(funcol.all_gather_tensor(x, 0, dist.group.WORLD))         # hooks only
        pair.allreduce([x]).wait()                                # direct backend call: hooks only
        with dist._coalescing_manager(group=dist.group.WORLD):    # patched block: one record
            dist.all_reduce(x)
            dist.all_reduce(torch.ones(6))
        dist.barrier()                                            # patched
        recorded = recorder.drain()
    names = [(r.annotation.collective_name, r.annotation.pg_name, r.annotation.seq) for r in recorded]
    commtag.uninstall()
    hooked = [pg for pg in dist.distributed_c10d._world.pg_map if pg in c10d_hooks._attached]
    # After uninstall a functional collective records nothing.
    with profile(activities=[ProfilerActivity.CPU]):
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))
        after = recorder.drain()
    restored = not hasattr(dist.distributed_c10d._maybe_attach_flight_recorder, "__wrapped__")
    commtag.install()
    with profile(activities=[ProfilerActivity.CPU]):
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))
        again = recorder.drain()
    commtag.uninstall()
    return {"names": names, "hooked": len(hooked), "after": len(after), "restored": restored,
            "again": [(r.annotation.collective_name, r.annotation.pg_name) for r in again]}


@needs_hooks
@pytest.mark.slow
def test_calls_no_patched_function_sees_are_recorded_once_each() -> None:
    results = run_world(_mixed_calls, 2)
    for result in results:
        assert result["names"] == [
            ("allreduce", "0", 1),
            ("allreduce", "0", 2),
            ("allgather_into_tensor_coalesced", "0", 3),
            ("allreduce", "1", 1),
            ("allreduce_coalesced", "0", 4),
            ("barrier", "0", 5),
        ]
        assert result["hooked"] == 2 and result["after"] == 0 and result["restored"]
        assert result["again"] == [("allreduce", "0")]


def _state(size: int = 4, rank: int = 1, record_format: str = "legacy"):
    from commtag.runtime.describe.groups import GroupState

    ranks = list(range(size))
    return GroupState(uid="0:x", name="0", desc="default_pg", ranks=ranks, ranks_text=str(ranks), size=size,
                      group_rank=rank, global_rank_start=0, global_rank_stride=1, backend="gloo", lane_id=60,
                      lane_name="PG 0", generation=0, record_format=record_format)


def test_a_hooked_call_is_described_as_the_patched_function_describes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a hook's arguments (as torch 2.15 passes them, seen on gloo: in-place ops only inputs,
    list ops whole lists, roots and peers as group ranks) the same description as the patched
    function's for the same call; runs on CI's torch (no hook needed to describe)."""
    from commtag.runtime.describe import metadata

    state = _state()
    monkeypatch.setattr(metadata, "_state", lambda group: state)
    x, six, big = torch.ones(4), torch.ones(6), torch.ones(16)
    each = [torch.empty(4) for _ in range(4)]
    pairs = [
        (("ALLREDUCE", [x], [], -1), metadata.OPS["all_reduce"](x)),
        (("BROADCAST", [x], [], 2), metadata.OPS["broadcast"](x, group_src=2)),
        (("REDUCE", [x], [], 2), metadata.OPS["reduce"](x, group_dst=2)),
        (("ALLGATHER", [x], each, -1), metadata.OPS["all_gather"](each, x)),
        (("ALLGATHER_BASE", [x], [big], -1), metadata.OPS["all_gather_into_tensor"](big, x)),
        (("REDUCE_SCATTER_BASE", [big], [x], -1), metadata.OPS["reduce_scatter_tensor"](x, big)),
        (("ALLTOALL", each, each, -1), metadata.OPS["all_to_all"](each, each)),
        (("GATHER", [x], each, 0), metadata.OPS["gather"](x, each, group_dst=0)),
        (("SCATTER", each, [x], 0), metadata.OPS["scatter"](x, each, group_src=0)),
        (("BARRIER", [], [], -1), metadata.OPS["barrier"]()),
        (("ALLREDUCE_COALESCED", [x, six], [], -1), metadata.OPS["all_reduce_coalesced"]([x, six])),
        (("SEND", [x], [], 3), metadata.OPS["send"](x, group_dst=3)),
        (("RECV", [x], [], 0), metadata.OPS["recv"](x, group_src=0)),
    ]
    fields = ("collective", "in_nelems", "out_nelems", "dtype", "rank", "in_split", "out_split", "p2p", "peer")
    for (name, inputs, outputs, root), patched in pairs:
        hooked = c10d_hooks.describe(name, inputs, outputs, root, False, state)
        assert [getattr(hooked, f) for f in fields] == [getattr(patched, f) for f in fields], name
    assert c10d_hooks.describe("SPLIT", [], [], -1, False, state) is None


def test_an_all_to_all_single_only_a_hook_saw_has_its_sizes_and_says_its_splits_are_not_recorded() -> None:
    """The hook gives all_to_all_single's two tensors, not its split lists (docs/nccl2.md §7a):
    its sizes are written, its split sizes never guessed ("commtag splits": "not recorded"); on an
    nccl2 group under the name of the engine whose record keeps no split lists either."""
    from commtag.runtime.describe.calls import CallRecord

    x, y = torch.ones(12), torch.ones(8)
    for record_format, name, splits in (("legacy", "all_to_allv", ("[]", "[]")),
                                        ("nccl2", "all_to_all_v_single", ("[12]", "[8]"))):
        call = c10d_hooks.describe("ALLTOALL_BASE", [x], [y], -1, False, _state(record_format=record_format))
        fields = CallRecord(call, 3, None, 1, "main").annotation_fields()
        assert (fields["collective_name"], fields["in_msg_nelems"], fields["out_msg_nelems"]) == (name, 12, 8)
        assert (fields["in_split_size"], fields["out_split_size"], fields["splits"]) == (*splits, "not recorded")


def test_hooks_are_used_only_where_torch_names_every_op_apart() -> None:
    """torch 2.14's hooks name a tensor-form call as its list form (no ALLGATHER_BASE): there the
    patched functions stay the only path; 2.15's name them all."""
    names = set(getattr(getattr(torch._C._distributed_c10d, "HookOpName", None), "__members__", {}))
    assert c10d_hooks.available() == ("ALLGATHER_BASE" in names and "ALLREDUCE_COALESCED" in names)


def test_a_coalesced_call_on_an_nccl2_group_is_one_record_per_tensor() -> None:
    """docs/nccl2.md §3: allreduce_coalesced and allgather_into_tensor_coalesced write one
    record per tensor (pair); a legacy group keeps the one fused record."""
    x, six, big = torch.ones(4), torch.ones(6), torch.ones(16)
    for record_format, want in (("legacy", [("allreduce_coalesced", 10, 10)]),
                                ("nccl2", [("allreduce", 4, 4), ("allreduce", 6, 6)])):
        state = _state(record_format=record_format)
        call = c10d_hooks.describe("ALLREDUCE_COALESCED", [x, six], [], -1, True, state)
        parts = c10d_hooks.per_tensor(call, [x, six], [])
        assert [(p.collective, p.in_nelems, p.out_nelems) for p in parts] == want
    state = _state(record_format="nccl2")
    call = c10d_hooks.describe("ALLGATHER_INTO_TENSOR_COALESCED", [x, six], [big, torch.ones(24)], -1, True, state)
    parts = c10d_hooks.per_tensor(call, [x, six], [big, torch.ones(24)])
    assert [(p.collective, p.in_nelems, p.out_nelems) for p in parts] == [("_allgather_base", 4, 16),
                                                                         ("_allgather_base", 6, 24)]


def _all_to_all_single(rank: int, world: int, out_dir: str) -> None:
    import torch.distributed._functional_collectives as funcol
    from torch.profiler import ProfilerActivity, profile

    import commtag

    warnings.simplefilter("ignore")
    commtag.install()
    sends = [[1, 3], [2, 2]][rank]          # rank 0 sends 1 row to 0 and 3 to 1; rank 1 2 and 2
    recvs = [[1, 2], [3, 2]][rank]
    x = torch.ones(sum(sends), 2)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        funcol.wait_tensor(funcol.all_to_all_single(x, recvs, sends, dist.group.WORLD))   # hooks only
        funcol.wait_tensor(funcol.all_to_all_single(torch.ones(4), None, None, dist.group.WORLD))  # hooks only
        out = torch.empty(sum(recvs), 2)
        dist.all_to_all_single(out, x, recvs, sends)                                          # patched
    commtag.uninstall()


@needs_hooks
@pytest.mark.slow
def test_a_hook_only_all_to_all_single_merges_with_its_sizes_and_no_guessed_traffic(tmp_path) -> None:
    """On real gloo ranks (torch 2.15): functional all_to_all_single, uneven and even, is seen only
    by c10d's hooks: each is annotated with its sizes and "splits not recorded", and the merge's
    all-to-all traffic says so, where the patched call's recorded splits give its matrix."""
    from commtag.merge import merge
    from commtag.vocab import ANN_SPLITS, IN_NELEMS_KEY

    run_world(_all_to_all_single, 2, str(tmp_path))
    result = merge(tmp_path, tmp_path / "merged.pftrace", jobs=1)
    found = sorted((m.seq, m.collective, tuple(sorted(m.members)),
                    tuple(inst.arg(IN_NELEMS_KEY) for _, inst in sorted(m.members.items())),
                    {inst.arg(ANN_SPLITS) for inst in m.members.values()}) for m in matched(result))
    assert found == [(1, "all_to_allv", (0, 1), (8, 8), {"not recorded"}),
                     (2, "all_to_allv", (0, 1), (4, 4), {"not recorded"}),
                     (3, "all_to_allv", (0, 1), (8, 8), {None})]
    traffic = {a.seq: a for a in result.analysis.all_to_all}
    assert traffic[1].matrix is None and "not recorded" in traffic[1].not_recorded
    assert traffic[2].matrix is None and "not recorded" in traffic[2].not_recorded
    assert traffic[3].matrix == [[2, 6], [4, 4]]
