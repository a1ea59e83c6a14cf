"""One rank of a short 2-rank gloo job, run as its own process: ``python exit_job.py MODE OUT STORE``.

MODE ``commtag`` installs commtag and profiles with its trace handler; ``plain``
profiles the same calls and writes the trace with the profiler's own export.
Either way the job ends as many scripts do: the profiled block closes and the
script returns, without ``destroy_process_group``. Its last call is an async
all_reduce that rank 1 joins late and rank 0 never waits for, so on rank 0 it
completes while the interpreter exits. RANK and WORLD_SIZE come from the
environment, as under torchrun.
"""

from __future__ import annotations

import os
import sys
import time

#: How late rank 1 joins the last call: longer than rank 0 takes to write its files and return.
LATE_S = 2.0


def main(mode: str, out_dir: str, store: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if mode == "commtag":
        import commtag

        commtag.install()
        handler = commtag.trace_handler(out_dir)
    else:
        def handler(prof) -> None:
            prof.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.plain.pt.trace.json"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    t = torch.ones(1024)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler):
        for _ in range(3):
            dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        peer = 1 - rank
        (dist.isend(t, peer) if rank == 0 else dist.irecv(t, peer)).wait()
        dist.barrier()
        if rank == 1:
            time.sleep(LATE_S)
        last = dist.all_reduce(t, async_op=True)
        if rank == 1:
            last.wait()


if __name__ == "__main__":
    main(*sys.argv[1:4])
