"""Operator-level interception of c10d collectives, only while a graph is captured.

Functional collectives (DTensor, torch.compile) and DDP's C++ reducer call
the ``c10d`` / ``_c10d_functional`` operators from C++ and never pass
through the patched ``torch.distributed`` functions. While a capture is
open, :func:`activate` pushes a dispatch mode that sees every such operator
call, describes it the way the eager NCCL profiler would, and hands it to
a sink (the capture tracker) with the graph nodes it created. Eager runs
and replays never have the mode pushed, so they pay nothing.

A call made from inside a patched Python function is left to that wrapper
(it already records the call); the mode only adds the reduction op to the
wrapper's record, which the wrapper does not know in operator form.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, cast

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode_temporarily

from commtag.identity import format_list
from commtag.runtime.capture.tracker import CollectiveToken
from commtag.runtime.describe.calls import OpCall, dtype_name, nelems, numbered_now, reduce_name
from commtag.runtime.failopen import log_once
from commtag.runtime.describe.groups import GroupState, state_for
from commtag.schema import CollectiveAnnotation
from commtag.vocab import BARRIER_DTYPE, OPERATOR_COLLECTIVES

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

log = logging.getLogger("commtag.capture")

_NAMESPACES = frozenset({"c10d", "_c10d_functional"})
#: Describes one operator call (its arguments by schema name) under its eager "Collective name".
Describer = Callable[[str, dict], OpCall]

def _numel(tensors: Any) -> int:
    if isinstance(tensors, torch.Tensor):
        return nelems(tensors)
    return sum(_numel(t) for t in tensors)


def _first(tensors: Any) -> torch.Tensor:
    while not isinstance(tensors, torch.Tensor):
        tensors = tensors[0]
    return tensors


def _group(value: Any) -> GroupState:
    """The state of the group an operator carries: a ScriptObject, a group name, or the group."""
    if isinstance(value, torch.ScriptObject):
        value = dist.ProcessGroup.unbox(value)
    elif isinstance(value, str):
        value = dist.distributed_c10d._resolve_process_group(cast("GroupName", value))
    return state_for(value)


def _bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _same_size(tensors_key: str, *, reduce: bool = False, root_key: Optional[str] = None) -> Describer:
    """Ops whose output is as large as their input (allreduce, broadcast, reduce), in place or not."""

    def describe(name: str, a: dict) -> OpCall:
        tensors = a[tensors_key]
        n = _numel(tensors)
        state = _group(a.get("process_group", a.get("group_name")))
        return OpCall(
            name, state, n, n, dtype_name(_first(tensors)), int(a[root_key]) if root_key else state.group_rank,
            reduce_op=reduce_name(a.get("reduce_op")) if reduce else None, async_op=bool(a.get("async_op", False)),
        )

    return describe


def _io(in_key: str, out_key: Optional[str], dtype_of: str, *, reduce: bool = False, gather: int = 0) -> Describer:
    """Ops with distinct input and output. ``gather``: +1 output = input x size, -1 output = input / size."""

    def describe(name: str, a: dict) -> OpCall:
        state = _group(a.get("process_group", a.get("group_name")))
        size = int(a.get("group_size") or state.size)
        n_in = _numel(a[in_key])
        if out_key is not None:
            n_out = _numel(a[out_key])
        else:
            n_out = n_in * size if gather > 0 else n_in // size
        source = a[in_key] if dtype_of == "input" or out_key is None else a[out_key]
        return OpCall(
            name, state, n_in, n_out, dtype_name(_first(source)), state.group_rank,
            reduce_op=reduce_name(a.get("reduce_op")) if reduce else None, async_op=bool(a.get("async_op", False)),
        )

    return describe


def _splits(sizes: Any) -> str:
    return format_list([int(s) for s in sizes or ()])


def _alltoall_base(name: str, a: dict) -> OpCall:
    out, inp = a["output"], a["input"]
    state = _group(a["process_group"])
    return OpCall(name, state, _numel(inp), _numel(out), dtype_name(inp), state.group_rank,
                  in_split=_splits(a.get("input_split_sizes")), out_split=_splits(a.get("output_split_sizes")),
                  async_op=bool(a.get("async_op", False)))


def _alltoall_single_functional(name: str, a: dict) -> OpCall:
    inp = a["input"]
    out_splits = tuple(int(s) for s in a["output_split_sizes"])
    in_splits = tuple(int(s) for s in a["input_split_sizes"])
    row = inp[0].numel() if inp.dim() and inp.shape[0] else 0
    n_out = sum(out_splits) * row if out_splits else inp.numel()
    state = _group(a["group_name"])
    return OpCall(name, state, inp.numel(), n_out, dtype_name(inp), state.group_rank,
                  in_split=format_list(list(in_splits)), out_split=format_list(list(out_splits)))


def _alltoall(name: str, a: dict) -> OpCall:
    ins, outs = a["input_tensors"], a["output_tensors"]
    state = _group(a["process_group"])
    return OpCall(name, state, _numel(ins), _numel(outs), dtype_name(_first(ins)), state.group_rank,
                  in_split=format_list([t.numel() for t in ins]), out_split=format_list([t.numel() for t in outs]),
                  async_op=bool(a.get("async_op", False)))


def _rooted(in_key: str, out_key: str, dtype_of: str, gather: bool) -> Describer:
    def describe(name: str, a: dict) -> OpCall:
        state = _group(a["process_group"])
        small = a[in_key] if gather else a[out_key]
        n = _numel(small)
        n_in, n_out = (n, n * state.size) if gather else (n * state.size, n)
        source = a[in_key] if dtype_of == "input" else a[out_key]
        return OpCall(name, state, n_in, n_out, dtype_name(_first(source)), int(a["root_rank"]),
                      async_op=bool(a.get("async_op", False)))

    return describe


def _barrier_op(name: str, a: dict) -> OpCall:
    state = _group(a["process_group"])
    return OpCall(name, state, 0, 0, BARRIER_DTYPE, state.group_rank, async_op=bool(a.get("async_op", False)))


#: (namespace, op name without overload) -> how to describe a call, given the eager name
#: vocab.OPERATOR_COLLECTIVES says it records. p2p ops are not intercepted: a p2p capture is
#: always issued through the patched Python functions.
DESCRIBERS: dict[tuple[str, str], Describer] = {
    ("c10d", "allreduce_"): _same_size("tensors", reduce=True),
    ("c10d", "allreduce_coalesced_"): _same_size("tensors", reduce=True),
    ("c10d", "broadcast_"): _same_size("tensors", root_key="root_rank"),
    ("c10d", "reduce_"): _same_size("tensors", reduce=True, root_key="root_rank"),
    ("c10d", "allgather_"): _io("input_tensors", "output_tensors", "input"),
    ("c10d", "_allgather_base_"): _io("input_tensor", "output_tensor", "output"),
    ("c10d", "allgather_into_tensor_coalesced_"): _io("inputs", "outputs", "output"),
    ("c10d", "allgather_coalesced_"): _io("input_list", "output_lists", "input"),
    ("c10d", "reduce_scatter_"): _io("input_tensors", "output_tensors", "output", reduce=True),
    ("c10d", "_reduce_scatter_base_"): _io("input_tensor", "output_tensor", "output", reduce=True),
    ("c10d", "reduce_scatter_tensor_coalesced_"): _io("inputs", "outputs", "output", reduce=True),
    ("c10d", "alltoall_base_"): _alltoall_base,
    ("c10d", "alltoall_"): _alltoall,
    ("c10d", "gather_"): _rooted("input_tensors", "output_tensors", "input", gather=True),
    ("c10d", "scatter_"): _rooted("input_tensors", "output_tensors", "output", gather=False),
    ("c10d", "barrier"): _barrier_op,
    ("_c10d_functional", "all_reduce"): _same_size("input", reduce=True),
    ("_c10d_functional", "all_reduce_"): _same_size("input", reduce=True),
    ("_c10d_functional", "all_reduce_coalesced"): _same_size("inputs", reduce=True),
    ("_c10d_functional", "all_reduce_coalesced_"): _same_size("inputs", reduce=True),
    ("_c10d_functional", "all_gather_into_tensor"): _io("input", None, "input", gather=1),
    ("_c10d_functional", "all_gather_into_tensor_out"): _io("input", "out", "output"),
    ("_c10d_functional", "all_gather_into_tensor_coalesced"): _io("inputs", None, "input", gather=1),
    ("_c10d_functional", "reduce_scatter_tensor"): _io("input", None, "input", reduce=True, gather=-1),
    ("_c10d_functional", "reduce_scatter_tensor_out"): _io("input", "out", "output", reduce=True),
    ("_c10d_functional", "reduce_scatter_tensor_coalesced"): _io("inputs", None, "input", reduce=True, gather=-1),
    ("_c10d_functional", "all_to_all_single"): _alltoall_single_functional,
    ("_c10d_functional", "broadcast"): _same_size("input", root_key="src"),
    ("_c10d_functional", "broadcast_"): _same_size("input", root_key="src"),
}


def describe_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[OpCall]:
    """The eager-profiler description of a c10d operator call, or None for ops commtag does not annotate."""
    key = (func.namespace, func._opname)
    describe = DESCRIBERS.get(key)
    if describe is None:
        return None
    return describe(OPERATOR_COLLECTIVES[key], _bind(func, args, kwargs))


def annotate(call: OpCall) -> CollectiveAnnotation:
    """The call's annotation, numbered now (this consumes a Seq number: call once, before the op runs)."""
    return CollectiveAnnotation(**numbered_now(call).annotation_fields())


class OpSink(Protocol):
    """Where intercepted calls go (the capture tracker in production, a list in tests)."""

    def wrapper_token(self) -> Optional[Any]:
        """The record of a patched Python function running on this thread, if any."""

    def begin(self) -> Optional[Any]:
        """Called before the operator runs; returns a token (None: do not record)."""

    def end(self, token: Any, annotation: CollectiveAnnotation, reduce_op: Optional[str]) -> None:
        """Called after the operator ran."""


class _CaptureOpMode(TorchDispatchMode):
    """Sees c10d operators; passes every other operator straight through."""

    def __init__(self, sink: OpSink) -> None:
        super().__init__()
        self.sink = sink
        self.enabled = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Let torch.compile trace as if the mode were absent; it is re-enabled for the compiled code's run.
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if not self.enabled or func.namespace not in _NAMESPACES:
            return func(*args, **kwargs)
        try:
            outer = self.sink.wrapper_token()
            if outer is not None:
                # A patched Python function records this call; it only lacks the reduction the op names.
                if getattr(outer, "reduce_op", None) is None and (func.namespace, func._opname) in DESCRIBERS:
                    outer.reduce_op = reduce_name(_bind(func, args, kwargs).get("reduce_op"))
                return func(*args, **kwargs)
            call = describe_call(func, args, kwargs)
            if call is None:
                return func(*args, **kwargs)
            annotation = annotate(call)
            token = self.sink.begin()
        except Exception as exc:  # noqa: BLE001 - fail open: run the op as if commtag were absent
            log_once(f"describing {func}", exc)
            return func(*args, **kwargs)
        result = func(*args, **kwargs)
        if token is not None:
            try:
                if isinstance(token, CollectiveToken):
                    token.kept = (call, annotation.seq)
                self.sink.end(token, annotation, call.reduce_op)
            except Exception as exc:  # noqa: BLE001 - fail open: the op has run; recording it must not fail it
                log_once(f"recording {func}", exc)
        return result


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Off this thread's dispatch stack while a patched function runs a call it records itself.

    The c10d operator inside would otherwise be boxed into Python (its process
    group and reduction as script objects) only to be passed through, and so
    would every operator of the call: most of what a captured collective cost.
    Where another mode sits above commtag's, it stays and passes them through.
    """
    if not isinstance(_get_current_dispatch_mode(), _CaptureOpMode):
        yield
        return
    with _pop_mode_temporarily():
        yield


def activate(sink: OpSink) -> Optional[_CaptureOpMode]:
    """Push the interception mode on this thread's dispatch stack; None if that failed."""
    try:
        mode = _CaptureOpMode(sink)
        mode.__enter__()
        return mode
    except Exception as exc:  # noqa: BLE001 - fail open: no interception, the capture goes on unannotated
        log_once("activating c10d operator interception", exc)
        return None


def deactivate(mode: Optional[_CaptureOpMode]) -> None:
    """Pop ``mode``; if something else was pushed above it and left there, just disable it."""
    if mode is None:
        return
    mode.enabled = False
    try:
        if _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
        else:
            log.warning("commtag: another dispatch mode sits above commtag's; leaving an inert one on the stack")
    except Exception as exc:  # noqa: BLE001 - fail open: uninstalling must not raise into the job
        log_once("deactivating c10d operator interception", exc)


def is_active() -> bool:
    """True when an enabled commtag interception mode is on this thread's dispatch stack."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(m, _CaptureOpMode) and m.enabled for m in _get_current_dispatch_mode_stack())
