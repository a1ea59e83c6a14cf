"""A real gloo job profiled for some steps and dumped at its end, by torch's Flight Recorder and by
commtag's ring: the input of the tests that join the dumps' entries to the profiled calls.

``run_profiled_and_dumped(out)`` writes ``out/trace`` (each rank's trace and sidecar), ``out/torch``
(torch's pickle dumps, ``fr_<rank>``) and ``out/commtag`` (commtag's, ``commtag_fr_<rank>``). The world
makes one all_reduce before the profile and one after it, and three inside it, as does the pair (0, 1).
"""

from __future__ import annotations

from pathlib import Path

#: The job's ranks, and torch's ring size in it.
WORLD = 3
FR_ENTRIES = 64


def _body(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace
    from torch.profiler import ProfilerActivity, profile

    import commtag

    out = Path(out_dir)
    commtag.install(dump_dir=str(out / "commtag"))
    try:
        pair = dist.new_group([0, 1])
        t = torch.ones(16)
        dist.all_reduce(t)
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(str(out / "trace"))):
            for _ in range(3):
                dist.all_reduce(t)
                if rank < 2:
                    dist.all_reduce(t, group=pair)
        dist.all_reduce(t)
        commtag.dump()
        (out / "torch").mkdir(exist_ok=True)
        (out / "torch" / f"fr_{rank}").write_bytes(_dump_fr_trace(True, True, False))
    finally:
        commtag.uninstall()


def run_profiled_and_dumped(out: Path) -> None:
    from gloo_world import run_world

    run_world(_body, WORLD, str(out), env={"TORCH_FR_BUFFER_SIZE": str(FR_ENTRIES)})  # set before each group starts
