"""A small 2-rank gloo job profiled by the installed torch: the traces and sidecars it writes.

    python launch/compat_traces.py OUT_DIR

launch/compat.sh runs it under every torch version; the traces written by the newest ones
(torch 2.14, 2.15) are kept under tests/data/torch-traces/ so that CI, on an older torch,
merges what a newer profiler wrote (tests/test_compat_traces.py).
"""

from __future__ import annotations

import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

import commtag

WORLD = 2


def _rank(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    commtag.install()
    try:
        pair = dist.new_group([0, 1], group_desc="pair")
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out)):
            t = torch.ones(256)
            dist.all_reduce(t)
            dist.all_reduce(t, group=pair)
            dist.broadcast(t, src=0, group=pair)
            dist.all_gather_into_tensor(torch.empty(256 * WORLD), t)
            dist.all_to_all_single(torch.empty(8), torch.ones(8))
            if rank == 0:
                dist.send(torch.ones(4), dst=1)
            else:
                dist.recv(torch.zeros(4), src=0)
            dist.barrier()
    finally:
        commtag.uninstall()
        dist.destroy_process_group()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank, args=(f"{tmp}/store", str(out)), nprocs=WORLD, start_method="spawn")
    print(f"torch {torch.__version__}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main()
