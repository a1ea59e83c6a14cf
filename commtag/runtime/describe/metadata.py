"""The per-op table: what the eager NCCL profiler would record for each call.

Each entry of :data:`OPS` is a function with the same parameters as the
torch.distributed function it describes, so Python itself binds the user's
positional and keyword arguments exactly as the real call does. It returns an
:class:`~commtag.runtime.describe.calls.OpCall` (names, sizes, dtype, whose rank goes into "Rank") or None
when the call will not run a collective on this rank (not a member).

The table follows docs/eager-metadata.md: "Collective
name" is the c10d op name (:data:`commtag.vocab.FUNCTION_COLLECTIVES`), nelems
count the local input and output, complex tensors count as their real view,
and "Rank" is the root for rooted ops and the peer for send/recv.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch

from commtag.identity import format_list
from commtag.runtime.describe.calls import RECORDED_SIZES, OpCall, dtype_name, nelems
from commtag.runtime.describe.groups import GroupState, lookup
from commtag.vocab import BARRIER_DTYPE, FUNCTION_COLLECTIVES, P2P_COLLECTIVES
from commtag.vocab import COALESCED_NAMES as COALESCED_NAMES  # the fused block's name, read by grouped

#: The group's state, or None when this rank does not take part (lookup itself: no extra frame per call).
_state = lookup
#: The eager "Collective name" a torch.distributed function records (vocab.FUNCTION_COLLECTIVES).
_eager = FUNCTION_COLLECTIVES.__getitem__


def _root(state: GroupState, global_rank: Optional[int], group_rank: Optional[int]) -> int:
    """Group rank of a root/peer given either as a global or as a group rank."""
    if group_rank is not None:
        return group_rank
    if global_rank is None:
        raise ValueError("neither a global nor a group rank was given for the root/peer")
    return state.ranks.index(global_rank)


def _same(collective: str, state: GroupState, tensor: torch.Tensor, rank: int, async_op: bool,
          reduce_op: Any = None, fusable: bool = False) -> OpCall:
    # One table lookup for the dtype's name and count, and OpCall's fields by position (no
    # keywords to match): the most common calls are described on every collective the ring keeps.
    name, per_element = RECORDED_SIZES[tensor.dtype]
    n = tensor.numel() * per_element
    return OpCall(collective, state, n, n, name, rank, "[]", "[]", None, None, bool(async_op), fusable, reduce_op)


#: torch.distributed's default reduction, read once (one object: a class attribute read per call otherwise).
_DEFAULT_REDUCTION = torch.distributed.ReduceOp.SUM


#: all_reduce's eager name, read once for its describer.
_ALL_REDUCE = _eager("all_reduce")


def _reduction(op: Any) -> Any:
    """The reduction a call names, as it names it (torch.distributed's default where it names
    none): named only where a capture needs it (:func:`commtag.runtime.describe.calls.reduce_name`)."""
    return _DEFAULT_REDUCTION if op is None else op


def _all_reduce(tensor, op=None, group=None, async_op=False):
    state = _state(group)
    if state is None:
        return None
    # _same and _reduction inlined (two frames fewer): the most common collective.
    name, per_element = RECORDED_SIZES[tensor.dtype]
    n = tensor.numel() * per_element
    return OpCall(_ALL_REDUCE, state, n, n, name, state.group_rank, "[]", "[]", None, None, bool(async_op), True,
                  _DEFAULT_REDUCTION if op is None else op)


def _all_reduce_coalesced(tensors, op=None, group=None, async_op=False):
    state = _state(group)
    if state is None:
        return None
    total = sum(nelems(t) for t in tensors)
    return OpCall(_eager("all_reduce_coalesced"), state, total, total, dtype_name(tensors[0]), state.group_rank,
                  async_op=bool(async_op), reduce_op=_reduction(op))


def _broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    state = _state(group)
    if state is None:
        return None
    return _same(_eager("broadcast"), state, tensor, _root(state, src, group_src), async_op)


def _reduce(tensor, dst=None, op=None, group=None, async_op=False, group_dst=None):
    state = _state(group)
    if state is None:
        return None
    return _same(_eager("reduce"), state, tensor, _root(state, dst, group_dst), async_op, _reduction(op))


def _all_gather(tensor_list, tensor, group=None, async_op=False):
    state = _state(group)
    if state is None:
        return None
    n = nelems(tensor)
    return OpCall(_eager("all_gather"), state, n, n * state.size, dtype_name(tensor), state.group_rank,
                  async_op=bool(async_op))


def _all_gather_base(output_tensor, input_tensor, group=None, async_op=False):
    state = _state(group)
    if state is None:
        return None
    return OpCall(_eager("all_gather_into_tensor"), state, nelems(input_tensor), nelems(output_tensor),
                  dtype_name(output_tensor), state.group_rank, async_op=bool(async_op), fusable=True)


def _reduce_scatter(output, input_list, op=None, group=None, async_op=False):
    state = _state(group)
    if state is None:
        return None
    n = nelems(output)
    return OpCall(_eager("reduce_scatter"), state, n * state.size, n, dtype_name(output), state.group_rank,
                  async_op=bool(async_op), reduce_op=_reduction(op))


def _reduce_scatter_base(output, input, op=None, group=None, async_op=False):
    state = _state(group)
    if state is None:
        return None
    return OpCall(_eager("reduce_scatter_tensor"), state, nelems(input), nelems(output), dtype_name(output),
                  state.group_rank, async_op=bool(async_op), fusable=True, reduce_op=_reduction(op))


def _all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                       async_op=False):
    state = _state(group)
    if state is None:
        return None
    return OpCall(_eager("all_to_all_single"), state, nelems(input), nelems(output), dtype_name(input), state.group_rank,
                  in_split=format_list(list(input_split_sizes or [])),
                  out_split=format_list(list(output_split_sizes or [])), async_op=bool(async_op))


def _all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    state = _state(group)
    if state is None:
        return None
    ins = [nelems(t) for t in input_tensor_list]
    outs = [nelems(t) for t in output_tensor_list]
    return OpCall(_eager("all_to_all"), state, sum(ins), sum(outs), dtype_name(input_tensor_list[0]), state.group_rank,
                  in_split=format_list(ins), out_split=format_list(outs), async_op=bool(async_op))


def _gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    state = _state(group)
    if state is None:
        return None
    n = nelems(tensor)
    return OpCall(_eager("gather"), state, n, n * state.size, dtype_name(tensor), _root(state, dst, group_dst),
                  async_op=bool(async_op))


def _gather_single(tensor, gather_tensor=None, dst=None, group=None, async_op=False, group_dst=None):
    """torch 2.14+'s gather into one tensor (``gather_into_tensor`` is its alias): c10d's gather."""
    return _gather(tensor, None, dst, group, async_op, group_dst)


def _scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    state = _state(group)
    if state is None:
        return None
    n = nelems(tensor)
    return OpCall(_eager("scatter"), state, n * state.size, n, dtype_name(tensor), _root(state, src, group_src),
                  async_op=bool(async_op))


def _barrier(group=None, async_op=False, device_ids=None, timeout=None):
    state = _state(group)
    if state is None:
        return None
    return OpCall(_eager("barrier"), state, 0, 0, BARRIER_DTYPE, state.group_rank, async_op=bool(async_op))


def _monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """gloo's barrier that names the ranks that did not arrive: a barrier on its group (one
    collective Seq on every member). Its send/recv to and from group rank 0 run inside
    ProcessGroupGloo, not through torch.distributed.send/recv, so they take no p2p number."""
    return _barrier(group)


def p2p_call(kind: str, tensor: torch.Tensor, peer: Optional[int], group: Any, group_peer: Optional[int]) -> Optional[OpCall]:
    """A send or recv; ``peer`` global or ``group_peer`` group rank (both None: recv from any)."""
    state = _state(group)
    if state is None:
        return None
    if peer is None and group_peer is not None:
        peer = state.ranks[group_peer]
    rank = state.ranks.index(peer) if peer is not None else 0
    n = nelems(tensor)
    return OpCall(kind, state, n, n, dtype_name(tensor), rank, p2p=kind, peer=peer)


def _send(tensor, dst=None, group=None, tag=0, group_dst=None):
    return p2p_call(_eager("send"), tensor, dst, group, group_dst)


def _recv(tensor, src=None, group=None, tag=0, group_src=None):
    return p2p_call(_eager("recv"), tensor, src, group, group_src)


#: torch.distributed function name -> describer with the same parameters.
OPS: dict[str, Callable[..., Optional[OpCall]]] = {
    "all_reduce": _all_reduce,
    "all_reduce_coalesced": _all_reduce_coalesced,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_gather": _all_gather,
    "all_gather_single": _all_gather_base,
    "all_gather_into_tensor": _all_gather_base,
    "_all_gather_base": _all_gather_base,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_single": _reduce_scatter_base,
    "reduce_scatter_tensor": _reduce_scatter_base,
    "_reduce_scatter_base": _reduce_scatter_base,
    "all_to_all_single": _all_to_all_single,
    "all_to_all": _all_to_all,
    "gather": _gather,
    "gather_single": _gather_single,
    "gather_into_tensor": _gather_single,
    "scatter": _scatter,
    "barrier": _barrier,
    "monitored_barrier": _monitored_barrier,
    "send": _send,
    "recv": _recv,
}

#: Ops whose describer reads one tensor, the op's first parameter, which is the one torch.distributed
#: checks for ``__torch_function__`` (``relevant_args``): where ``has_torch_function`` is false for it,
#: no mode is active and it is a plain tensor, so describing the call reaches no ``__torch_function__``.
ONE_TENSOR_OPS = frozenset({"all_reduce", "broadcast", "reduce"})
#: Position of the ``group`` parameter of each op, for the hot path that needs only the group.
GROUP_INDEX: dict[str, int] = {name: list(inspect.signature(fn).parameters).index("group") for name, fn in OPS.items()}
#: Ops numbered on the group's p2p counter.
P2P_OPS = frozenset(name for name in OPS if FUNCTION_COLLECTIVES[name] in P2P_COLLECTIVES)
