"""The vocabulary (commtag.vocab) against the real torch: one table per fact, and it is complete."""

from __future__ import annotations

import torch

from commtag import vocab
from commtag.schema import CollectiveAnnotation


def test_every_torch_dtype_has_one_scalar_type_name_and_its_size() -> None:
    dtypes = {getattr(torch, name) for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)}
    table = {getattr(torch, row.attr): row for row in vocab.DTYPES}
    assert set(table) == dtypes
    assert len({row.scalar_type for row in vocab.DTYPES}) == len(vocab.DTYPES)
    for dtype, row in table.items():
        if row.nbytes is not None:
            assert row.nbytes == dtype.itemsize, row
    assert vocab.SCALAR_TYPE_OF["qint8"] == "QInt8" and vocab.SCALAR_TYPE_BYTES["BFloat16"] == 2


def test_the_annotation_serializes_exactly_the_eager_keys_in_the_profilers_order() -> None:
    annotation = CollectiveAnnotation.model_validate({
        "Collective name": "send", "In msg nelems": 4, "Out msg nelems": 4, "Group size": 2, "dtype": "QInt8",
        "Global rank start": 0, "Global rank stride": 1, "Process Group Name": "0",
        "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]", "Rank": 1, "Dst Rank": 1,
        "Src Rank": 0, "Seq": 1, "commtag lane id": 60, "commtag lane": "PG 0", "commtag pg uid": "0:x",
    })
    eager = [key for key in annotation.eager_dict() if not key.startswith("commtag ")]
    assert tuple(eager) == vocab.EAGER_KEYS
    assert set(vocab.KERNEL_EAGER_KEYS) <= set(vocab.EAGER_KEYS)


def test_each_catalogue_row_is_named_for_its_family_and_its_kernel() -> None:
    """A row's family is what the family rule reads from its name (the gloo works and NCCL kernels
    of that name are found by it), and its NCCL kernel collective is one the recogniser knows."""
    for name, row in vocab.COLLECTIVES.items():
        assert vocab.family(name) == row.family, name
        kernel = f"ncclDevKernel_{row.nccl_kernel}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
        assert vocab.parse_nccl_kernel(kernel).collective == row.nccl_kernel
        assert (row.busbw_size is None) == (row.busbw_factor is None), name
    assert vocab.SYNCHRONIZING_FAMILIES == {"allreduce", "allgather", "reducescatter", "alltoall", "barrier"}
    assert vocab.COALESCED_NAMES["_allgather_base"] == "allgather_into_tensor_coalesced"


def test_one_recogniser_says_which_kernels_are_nccl_or_rccl() -> None:
    names = {
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "allreduce",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "sendrecv",
        "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)": "generic",  # RCCL on MI300 too
        "_Z31ncclDevKernel_AllGather_RING_LL24ncclDevKernelArgsStorageILm4096EE": "allgather",  # mangled
        "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>(int, float)": None,
    }
    for name, kind in names.items():
        assert vocab.nccl_kind(name) == kind, name
        assert (vocab.parse_nccl_kernel(name) is None) == (kind is None), name
    assert vocab.parse_nccl_kernel("_Z31ncclDevKernel_AllGather_RING_LL24ncclDevKernelArgsStorageILm4096EE") == (
        "AllGather", None, None)


def test_graph_launches_of_cuda_the_driver_and_hip_are_one_rule() -> None:
    launches = ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "cudaGraphLaunch_ptsz", "cuGraphLaunch", "hipGraphLaunch")
    assert all(vocab.is_graph_launch(name) for name in launches)
    assert not any(vocab.is_graph_launch(name) for name in ("cudaLaunchKernel", "cudaGraphInstantiate", "hipLaunchKernel"))


def test_the_runtime_op_tables_take_each_eager_name_from_the_catalogue() -> None:
    """metadata.OPS (torch.distributed functions) and c10d_ops.DESCRIBERS (c10d operators) name
    no collective themselves: vocab says which eager name each records, and it is a catalogue row
    (that the recorded names are the eager profiler's: test_runtime_parity, test_capture_c10d_ops)."""
    from commtag.runtime.capture import c10d_ops
    from commtag.runtime.describe import metadata

    assert set(metadata.OPS) == set(vocab.FUNCTION_COLLECTIVES)
    assert set(c10d_ops.DESCRIBERS) == set(vocab.OPERATOR_COLLECTIVES)
    assert set(vocab.FUNCTION_COLLECTIVES.values()) | set(vocab.OPERATOR_COLLECTIVES.values()) <= set(vocab.COLLECTIVES)
    assert metadata.P2P_OPS == {"send", "recv"}


def test_nccl2_and_symmetric_memory_rows_are_named_for_their_family_with_a_busbw_rule() -> None:
    """nccl2's engine names and the symmetric-memory records are known kinds: the family rule
    reads each from its name, and a row either has both busbw size and factor or neither."""
    for table in (vocab.NCCL2_COLLECTIVES, vocab.SYMM_MEM_COLLECTIVES):
        for name, row in table.items():
            assert vocab.family(name) == row.family, name
            assert (row.busbw_size is None) == (row.busbw_factor is None), name
    for name, row in vocab.NCCL2_COLLECTIVES.items():
        kernel = f"ncclDevKernel_{row.nccl_kernel}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
        assert vocab.parse_nccl_kernel(kernel).collective == row.nccl_kernel, name
    # Every nccl2 name the legacy names map to has a row, and so has each p2p name.
    named = set(vocab.NCCL2_NAMES.values()) | {vocab.NCCL2_ALLTOALL_EVEN, vocab.NCCL2_ALLTOALL_SPLIT}
    assert named | vocab.NCCL2_P2P_NAMES == set(vocab.NCCL2_COLLECTIVES)
    assert set(vocab.NCCL2_PER_TENSOR.values()) <= set(vocab.COLLECTIVES)
    assert vocab.NCCL2_NON_COLLECTIVES <= vocab.NON_COLLECTIVE_NAMES
    assert all(name.startswith(vocab.SYMM_MEM_PREFIX) for name in vocab.SYMM_MEM_COLLECTIVES)
    assert not set(vocab.SYMM_MEM_COLLECTIVES) & set(vocab.COLLECTIVES)


def test_the_names_torch_added_record_as_their_c10d_op() -> None:
    """gather_single (torch 2.14+) runs c10d's gather; every function name maps to a known row."""
    assert vocab.FUNCTION_COLLECTIVES["gather_single"] == "gather"
    assert set(vocab.FUNCTION_COLLECTIVES.values()) <= set(vocab.COLLECTIVES)
    assert set(vocab.NCCL2_PER_TENSOR) <= set(vocab.COLLECTIVES)
