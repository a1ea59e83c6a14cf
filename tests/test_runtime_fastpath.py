"""The idle fast path numbers collectives exactly as the profiled path does.

What a user checks: a collective's Seq is the same on every rank, and the
same whether the profiler ran throughout or was switched on half-way (with
nesting ops, coalescing blocks, batched p2p, a subgroup, __torch_function__
dispatch and async ops before and after the switch). Also the corner the
fast path must not miss: the profiler switched on or off between a call and
the call torch makes back into the wrapper from inside it (a
TorchFunctionMode that toggles the profiler), and install-time reading of
which originals can call a wrapper again.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.overrides import TorchFunctionMode

from gloo_world import run_world
from torch_ops import delegating_ops, has

WORLD = 2


class _PassThrough(TorchFunctionMode):
    """A mode that only forwards: the original calls the wrapper again from inside itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Sub(torch.Tensor):
    """A tensor subclass: dispatch through __torch_function__ as well."""


def _gather_single():
    """all_gather_single where this torch has it (2.13 on), else the op it replaced: the same
    positional parameters, the same numbering."""
    return dist.all_gather_single if has("all_gather_single") else dist.all_gather_into_tensor


def _schedule(group, rank: int, world: int) -> list:
    """(label, call) pairs on ``group``: every kind of numbering the runtime does."""
    x = torch.ones(4)

    def coalesced() -> None:
        with dist._coalescing_manager(group=group):
            dist.all_reduce(torch.ones(2), group=group)
            dist.all_reduce(torch.ones(3), group=group)

    def batched() -> None:
        peer = (rank + 1) % world, (rank - 1) % world
        ops = [dist.P2POp(dist.isend, torch.ones(2), peer[0], group), dist.P2POp(dist.irecv, torch.zeros(2), peer[1], group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def mode() -> None:
        with _PassThrough():
            dist.all_reduce(x, group=group)

    return [
        ("all_reduce", lambda: dist.all_reduce(x, group=group)),
        ("broadcast", lambda: dist.broadcast(x, src=0, group=group)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(4 * world), x, group=group)),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world), group=group)),
        ("coalesced", coalesced),
        ("batch_isend_irecv", batched),
        ("torch-function mode", mode),
        ("subclass", lambda: dist.all_reduce(x.as_subclass(_Sub), group=group)),
        ("async all_gather", lambda: _gather_single()(torch.empty(4 * world), x, group, True).wait()),
        ("_all_gather_base", lambda: dist._all_gather_base(torch.empty(4 * world), x, group=group)),
        ("barrier", lambda: dist.barrier(group=group)),
        ("default group", lambda: dist.all_reduce(torch.ones(1))),
    ]


def _seqs(rank: int, world: int, out_dir: str) -> dict:
    """Run the schedule twice per mode, each mode on a fresh group (fresh counters)."""
    import commtag
    from torch.profiler import ProfilerActivity, profile

    from commtag.runtime.describe.groups import state_for
    from commtag.sidecarfile import read_sidecar

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor & co. are deprecated
    commtag.install()
    results: dict = {}
    for mode in ("throughout", "midway", "idle"):
        group = dist.new_group(list(range(world)))
        calls = _schedule(group, rank, world) * 2
        switch = {"throughout": 0, "midway": len(calls) // 2, "idle": None}[mode]
        where = Path(out_dir) / f"{mode}-rank{rank}"
        prof = None
        for index, (_, call) in enumerate(calls):
            if index == switch:
                prof = profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(where))
                prof.__enter__()
            call()
        if prof is not None:
            prof.__exit__(None, None, None)
        state = state_for(group)
        recorded = []
        if prof is not None:
            side = read_sidecar(where / f"rank{rank}.step0.commtag.json")
            recorded = [
                (rc.annotation.collective_name, rc.annotation.seq)
                for rc in sorted(side.collectives, key=lambda rc: rc.start_ns)
                if rc.annotation.pg_uid == state.uid and not rc.annotation.is_p2p
            ]
        # The Seq the next collective would take, less one (taking it: the group is not used again).
        results[mode] = {"final": state.next_collective_seq() - 1, "recorded": recorded, "p2p": state.p2p_seq}
    return results


@pytest.fixture(scope="module")
def seqs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_world(_seqs, WORLD, str(tmp_path_factory.mktemp("fastpath")))


@pytest.mark.slow
def test_seq_is_the_same_on_every_rank(seqs: list[dict]):
    assert all(ranks == seqs[0] for ranks in seqs[1:])


@pytest.mark.slow
def test_idle_midway_and_profiled_runs_number_alike(seqs: list[dict]):
    for res in seqs:
        throughout, midway, idle = res["throughout"], res["midway"], res["idle"]
        # Per round: 10 numbered calls on the group (the coalescing block is one; p2p has its own counter).
        assert throughout["final"] == midway["final"] == idle["final"] == 2 * 10
        assert throughout["p2p"] == midway["p2p"] == idle["p2p"] == 2
        names = [name for name, _ in throughout["recorded"]]
        assert [seq for _, seq in throughout["recorded"]] == list(range(1, 21))
        assert names.count("allreduce_coalesced") == 2 and names.count("_allgather_base") == 6
        # Profiled from half-way: exactly the second half of the profiled-throughout run.
        assert midway["recorded"] == throughout["recorded"][10:]


class _Toggle(TorchFunctionMode):
    """Starts or stops a real profiler between the wrapper's call and torch's call back into it."""

    def __init__(self, start: bool) -> None:
        super().__init__()
        self.start = start
        self.prof = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch.profiler import ProfilerActivity, profile

        if self.start:
            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()
        else:
            self.prof.__exit__(None, None, None)
        return func(*args, **(kwargs or {}))


def _toggle_inside(rank: int, world: int) -> list[int]:
    import commtag
    from torch.profiler import ProfilerActivity, profile

    from commtag.runtime.install import idle
    from commtag.runtime.describe.groups import state_for

    warnings.simplefilter("ignore", FutureWarning)
    commtag.install()
    x, out = torch.ones(2), torch.empty(2 * world)
    steps = []
    def numbered(call) -> int:
        """Seq numbers ``call`` took (a group commtag counts itself also gives one to each reading)."""
        state = state_for(None)
        read_takes = 0 if state.gloo is not None else 1
        before = state.next_collective_seq()
        call()
        return state.next_collective_seq() - before - read_takes

    for op in (lambda: dist.all_reduce(x), lambda: dist.all_gather_into_tensor(out, x)):
        op()  # the group is known: the next calls can take the fast path
        mode = _Toggle(start=True)

        def started_inside(mode=mode, op=op) -> None:
            with mode:
                op()  # idle when called, profiled when torch calls back in

        steps.append(numbered(started_inside))
        mode.prof.__exit__(None, None, None)
        mode = _Toggle(start=False)
        mode.prof = profile(activities=[ProfilerActivity.CPU])
        mode.prof.__enter__()

        def stopped_inside(mode=mode, op=op) -> None:
            with mode:
                op()  # profiled when called, idle when torch calls back in

        steps.append(numbered(stopped_inside))
    steps.append(idle.slow_reasons())
    return steps


@pytest.mark.slow
def test_profiler_switched_between_a_call_and_torch_calling_back_in_counts_once():
    assert run_world(_toggle_inside, WORLD) == [[1, 1, 1, 1, 0]] * WORLD


# ---------------------------------------------------------------------------
# Install-time reading of the originals (toy functions: names are looked up as globals).


def all_gather_single(output, input, group=None, async_op=False):  # torch's own parameter names
    return None


def has_torch_function(args):
    return False


def handle_torch_function(*args, **kwargs):
    return None


def _nesting(output_tensor, input_tensor, group=None, async_op=False):
    return all_gather_single(output_tensor, input_tensor, group, async_op)


def _dispatching(tensor, group=None):
    relevant_args = (tensor,)
    if has_torch_function(relevant_args):
        return handle_torch_function(_dispatching, relevant_args, tensor, group=group)
    return group.broadcast([tensor])  # an attribute named like a patched op: not a call of it


def _dispatching_second(tensor_list, tensor, group=None):
    relevant_args = (tensor,)
    if has_torch_function(relevant_args):
        return handle_torch_function(_dispatching_second, relevant_args, tensor_list, tensor, group=group)
    return None


def _dispatching_on_a_list(tensors, group=None):
    relevant_args = tuple(tensors) if isinstance(tensors, list) else (tensors,)
    if has_torch_function(relevant_args):
        return handle_torch_function(_dispatching_on_a_list, relevant_args, tensors, group=group)
    return None


def _recursive(tensor, group=None):
    return _recursive(tensor, group)


def _two_inner(output_tensor, input_tensor, group=None):
    all_gather_single(output_tensor, input_tensor, group)
    return all_gather_single(output_tensor, input_tensor, group)


PATCHED = {"all_gather_single", "_nesting", "_dispatching", "_dispatching_second", "_dispatching_on_a_list",
           "_recursive", "_two_inner", "broadcast"}
COUNTABLE = PATCHED


@pytest.mark.parametrize(
    ("func", "kind", "tf_index", "inner"),
    [
        (_nesting, "nesting", None, "all_gather_single"),
        (_dispatching, "plain", 0, None),
        (_dispatching_second, "plain", 1, None),
        (_dispatching_on_a_list, "unknown", None, None),
        (_recursive, "unknown", None, None),
        (_two_inner, "unknown", None, None),
        (len, "unknown", None, None),
    ],
)
def test_install_reads_which_originals_call_a_wrapper_again(func, kind, tf_index, inner):
    from commtag.runtime.install.reentry import classify

    shape = classify(func, func.__name__, PATCHED, COUNTABLE)
    assert (shape.kind, shape.tf_index, shape.inner) == (kind, tf_index, inner), shape


@pytest.mark.slow
def test_torch_originals_are_read_as_expected():
    """In this torch, which wrappers take the fast path (a newer torch may legitimately differ)."""
    import commtag
    from commtag.runtime.install import patch
    from commtag.runtime.describe.metadata import OPS

    originals = {name: getattr(c10d, name) for name in OPS if hasattr(c10d, name)}
    shapes = {name: patch.shape_of(original, name) for name, original in originals.items()}
    commtag.install()
    try:
        replaced = {name for name, original in originals.items() if getattr(c10d, name) is not original}
    finally:
        commtag.uninstall()
    # A wrapper that could only pass the call on to another wrapper is not installed.
    assert replaced == {name for name, shape in shapes.items() if shape.kind != "nesting"}
    # What install() read from the code is what this torch does: an op is left in place exactly
    # when a call of it enters another op (watched on a real gloo group), and that op is the
    # one install() names (torch 2.13: all_gather_into_tensor -> all_gather_single, ...).
    nesting = {name: shape.inner for name, shape in shapes.items() if shape.kind == "nesting"}
    watched = delegating_ops(sorted(originals))
    assert nesting == {name: inner for name, (inner, *_) in watched.items()}
    for name in ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single", "barrier"):
        if name in shapes:
            assert shapes[name].kind == "plain", (name, shapes[name])


def test_wrappers_take_the_originals_parameters_and_raise_their_errors():
    # A wrapper has the original's signature, and a call that is wrong for the original fails
    # the same way (tests/test_runtime_wrong_calls.py makes more wrong calls on real groups).
    import inspect

    import commtag

    names = [n for n in ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single", "barrier",
                         "all_to_all_single") if has(n)]
    originals = {name: getattr(dist, name) for name in names}
    bad_calls = [((), {"bogus": 1}), ((torch.ones(1),) * 7, {}), ((torch.ones(1),), {"bogus": 1})]

    def error(func, args, kwargs) -> str:
        try:
            func(*args, **kwargs)
        except TypeError as exc:
            return str(exc)
        return "no error"

    expected = {name: [error(f, a, k) for a, k in bad_calls] for name, f in originals.items()}
    commtag.install()
    try:
        for name, original in originals.items():
            wrapped = getattr(dist, name)
            assert wrapped is not original and wrapped.__wrapped__ is original, name
            assert inspect.signature(wrapped) == inspect.signature(original), name
            assert [error(wrapped, a, k) for a, k in bad_calls] == expected[name], name
    finally:
        commtag.uninstall()
    assert all(msg != "no error" for msgs in expected.values() for msg in msgs)


def _keyword_only(rank: int, world: int, where: str) -> tuple:
    """all_reduce replaced, before install, by a function with keyword-only parameters."""
    from torch.profiler import ProfilerActivity, profile

    import commtag
    from commtag.sidecarfile import read_sidecar

    real = c10d.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, *, group=None, async_op=False):
        return real(tensor, op, group=group, async_op=async_op)

    c10d.all_reduce = dist.all_reduce = all_reduce
    commtag.install()
    try:
        entry = dist.all_reduce.__code__.co_filename
        x = torch.ones(2)
        for _ in range(3):
            dist.all_reduce(x)  # idle (the first one meets a group not seen yet: the slow path)
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(where)):
            dist.all_reduce(x, group=dist.group.WORLD)
    finally:
        commtag.uninstall()
        c10d.all_reduce = dist.all_reduce = real
    side = read_sidecar(Path(where) / f"rank{rank}.step0.commtag.json")
    return entry, [(c.annotation.collective_name, c.annotation.seq) for c in side.collectives], x.tolist()


@pytest.mark.slow
def test_an_original_whose_parameters_cannot_be_copied_gets_the_same_idle_gate(tmp_path: Path):
    """Its idle entry takes ``*args, **kwargs`` and is made from the same template: numbered alike."""
    for entry, recorded, values in run_world(_keyword_only, WORLD, str(tmp_path)):
        assert entry == "<commtag idle path of all_reduce>"
        assert recorded == [("allreduce", 4)]
        assert values == [float(WORLD ** 4)] * 2
