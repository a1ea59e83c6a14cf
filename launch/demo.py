"""commtag demo: a small data- and tensor-parallel model, profiled, one trace + sidecar per rank.

    torchrun --nproc-per-node=4 launch/demo.py --out traces
    python launch/demo.py --out traces            # spawns its own 4 ranks

Four ranks form a 2x2 mesh: two tensor-parallel groups ({0,1}, {2,3}) and two
data-parallel groups ({0,2}, {1,3}). Each step runs:

* broadcast (TP): the TP group's first rank hands its micro-batch to its peer;
* all_reduce (TP): the row-parallel output projection sums its partial
  products in forward, and the column-parallel input's gradient in backward;
* all_to_all_single (DP, uneven splits): MoE-style routing of tokens to
  experts and back, again in backward;
* reduce_scatter_single + all_gather_single (DP; before torch 2.13
  reduce_scatter_tensor + all_gather_into_tensor, the same calls): ZeRO-style
  gradient reduction and parameter re-assembly;
* all_gather (world): every rank's loss, for the log line.
gloo on CPU by default; NCCL on CUDA when every rank has its own GPU.
Afterwards ``traces/`` holds ``rank{R}.step{S}.pt.trace.json.gz`` and
``rank{R}.step{S}.commtag.json`` per rank, and rank 0 prints a summary.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

import commtag
from commtag.constants import SIDECAR_SUFFIX, TRACE_SUFFIX
from commtag.sidecarfile import read_sidecar
from commtag.testing.bench import free_port

WORLD = 4
TP = 2
DIM, HIDDEN, TOKENS = 32, 64, 16


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all_reduce of the input gradient over TP in backward (Megatron's 'f')."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """all_reduce over TP in forward; identity backward (Megatron's 'g')."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; the gradient travels the reverse way."""

    @staticmethod
    def forward(ctx, x, in_splits: list[int], out_splits: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.in_splits, ctx.out_splits, ctx.group = in_splits, out_splits, group
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty(sum(ctx.in_splits), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return back, None, None, None


class TensorParallelMLP(torch.nn.Module):
    """Replicated input layer, column-parallel up projection, row-parallel down projection,
    one expert per DP rank."""

    def __init__(self, tp_group: dist.ProcessGroup) -> None:
        super().__init__()
        self.tp_group = tp_group
        self.inp = torch.nn.Linear(DIM, DIM)
        self.up = torch.nn.Linear(DIM, HIDDEN // TP)
        self.down = torch.nn.Linear(HIDDEN // TP, DIM, bias=False)
        self.expert = torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, dp_group: dist.ProcessGroup, send: int) -> torch.Tensor:
        x = _CopyToTP.apply(torch.tanh(self.inp(x)), self.tp_group)
        y = _ReduceFromTP.apply(self.down(torch.relu(self.up(x))), self.tp_group)
        return y + _route_through_experts(y, dp_group, send, self.expert)


def _route_through_experts(y: torch.Tensor, dp_group: dist.ProcessGroup, send: int,
                           expert: torch.nn.Module) -> torch.Tensor:
    """Send ``send`` tokens to the DP peer's expert and get them back (uneven all_to_all_single)."""
    me = dist.get_rank(dp_group)
    in_splits = [TOKENS - send, send] if me == 0 else [send, TOKENS - send]
    counts_in = torch.tensor(in_splits, dtype=torch.int64, device=y.device)
    counts_out = torch.empty_like(counts_in)
    dist.all_to_all_single(counts_out, counts_in, group=dp_group)
    out_splits = counts_out.tolist()
    routed = _AllToAll.apply(y, in_splits, out_splits, dp_group)
    return _AllToAll.apply(expert(routed), out_splits, in_splits, dp_group)


def _zero_step(model: torch.nn.Module, dp_group: dist.ProcessGroup, lr: float = 0.05) -> None:
    """ZeRO-1 style: reduce-scatter gradients over DP, update my shard, all-gather parameters."""
    params = [p for p in model.parameters() if p.grad is not None]
    size = dist.get_world_size(dp_group)
    flat_grad = torch.cat([p.grad.reshape(-1) for p in params])
    flat_param = torch.cat([p.detach().reshape(-1) for p in params])
    pad = (-flat_grad.numel()) % size
    flat_grad = torch.nn.functional.pad(flat_grad, (0, pad))
    flat_param = torch.nn.functional.pad(flat_param, (0, pad))
    shard = flat_grad.new_empty(flat_grad.numel() // size)
    # The ``_single`` ops from torch 2.13 on; before, the ops they replaced (same positional
    # arguments, recorded alike). Looked up per call: commtag.install() replaces them.
    reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    reduce_scatter(shard, flat_grad, group=dp_group)
    me = dist.get_rank(dp_group)
    my_params = flat_param[me * shard.numel():(me + 1) * shard.numel()] - lr * shard / size
    all_gather(flat_param, my_params.contiguous(), group=dp_group)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat_param[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def run(rank: int, world_size: int, out: Path, steps: int) -> None:
    """One rank of the demo (process group already initialised)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    # Every rank creates every group, in the same order (torch requires it).
    tp_groups = [dist.new_group([0, 1], group_desc="tp"), dist.new_group([2, 3], group_desc="tp")]
    dp_groups = [dist.new_group([0, 2], group_desc="dp"), dist.new_group([1, 3], group_desc="dp")]
    tp_group, dp_group = tp_groups[rank // TP], dp_groups[rank % TP]
    torch.manual_seed(rank)
    tp_root = (rank // TP) * TP
    model = TensorParallelMLP(tp_group).to(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
                 on_trace_ready=commtag.trace_handler(out)) as prof:
        for step in range(steps + 2):
            x = torch.randn(TOKENS, DIM, device=device)
            dist.broadcast(x, tp_root, group=tp_group)  # both TP ranks work on one micro-batch
            loss = model(x, dp_group, send=1 + (step + rank) % 5).pow(2).mean()
            model.zero_grad()
            loss.backward()
            _zero_step(model, dp_group)
            losses = [torch.empty(1, device=device) for _ in range(world_size)]
            dist.all_gather(losses, loss.detach().reshape(1))
            if rank == 0:
                print(f"step {step}: mean loss {torch.cat(losses).mean().item():.4f}", flush=True)
            prof.step()
    dist.barrier()
    if rank == 0:
        _summary(out, world_size)


def _summary(out: Path, world_size: int) -> None:
    """What every rank recorded, read back from the sidecars as the merger will."""
    sidecars = sorted(out.glob(f"rank*{SIDECAR_SUFFIX}"))
    traces = sorted(out.glob(f"rank*{TRACE_SUFFIX}"))
    print(f"\n{len(traces)} traces and {len(sidecars)} sidecars in {out}/ (world size {world_size})")
    per_lane: Counter = Counter()
    run_ids = set()
    for path in sidecars:
        side = read_sidecar(path)
        run_ids.add(side.run_id)
        for rc in side.collectives:
            per_lane[(rc.annotation.lane_name, rc.annotation.collective_name)] += 1
    print(f"run id: {', '.join(sorted(run_ids))}")
    for (lane, name), count in sorted(per_lane.items()):
        print(f"  {lane:<34} {name:<22} {count:>4} calls (all ranks)")


def _clear_old(out: Path) -> None:
    """Remove an earlier demo's files (only names commtag writes) so the merger sees one run."""
    for pattern in (f"rank*{TRACE_SUFFIX}", f"rank*{SIDECAR_SUFFIX}"):
        for path in out.glob(pattern):
            path.unlink()


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= WORLD else "gloo"


def _spawned(rank: int, world_size: int, port: int, out: str, steps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # all ranks are on this host
    _main_in_rank(Path(out), steps)


def _main_in_rank(out: Path, steps: int) -> None:
    commtag.install()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size != WORLD:
        raise SystemExit(f"the demo needs {WORLD} ranks (got {world_size})")
    backend = _backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    try:
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            _clear_old(out)
        dist.barrier()
        run(rank, world_size, out, steps)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="traces", help="directory for traces and sidecars (default: traces)")
    parser.add_argument("--steps", type=int, default=3, help="profiled (active) steps (default: 3)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _main_in_rank(out, args.steps)  # under torchrun
        return 0
    mp.start_processes(_spawned, args=(WORLD, free_port(), str(out), args.steps), nprocs=WORLD, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
