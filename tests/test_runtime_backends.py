"""Which implementation runs a group, told at run time, and the record format that follows."""

from __future__ import annotations

import os
import socket

import torch.distributed as dist

from commtag.runtime import groups
from commtag.vocab import LEGACY_FORMAT, NCCL2_FORMAT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_gloo_group_is_told_by_its_backend_object_and_keeps_the_legacy_format() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        state = groups.lookup(None)
        assert state is not None
        assert set(state.backend_impls.values()) == {"gloo"} and "cpu" in state.backend_impls
        assert state.record_format == LEGACY_FORMAT and state.info().record_format == LEGACY_FORMAT
        assert state.annotation_fields["pg_desc"] == "default_pg"
    finally:
        groups.GROUP_STATES.clear()
        dist.destroy_process_group()


def test_the_format_follows_the_nccl_implementation_not_the_backend_string() -> None:
    """'nccl' names legacy ProcessGroupNCCL and ProcessGroupNCCL2 alike (nccl2-and-hooks.md §1):
    the backend object's own name decides; a group with an nccl2 CUDA backend writes nccl2's
    format for all its calls."""
    assert groups.record_format({"cuda": "nccl"}) == LEGACY_FORMAT
    assert groups.record_format({"cuda": "nccl2"}) == NCCL2_FORMAT
    assert groups.record_format({"cuda": "nccl-lazy"}) == NCCL2_FORMAT
    assert groups.record_format({"cpu": "gloo", "cuda": "nccl2"}) == NCCL2_FORMAT
    assert groups.record_format({"cpu": "gloo"}) == LEGACY_FORMAT
    assert groups.record_format({}) == LEGACY_FORMAT
