"""Per-collective overhead of commtag: unpatched vs installed-idle vs installed-recording.

One process per rank (gloo, world sizes 1 and 2), all variants in that one
process, interleaved in blocks so drift and neighbours' load hit every variant
alike. Each call is timed on its own (perf_counter_ns around the call); the
figure is the median ns/call over all calls of a variant. The calling thread's
CPU time per call is recorded too: at world size 2 on a shared 2-core machine
the wall time also holds waiting for the peer and for a core, and the CPU time
isolates the work commtag adds to the caller. Variants:

* ``unpatched`` / ``unpatched-again``  commtag not installed (two of them: their
  difference is the measurement's noise floor, an A/A control);
* ``idle``       commtag installed, profiler off;
* ``profiled``   commtag not installed, torch.profiler recording CPU ops;
* ``recording``  commtag installed, torch.profiler recording CPU ops.

Added cost: idle - unpatched, and recording - profiled (the profiler's own
cost is not commtag's). Targets: idle <= 1 us, recording <= 15 us.

Usage: ``python launch/bench_runtime.py [--calls 10000] [--worlds 1,2] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Callable, Optional, Sequence

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import machine, markdown_table, median, verdict  # noqa: E402

VARIANTS = ("unpatched", "idle", "profiled", "recording", "unpatched-again")
TARGET_IDLE_NS = 1_000
TARGET_RECORDING_NS = 15_000


def _ops(dist, torch) -> dict[str, Callable[[], object]]:
    """The collectives measured, each on a small tensor (latency, not bandwidth)."""
    world = dist.get_world_size()
    x = torch.ones(4)
    gathered = torch.empty(4 * world)
    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, src=0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(gathered, x),
    }


def _worker(rank: int, world: int, init_file: str, calls: int, block: int, out_dir: str) -> None:
    """Time every variant on every op, interleaved in blocks of ``block`` calls."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    # Kineto prints a line per profiler start/stop on fd 2; keep it out of the report.
    log = os.open(os.path.join(out_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 2)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    timings = {op: {v: array("q") for v in VARIANTS} for op in _ops(dist, torch)}
    cpu_timings = {op: {v: array("q") for v in VARIANTS} for op in _ops(dist, torch)}
    rounds = max(1, calls // block)
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    for op, call in _ops(dist, torch).items():
        for _ in range(50):  # warm up the transport and the code paths
            call()
        for round_ in range(rounds):
            # Same rotation on every rank, so the ranks stay in lockstep.
            order = VARIANTS[round_ % len(VARIANTS):] + VARIANTS[: round_ % len(VARIANTS)]
            for variant in order:
                if variant in ("idle", "recording"):
                    commtag.install()
                prof = None
                if variant in ("profiled", "recording"):
                    prof = profile(activities=[ProfilerActivity.CPU])
                    prof.__enter__()
                sink, cpu_sink = timings[op][variant], cpu_timings[op][variant]
                try:
                    for _ in range(block):
                        c0 = cpu_clock()
                        t0 = clock()
                        call()
                        t1 = clock()
                        cpu_sink.append(cpu_clock() - c0)
                        sink.append(t1 - t0)
                finally:
                    if prof is not None:
                        prof.__exit__(None, None, None)
                    if commtag.is_installed():
                        commtag.uninstall()
        dist.barrier()
    result = {
        kind: {op: {v: list(t) for v, t in by_variant.items()} for op, by_variant in table.items()}
        for kind, table in (("wall", timings), ("cpu", cpu_timings))
    }
    Path(out_dir, f"rank{rank}.json").write_bytes(orjson.dumps(result))
    dist.destroy_process_group()


def run_world(world: int, calls: int, block: int) -> dict[str, dict[str, dict[str, list[int]]]]:
    """Spawn ``world`` ranks; return rank 0's per-call timings, {"wall"|"cpu": {op: {variant: ns}}}."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="commtag-bench-rt-") as tmp:
        init_file = os.path.join(tmp, "init")
        try:
            mp.spawn(_worker, args=(world, init_file, calls, block, tmp), nprocs=world, join=True)
        except Exception:
            for log in sorted(Path(tmp).glob("rank*.log")):
                lines = [x for x in log.read_text(errors="replace").splitlines() if "USDT" not in x]
                print(f"--- {log.name} (last lines)", *lines[-15:], sep="\n", file=sys.stderr)
            raise
        return orjson.loads(Path(tmp, "rank0.json").read_bytes())


def summarize(world: int, timings: dict[str, dict[str, dict[str, list[int]]]]) -> list[dict]:
    rows = []
    for op, by_variant in timings["wall"].items():
        med = {v: median(t) for v, t in by_variant.items()}
        cpu = {v: median(t) for v, t in timings["cpu"][op].items()}
        rows.append({
            "world": world, "op": op, "calls_per_variant": len(by_variant["unpatched"]),
            "median_ns": med,
            "cpu_median_ns": cpu,
            "idle_added_ns": med["idle"] - med["unpatched"],
            "recording_added_ns": med["recording"] - med["profiled"],
            "recording_vs_unpatched_ns": med["recording"] - med["unpatched"],
            "noise_ns": med["unpatched-again"] - med["unpatched"],
            "cpu_idle_added_ns": cpu["idle"] - cpu["unpatched"],
            "cpu_recording_added_ns": cpu["recording"] - cpu["profiled"],
        })
    return rows


def report(rows: list[dict], info: str) -> str:
    table = []
    for r in rows:
        m = r["median_ns"]
        table.append([
            r["world"], r["op"], r["calls_per_variant"],
            f"{m['unpatched'] / 1e3:.2f}", f"{m['idle'] / 1e3:.2f}", f"{m['profiled'] / 1e3:.2f}",
            f"{m['recording'] / 1e3:.2f}", f"{r['noise_ns'] / 1e3:+.2f}",
            f"{r['idle_added_ns'] / 1e3:+.2f} ({verdict(r['idle_added_ns'], TARGET_IDLE_NS)})",
            f"{r['recording_added_ns'] / 1e3:+.2f} ({verdict(r['recording_added_ns'], TARGET_RECORDING_NS)})",
            f"{r['cpu_idle_added_ns'] / 1e3:+.2f} / {r['cpu_recording_added_ns'] / 1e3:+.2f}",
        ])
    header = ["world", "op", "calls/variant", "unpatched us", "idle us", "profiled us", "recording us",
              "A/A noise us", "idle added us (<= 1)", "recording added us (<= 15)",
              "caller CPU added us, idle / recording"]
    return "\n".join([
        f"Machine: {info}.",
        "Median per call over all calls of a variant; variants interleaved in blocks in one process per rank "
        "(rank 0 shown); gloo, CPU tensors of 4 floats. 'A/A noise' = unpatched measured twice.",
        "",
        markdown_table(header, table),
    ])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls per variant and op (default 10000)")
    parser.add_argument("--block", type=int, default=250, help="calls per interleaved block (default 250)")
    parser.add_argument("--worlds", default="1,2", help="gloo world sizes (default 1,2)")
    parser.add_argument("--quick", action="store_true", help="2000 calls per variant")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    calls = 2_000 if args.quick else args.calls
    info = machine()
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        print(f"runtime overhead: world size {world}, {calls} calls per variant ...", file=sys.stderr, flush=True)
        rows += summarize(world, run_world(world, calls, args.block))
    if args.json:
        args.json.write_bytes(orjson.dumps({"machine": info, "rows": rows}, option=orjson.OPT_INDENT_2))
    print(report(rows, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
