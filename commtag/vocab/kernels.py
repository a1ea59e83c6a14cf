"""NCCL/RCCL kernel names and what they say of their collective."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple, Optional


#: A kernel NCCL or RCCL launched for a collective, and the collective its name gives:
#: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (NCCL 2.19+), ``ncclKernel_AllReduce_RING_LL_Sum_float``
#: (older), ``ncclDevKernel_Generic`` (NCCL and RCCL: the collective is in the args only),
#: ``ncclSymkDevKernel_AllReduce_RSxLDMC_AGxSTMC_sum_bf16`` (NCCL 2.27+'s symmetric-memory kernels,
#: :data:`NCCL_SYMMETRIC_KERNEL`). The one recogniser: :func:`nccl_kind` and :func:`parse_nccl_kernel` read it.
NCCL_KERNEL = re.compile(r"(?:nccl|rccl)(?:SymkDev|Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
#: The prefix of NCCL's symmetric-memory kernels: a collective on buffers every rank registered
#: in a symmetric window (torch dispatches plain collectives to them when the tensors come from a
#: symmetric memory pool, pytorch#192515). NCCL's src/device/symmetric/generate.py names each
#: ``ncclSymkDevKernel_<Coll>_<Algo>[_<red>_<ty>]``: the algorithm joins steps with "x" and "_"
#: (``AGxLL_R``, ``RSxLDMC_AGxSTMC``, ``GinHier_MCRing``), the reduction and type are lowercase and
#: only the reducing collectives have them (``ncclSymkDevKernel_AllGather_LL``).
NCCL_SYMMETRIC_PREFIX = "ncclSymkDevKernel_"
#: Kernel names that are communication for the kernel breakdown: NCCL's and RCCL's (as
#: :data:`NCCL_KERNEL` and beyond: MSCCL, NVSHMEM, DeepEP) and custom all-reduce kernels.
COMMUNICATION_KERNELS = (
    r"nccl|rccl|msccl|nvshmem|deep_?ep|multimem|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter"
    r"|all_?to_?all|sendrecv"
)
_NCCL_NEW = re.compile(
    r"^ncclDevKernel_([A-Za-z]+?)(?:_(Sum|Prod|MinMax|Max|Min|PreMulSum|SumPostDiv))?(?:_([a-z]+[0-9a-z]*))?"
    r"(?:_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE|PAT)_(LL128|LL|SIMPLE))?$")
_NCCL_SYMMETRIC = re.compile(
    r"^ncclSymkDevKernel_([A-Za-z]+?)_([A-Za-z0-9_]+?)"
    r"(?:_(sum|prod|min|max|minmax|premulsum|sumpostdiv)_([a-z]+[0-9a-z]*))?$")
#: NCCL's reduction op in a symmetric kernel's name (generate.py spells them lowercase) -> commtag's name.
NCCL_SYMMETRIC_OPS: dict[str, str] = {
    "sum": "sum", "prod": "product", "max": "max", "min": "min", "premulsum": "premul_sum", "sumpostdiv": "sum_post_div",
}
_NCCL_OLD = re.compile(
    r"^ncclKernel_([A-Za-z]+)_(?:[A-Z_]+?)_(LL128|LL|SIMPLE)_(Sum|Prod|Max|Min|PreMulSum|SumPostDiv)_([A-Za-z0-9_]+)$")
#: NCCL's element type in a kernel name (new and old spelling) -> ScalarType name.
NCCL_KERNEL_TYPES: dict[str, str] = {
    "f32": "Float", "float": "Float", "f16": "Half", "half": "Half", "bf16": "BFloat16", "__nv_bfloat16": "BFloat16",
    "bfloat16": "BFloat16", "f64": "Double", "double": "Double", "i8": "Char", "int8_t": "Char", "u8": "Byte",
    "uint8_t": "Byte", "i32": "Int", "int32_t": "Int", "u32": "UInt32", "uint32_t": "UInt32", "i64": "Long",
    "int64_t": "Long", "u64": "UInt64", "uint64_t": "UInt64", "f8e4m3": "Float8_e4m3fn", "f8e5m2": "Float8_e5m2",
    "__nv_fp8_e4m3": "Float8_e4m3fn", "__nv_fp8_e5m2": "Float8_e5m2",
}
#: NCCL's reduction op in a kernel name -> the op's name as commtag records it.
NCCL_KERNEL_OPS: dict[str, str] = {
    "Sum": "sum", "Prod": "product", "Max": "max", "Min": "min", "PreMulSum": "premul_sum", "SumPostDiv": "sum_post_div",
}
#: NCCL kernel collectives whose names' element type is the data's (the others move bytes).
NCCL_REDUCING = frozenset({"AllReduce", "ReduceScatter", "Reduce"})
#: A user reduction op -> the NCCL kernel ops that may carry it out (avg is a premul or a
#: post-divided sum, bitwise ops run as min/max/product/sum on booleans).
NCCL_OPS_FOR: dict[str, frozenset[str]] = {
    "sum": frozenset({"sum"}), "product": frozenset({"product"}), "max": frozenset({"max"}),
    "min": frozenset({"min"}), "avg": frozenset({"premul_sum", "sum_post_div", "sum"}),
    "premul_sum": frozenset({"premul_sum"}), "band": frozenset({"min", "product"}),
    "bor": frozenset({"max", "sum"}), "bxor": frozenset({"sum"}),
}


@lru_cache(maxsize=65536)
def nccl_kind(name: str) -> Optional[str]:
    """The collective of an NCCL/RCCL kernel name ("allreduce"), None for other kernels (cached: names repeat)."""
    match = NCCL_KERNEL.search(name)
    return match.group(1).lower() if match else None


class NcclKernel(NamedTuple):
    """What an NCCL kernel name says; None = the name does not say."""

    #: NCCL's spelling ("AllReduce", "SendRecv"); "Generic" when the name does not say.
    collective: str
    op: Optional[str]
    dtype: Optional[str]


@lru_cache(maxsize=65536)
def nccl_symmetric(name: str) -> bool:
    """Whether a kernel name is one of NCCL's symmetric-memory kernels (:data:`NCCL_SYMMETRIC_PREFIX`)."""
    return nccl_kind(name) is not None and base_name(name).startswith(NCCL_SYMMETRIC_PREFIX)


@lru_cache(maxsize=65536)
def parse_nccl_kernel(name: str) -> Optional[NcclKernel]:
    """Collective, reduction op and dtype from an NCCL/RCCL kernel name (Kineto's or a mangled
    symbol), old or new style; None if :data:`NCCL_KERNEL` does not recognise it."""
    if nccl_kind(name) is None:
        return None
    base = base_name(name)
    symmetric = _NCCL_SYMMETRIC.match(base)
    if symmetric:
        return _named(symmetric.group(1), symmetric.group(3), symmetric.group(4), NCCL_SYMMETRIC_OPS)
    if base.startswith(NCCL_SYMMETRIC_PREFIX):
        return NcclKernel("Generic", None, None)
    new = _NCCL_NEW.match(base)
    if new:
        return _named(new.group(1), new.group(2), new.group(3), NCCL_KERNEL_OPS)
    old = _NCCL_OLD.match(base)
    if old:
        return _named(old.group(1), old.group(3), old.group(4), NCCL_KERNEL_OPS)
    return NcclKernel("Generic", None, None)


def _named(coll: str, op: Optional[str], ty: Optional[str], ops: dict[str, str]) -> NcclKernel:
    """What a recognised name says: the op and element type only of a reducing collective (the
    others move bytes, whatever type their name carries)."""
    if coll not in NCCL_REDUCING:
        return NcclKernel(coll, None, None)
    return NcclKernel(coll, ops.get(op or ""), NCCL_KERNEL_TYPES.get(ty or ""))


def base_name(name: str) -> str:
    """A kernel's qualified name without return type, template and call arguments.

    Accepts what Kineto writes (demangled, with arguments) and what
    cuFuncGetName returns (often Itanium-mangled), so both compare equal:
    ``"void ns::k<4>(int)"`` and ``"_ZN2ns1kILi4EEEvi"`` both give ``"ns::k"``.
    """
    name = name.strip()
    if name.startswith("_Z"):
        demangled = _mangled_base(name)
        if demangled:
            return demangled
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    out, depth = [], 0
    for ch in name[:cut]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    tokens = "".join(out).split()
    return tokens[-1] if tokens else name


def _mangled_base(name: str) -> str:
    """Qualified name of an Itanium-mangled symbol (enough for kernels; "" if unparsable)."""
    i = 2
    if name.startswith("L", i):
        i += 1
    nested = name.startswith("N", i)
    if nested:
        i += 1
    parts: list[str] = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        length = int(name[i:j])
        parts.append(name[j : j + length])
        i = j + length
        if not nested:
            break
        if i < len(name) and name[i] in "EI":
            break
    return "::".join(parts)
