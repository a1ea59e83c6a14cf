"""Real gloo jobs that hang, each rank its own process, for the Flight Recorder tests.

``run_hang_world(job, world_size, out_dir)`` starts ``python tests/hang_world.py JOB RANK ...`` per
rank with a gloo timeout of a few seconds, and returns each rank's exit status. The ranks that time
out set a key in the job's store; the rank that hangs waits on those keys, so it is still alive,
stuck, when its peers give up (as in a real hang), and every rank then dumps torch's Flight Recorder
under ``out_dir/torch`` (pickle) and ``out_dir/torch_json`` (JSON), named ``fr_<rank>`` as torch
names them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

#: The gloo timeout of the hanging jobs: the seconds a rank waits in a call its peer never enters.
GLOO_TIMEOUT_S = 3
#: The most any hang job may take, ranks starting included (a loaded CI machine).
WORLD_DEADLINE_S = 600
#: torch's ring size in these jobs.
FR_ENTRIES = 64


def run_hang_world(job: str, world_size: int, out_dir: Path, env: dict[str, str] | None = None) -> list[int]:
    """Run ``job`` on ``world_size`` ranks; each rank's exit status, in rank order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    store = tempfile.mkdtemp(prefix="hang_world_")
    worker_env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                  "TORCH_FR_BUFFER_SIZE": str(FR_ENTRIES), **(env or {})}
    procs = [subprocess.Popen([sys.executable, __file__, job, str(rank), str(world_size), store, str(out_dir)],
                              env=worker_env) for rank in range(world_size)]
    try:
        return [proc.wait(timeout=WORLD_DEADLINE_S) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _dump_torch(rank: int, out_dir: Path) -> None:
    """torch's own Flight Recorder dumps of this rank, in both forms torch writes."""
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    for folder, data in (("torch", _dump_fr_trace(True, True, False)), ("torch_json", _dump_fr_trace_json(True, True))):
        (out_dir / folder).mkdir(exist_ok=True)
        (out_dir / folder / f"fr_{rank}").write_bytes(data)


def skip_fourth_all_reduce(rank: int, world_size: int, store, out_dir: Path) -> None:
    """Every rank all_reduces six times on the world, but the last rank never enters the 4th."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(8)
    for step in range(6):
        if step == 3 and rank == world_size - 1:
            store.wait([f"failed{r}" for r in range(world_size - 1)], timedelta(seconds=WORLD_DEADLINE_S))
            break
        try:
            dist.all_reduce(tensor)
        except RuntimeError:  # gloo's timeout: the peer never came
            store.set(f"failed{rank}", "1")
            break
    _dump_torch(rank, out_dir)


JOBS = {"skip_fourth_all_reduce": skip_fourth_all_reduce}


def _go_when_all_started(store, world_size: int) -> None:
    import time

    while store.add("started", 0) < world_size:
        time.sleep(0.05)
    store.set("go", "1")


def main(job: str, rank: int, world_size: int, store_dir: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(f"{store_dir}/store", world_size)
    store.set_timeout(timedelta(seconds=WORLD_DEADLINE_S))
    # Every rank started (torch imported) before the short gloo timeout counts.
    store.add("started", 1)
    store.wait(["go"]) if rank else _go_when_all_started(store, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    JOBS[job](rank, world_size, store, Path(out_dir))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
