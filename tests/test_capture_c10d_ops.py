"""Operator-level interception of c10d collectives, on a real 2-rank gloo world.

No GPU can capture here, so the tests push the interception exactly as the
capture_begin hook does ("capture active"), and check that functional
collectives and DDP's C++ reducer -- which never call the torch.distributed
Python functions -- come out annotated with the eager profiler's keys, on
two process groups; and that nothing is intercepted while it is inactive.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

from gloo_world import run_world

pytestmark = pytest.mark.slow


class _ListSink:
    """Keeps what the interception hands over, as the capture tracker would."""

    def __init__(self) -> None:
        self.records: list[tuple[dict[str, Any], Optional[str]]] = []
        self.outer: Any = None

    def wrapper_token(self) -> Any:
        return self.outer

    def begin(self) -> object:
        return object()

    def end(self, token: object, annotation: Any, reduce_op: Optional[str]) -> None:
        self.records.append((annotation.eager_dict(), reduce_op))


def _funcol_body(rank: int, world_size: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from commtag.runtime.capture import c10d_ops

    sub = dist.new_group([0, 1], group_desc="tp")
    sink = _ListSink()
    mode = c10d_ops.activate(sink)
    try:
        x = torch.arange(6, dtype=torch.float32) + rank
        reduced = funcol.all_reduce(x, "sum", dist.group.WORLD)
        gathered = funcol.all_gather_tensor(x.to(torch.bfloat16), 0, sub)
        scattered = funcol.reduce_scatter_tensor(torch.ones(8), "sum", 0, dist.group.WORLD)
        values = (reduced + 0).tolist(), (gathered + 0).float().tolist(), (scattered + 0).tolist()
        stack_while_active = c10d_ops.is_active()
    finally:
        c10d_ops.deactivate(mode)
    intercepted = list(sink.records)
    # Inactive: the same calls are not seen, and no mode is left on the stack.
    funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).wait()
    return {
        "records": intercepted,
        "after": len(sink.records),
        "values": values,
        "active": stack_while_active,
        "inactive": not c10d_ops.is_active() and torch._C._len_torch_dispatch_stack() == 0,
    }


def test_functional_collectives_are_annotated_with_eager_keys_while_active() -> None:
    results = run_world(_funcol_body, 2)
    for rank, res in enumerate(results):
        assert res["active"] and res["inactive"]
        assert res["after"] == 3, "a call made while inactive was intercepted"
        # The collectives ran correctly under interception.
        assert res["values"][0] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
        assert res["values"][1] == [0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6]
        assert res["values"][2] == [2.0] * 4
        (ar, ar_op), (ag, ag_op), (rs, rs_op) = res["records"]
        assert (ar["Collective name"], ar["In msg nelems"], ar["Out msg nelems"], ar["dtype"], ar_op) == (
            "allreduce", 6, 6, "Float", "sum")
        assert (ag["Collective name"], ag["In msg nelems"], ag["Out msg nelems"], ag["dtype"], ag_op) == (
            "_allgather_base", 6, 12, "BFloat16", None)
        assert (rs["Collective name"], rs["In msg nelems"], rs["Out msg nelems"], rs["dtype"], rs_op) == (
            "_reduce_scatter_base", 8, 4, "Float", "sum")
        for record in (ar, ag, rs):
            assert record["Group size"] == 2 and record["Rank"] == rank
            assert record["Process Group Ranks"] == "[0, 1]"
            assert record["In split size"] == "[]" and record["Out split size"] == "[]"
        assert (ar["Process Group Description"], ag["Process Group Description"]) == ("default_pg", "tp")
        assert ar["Process Group Name"] != ag["Process Group Name"]
        assert ar["commtag pg uid"] != ag["commtag pg uid"] and ar["commtag lane id"] != ag["commtag lane id"]
        # Seq counts per group: the world's two collectives are 1 and 2, the subgroup's first is 1.
        assert (ar["Seq"], rs["Seq"], ag["Seq"]) == (1, 2, 1)
    # The cross-rank key is the same on both ranks for each collective.
    keys = [[(r["commtag pg uid"], r["Seq"]) for r, _ in res["records"]] for res in results]
    assert keys[0] == keys[1]


def _ddp_body(rank: int, world_size: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from commtag.runtime.capture import c10d_ops

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
    sink = _ListSink()
    mode = c10d_ops.activate(sink)
    try:
        model(torch.ones(2, 4) * (rank + 1)).sum().backward()
    finally:
        c10d_ops.deactivate(mode)
    # A wrapper already recording the call: the op only lends it its reduction op.
    sink.outer = type("Token", (), {"reduce_op": None})()
    mode = c10d_ops.activate(sink)
    try:
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.MAX)
    finally:
        c10d_ops.deactivate(mode)
    return {"records": sink.records, "outer_op": sink.outer.reduce_op,
            "grad": model.module.weight.grad.tolist()}


def test_ddp_reducer_allreduce_is_intercepted_and_wrapped_calls_are_left_to_the_wrapper() -> None:
    results = run_world(_ddp_body, 2)
    for rank, res in enumerate(results):
        (bucket, op), = res["records"]  # the reducer's one bucket; the wrapped all_reduce is not recorded again
        assert bucket["Collective name"] == "allreduce" and op == "sum"
        assert bucket["In msg nelems"] == 4 * 3 + 3 and bucket["dtype"] == "Float"
        assert bucket["Rank"] == rank and bucket["Process Group Description"] == "default_pg"
        assert res["outer_op"] == "max"
    # DDP averaged the gradients: both ranks hold the same values.
    assert results[0]["grad"] == results[1]["grad"]


class _Stop(Exception):
    """Raised where the c10d operator would run: the call has been seen, the backend need not run it."""


def _dtype_body(rank: int, world_size: int) -> dict[str, tuple[str, str]]:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from commtag import vocab
    from commtag.runtime.capture import c10d_ops
    from commtag.runtime.describe import metadata

    class Seen(TorchDispatchMode):
        """Keeps the c10d operator call a torch.distributed function makes, then stops it."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "c10d":
                self.call = (func, args, kwargs or {})
                raise _Stop
            return func(*args, **(kwargs or {}))

    warnings.simplefilter("ignore")  # quantized tensors are deprecated
    names = {}
    for row in vocab.DTYPES:
        dtype = getattr(torch, row.attr, None)
        if not isinstance(dtype, torch.dtype):
            continue
        if dtype.is_quantized if hasattr(dtype, "is_quantized") else row.attr.startswith("q"):
            tensor = torch._empty_affine_quantized([4], scale=0.1, zero_point=0, dtype=dtype)
        else:
            tensor = torch.zeros(4, dtype=dtype)
        seen = Seen()
        try:
            with seen:
                dist.all_reduce(tensor)
        except _Stop:
            pass
        func, args, kwargs = seen.call
        # Each path describes the call as it would before annotating it (the Python wrapper's
        # describer with the caller's arguments, the dispatch mode's with the operator's).
        names[row.attr] = (metadata.OPS["all_reduce"](tensor).dtype, c10d_ops.describe_call(func, args, kwargs).dtype)
    return names


def test_every_dtype_is_named_alike_by_the_python_wrapper_and_at_operator_level() -> None:
    """Every dtype has one name on both paths: a qint8 tensor is "QInt8" through the Python wrapper
    and at operator level (not "Undefined")."""
    from commtag import vocab

    (names,) = run_world(_dtype_body, 1)
    assert names["qint8"] == ("QInt8", "QInt8")
    assert names["complex64"] == ("Float", "Float")  # recorded as its real view, on both paths
    assert len(names) > 30
    for attr, (python_path, operator_path) in names.items():
        expected = vocab.SCALAR_TYPE_OF[attr]
        assert python_path == operator_path == vocab.RECORDED_AS_REAL.get(expected, expected), attr


def _captured_python_calls_body(rank: int, world_size: int) -> dict[str, Any]:
    """commtag installed, a capture open (over the in-memory graph API: no GPU here)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from test_capture_bookkeeping import MAIN, FakeGraphAPI

    import commtag
    from commtag.runtime import capture
    from commtag.runtime.capture import c10d_ops
    from commtag.runtime.install import hooks

    class Owner:
        def raw_cuda_graph_exec(self) -> int:
            return 0xE1

    commtag.install()
    api = FakeGraphAPI()
    capture.use_tracker(capture.CaptureTracker(api))
    capture.current_stream = lambda: MAIN  # type: ignore[assignment]
    seen_by_mode: list[str] = []
    dispatch = c10d_ops._CaptureOpMode.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            seen_by_mode.append(func._opname)
        return dispatch(self, func, types, args, kwargs)

    c10d_ops._CaptureOpMode.__torch_dispatch__ = spy
    owner = Owner()
    try:
        hooks.capture_begin_hook(lambda self: api.begin(MAIN))(owner)
        x, y = torch.full((4,), float(rank + 1)), torch.full((4,), float(rank + 1))
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        dist.all_reduce(y)
        z = funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD))
        hooks.capture_end_hook(lambda self: api.end(MAIN, 0xE1))(owner)
        (record,) = capture.captures_snapshot()
    finally:
        c10d_ops._CaptureOpMode.__torch_dispatch__ = dispatch
        commtag.uninstall()
    return {"values": (x.tolist(), y.tolist(), z.tolist()), "seen_by_mode": seen_by_mode,
            "recorded": [(c.annotation.collective_name, c.reduce_op, c.source) for c in record.collectives]}


def test_a_captured_python_call_is_recorded_once_with_its_reduction_and_its_operator_not_boxed() -> None:
    """The wrapper records the call and takes the mode off the stack while it runs, so the c10d
    operator inside reaches no Python (what made a captured collective cost ~300 us on an H100);
    the reduction comes from the call's own arguments."""
    for res in run_world(_captured_python_calls_body, 2):
        assert res["values"] == ([2.0] * 4, [3.0] * 4, [2.0, 2.0])
        assert res["recorded"] == [("allreduce", "max", "python"), ("allreduce", "sum", "python"),
                                   ("allreduce", "sum", "c10d-op")]
        assert [op for op in res["seen_by_mode"] if op.startswith("all")] == ["all_reduce"]  # funcol's only
