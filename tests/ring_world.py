"""A real gloo job whose ring keeps the same calls twice: first with only the ring on (no profiler,
no capture), then while a profiler records, for the test that the two are dumped alike.

``python tests/ring_world.py RANK WORLD_SIZE STORE_DIR DUMP_DIR``: each rank runs :func:`calls`
twice and writes its ring into DUMP_DIR with ``commtag.dump()``.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path


def calls(rank: int, world_size: int) -> None:
    """One of each kind the ring describes: sync and async, same-size, rooted, gathered, scattered,
    split, complex, a barrier and a send/recv pair."""
    import torch
    import torch.distributed as dist

    floats = torch.ones(6)
    dist.all_reduce(floats)
    dist.all_reduce(torch.ones(3, dtype=torch.complex64))
    dist.all_reduce(torch.ones(5, dtype=torch.float64), async_op=True).wait()
    dist.broadcast(torch.ones(7, dtype=torch.int32), src=world_size - 1)
    dist.reduce(floats, dst=0)
    dist.all_gather([torch.zeros(2) for _ in range(world_size)], torch.ones(2))
    dist.all_gather_single(torch.zeros(2 * world_size), torch.ones(2))
    dist.all_to_all_single(torch.zeros(3 * world_size), torch.ones(3 * world_size),
                           output_split_sizes=[3] * world_size, input_split_sizes=[3] * world_size)
    dist.barrier()
    if rank == 0:
        dist.send(torch.ones(4), dst=1)
    elif rank == 1:
        dist.recv(torch.zeros(4), src=0)


def main(rank: int, world_size: int, store_dir: str, dump_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import commtag

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    commtag.install(dump_dir=Path(dump_dir))
    calls(rank, world_size)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        calls(rank, world_size)
    assert commtag.dump() is not None
    dist.barrier()
    commtag.uninstall()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
