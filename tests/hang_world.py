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
import signal
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


def run_hang_world(job: str, world_size: int, out_dir: Path, env: dict[str, str] | None = None,
                   stop_after_others: bool = False) -> list[int]:
    """Run ``job`` on ``world_size`` ranks; each rank's exit status, in rank order. With
    ``stop_after_others``, once every other rank has ended the last one gets SIGTERM, as torchrun
    stops the rest of a job when one rank fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    store = tempfile.mkdtemp(prefix="hang_world_")
    worker_env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                  "TORCH_FR_BUFFER_SIZE": str(FR_ENTRIES), **(env or {})}
    procs = [subprocess.Popen([sys.executable, __file__, job, str(rank), str(world_size), store, str(out_dir)],
                              env=worker_env) for rank in range(world_size)]
    try:
        if stop_after_others:
            for proc in procs[:-1]:
                proc.wait(timeout=WORLD_DEADLINE_S)
            procs[-1].send_signal(signal.SIGTERM)
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


def commtag_skip_fourth_all_reduce(rank: int, world_size: int, store, out_dir: Path) -> None:
    """The same hang with commtag's ring on: the ranks that time out raise (and die, as a job
    would), commtag writing its dump and torch's; the rank that hangs blocks until it is stopped."""
    import torch
    import torch.distributed as dist

    import commtag

    commtag.install(dump_dir=out_dir / "commtag")
    tensor = torch.ones(8)
    for step in range(6):
        if step == 3 and rank == world_size - 1:
            _block_forever(store)
        dist.all_reduce(tensor)


def pipeline_hangs_in_send(rank: int, world_size: int, store, out_dir: Path) -> None:
    """Stages 0 -> 1 -> 2 pass six microbatches on; the last stage stops receiving after the second,
    so stage 1's third send to it never completes; commtag's ring is on."""
    import torch
    import torch.distributed as dist

    import commtag

    commtag.install(dump_dir=out_dir / "commtag")
    activation = torch.ones(PIPELINE_NUMEL)
    for microbatch in range(6):
        if rank > 0:
            if rank == world_size - 1 and microbatch == 2:
                _block_forever(store)
            dist.recv(activation, rank - 1)
        if rank < world_size - 1:
            dist.send(activation, rank + 1)


#: A microbatch large enough that a send waits for its receiver (socket buffers hold less).
PIPELINE_NUMEL = 4 << 20


def _block_forever(store) -> None:
    """Stuck outside any collective, in C++ (as a rank blocked in its own code is), until stopped."""
    store.wait(["never set"], timedelta(seconds=WORLD_DEADLINE_S))
    raise RuntimeError("the hanging rank was not stopped")


def on_demand_dumps(rank: int, world_size: int, store, out_dir: Path) -> None:
    """The ring on, 4 calls kept: commtag.dump() and SIGUSR1 write it and the job goes on; the job's
    own SIGUSR1 handler still runs. Each rank writes what it saw to ``seen_<rank>.json``."""
    import json
    import os
    import signal as signals
    import time

    import torch
    import torch.distributed as dist

    import commtag
    from commtag.merge.hangs.dumps import load_plain_pickle, read_dump

    own_handler_calls = []
    signals.signal(signals.SIGUSR1, lambda signum, frame: own_handler_calls.append(signum))
    # Python's own SIGINT handler, as in a job started from a terminal: one started in the background
    # of a non-interactive shell inherits SIGINT ignored, and Python then leaves it ignored.
    signals.signal(signals.SIGINT, signals.default_int_handler)
    commtag.install(dump_dir=out_dir / "commtag", ring_size=4)
    tensor = torch.ones(8)
    for _ in range(2):
        dist.all_reduce(tensor)
    path = commtag.dump()
    after_dump = [e.seq for e in read_dump(path, rank).entries]
    for _ in range(4):
        dist.all_reduce(tensor)
    os.kill(os.getpid(), signals.SIGUSR1)
    dist.barrier()  # the handler has run (between bytecodes) by the time the job goes on
    after_signal = read_dump(path, rank)
    dist.all_reduce(tensor)
    interrupted = False
    try:  # SIGINT: dumped, then Python's own handler raises KeyboardInterrupt, as without commtag
        os.kill(os.getpid(), signals.SIGINT)
        time.sleep(60)
    except KeyboardInterrupt:
        interrupted = True
    reason = load_plain_pickle(path.read_bytes())["commtag_dump_reason"]
    # A job that ignores SIGINT (started with '&' from a script) still gets its dump, and goes on.
    commtag.uninstall()
    signals.signal(signals.SIGINT, signals.SIG_IGN)
    commtag.install(dump_dir=out_dir / "commtag", ring_size=4)
    commtag.dump()
    os.kill(os.getpid(), signals.SIGINT)
    dist.all_reduce(tensor)  # the handler has run by the time the job goes on
    ignored_reason = load_plain_pickle(path.read_bytes())["commtag_dump_reason"]
    seen = {"path": str(path), "after_dump": after_dump, "after_signal": [e.seq for e in after_signal.entries],
            "own_handler_calls": len(own_handler_calls), "result": tensor[0].item(), "interrupted": interrupted,
            "reason": reason, "ignored_reason": ignored_reason}
    (out_dir / f"seen_{rank}.json").write_text(json.dumps(seen))


JOBS = {"on_demand_dumps": on_demand_dumps, "skip_fourth_all_reduce": skip_fourth_all_reduce,
        "commtag_skip_fourth_all_reduce": commtag_skip_fourth_all_reduce,
        "pipeline_hangs_in_send": pipeline_hangs_in_send}


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
