"""How ProcessGroupNCCL2 (nccl2) writes a call that legacy ProcessGroupNCCL writes another way.

One pure rule, shared by the runtime (a group whose backend is nccl2 gets
nccl2's records, see :mod:`commtag.runtime.describe.groups`) and by the generator of
nccl2 records for tests (:mod:`commtag.testing.nccl2`): a call described in
the legacy terms becomes the record(s) nccl2 writes for it. Every value
follows docs/nccl2.md (§2 common rules, §3 per op);
the names and constants are in :mod:`commtag.vocab`. torch-free.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from commtag.identity import format_list
from commtag.vocab import NCCL2_ALLTOALL_EVEN, NCCL2_ALLTOALL_SPLIT, NCCL2_NAMES, NCCL2_PER_TENSOR


class Nccl2Sizes(NamedTuple):
    """What nccl2 writes for one call where legacy writes otherwise (§3)."""

    collective: str
    in_nelems: int
    out_nelems: int
    in_split: str
    out_split: str


def _each(n: int, times: int) -> str:
    return format_list([n] * times)


def nccl2_sizes(collective: str, in_nelems: int, out_nelems: int, in_split: str, out_split: str,
                group_size: int, rank: int, own_rank: int) -> Optional[Nccl2Sizes]:
    """nccl2's name, nelems and split sizes for one call given as legacy writes it.

    ``rank`` is legacy's "Rank" (the root of a rooted op), ``own_rank`` the
    caller's group rank. nccl2's splits are the numel of each tensor in the
    guard's input / output list (§2), so a single-tensor op gives ``"[n]"``.
    None for a legacy name nccl2 has no single record for (the coalesced
    names: :data:`commtag.vocab.NCCL2_PER_TENSOR` names their parts, each described alone).
    """
    n_in, n_out, size = in_nelems, out_nelems, group_size
    if collective == "all_to_allv":
        # §3: both split lists empty -> the even engine; any list -> the v engine, whose record
        # keeps the tensors' numel, not the user's split lists.
        engine = NCCL2_ALLTOALL_EVEN if in_split == "[]" and out_split == "[]" else NCCL2_ALLTOALL_SPLIT
        return Nccl2Sizes(engine, n_in, n_out, format_list([n_in]), format_list([n_out]))
    name = NCCL2_NAMES.get(collective)
    if name is None or collective in NCCL2_PER_TENSOR:
        return None
    if collective == "all_gather":
        # §3: the guard's input list is the output list: in = N·n, out = n.
        return Nccl2Sizes(name, n_out, n_in, _each(n_in, size), format_list([n_in]))
    if collective == "reduce_scatter":
        return Nccl2Sizes(name, n_in, n_out, _each(n_out, size), format_list([n_out]))
    if collective == "gather":
        # §3: n / N·n on the root, n / 0 elsewhere (legacy: n / N·n on every rank).
        if rank == own_rank:
            return Nccl2Sizes(name, n_in, n_in * size, format_list([n_in]), _each(n_in, size))
        return Nccl2Sizes(name, n_in, 0, format_list([n_in]), "[]")
    if collective == "scatter":
        # §3: N·n / n on the root, 0 / n elsewhere.
        if rank == own_rank:
            return Nccl2Sizes(name, n_out * size, n_out, _each(n_out, size), format_list([n_out]))
        return Nccl2Sizes(name, 0, n_out, "[]", format_list([n_out]))
    if collective == "barrier":
        return Nccl2Sizes(name, 0, 0, "[]", "[]")
    if collective == "all_to_all":
        return Nccl2Sizes(name, n_in, n_out, in_split, out_split)
    # all_reduce, broadcast, reduce, send, recv (one tensor each way) and the tensor forms of
    # all_gather / reduce_scatter (one input, one output).
    return Nccl2Sizes(name, n_in, n_out, format_list([n_in]), format_list([n_out]))

