"""Per-collective overhead of commtag, measured as paired per-call differences.

What is measured: the time one collective call takes with commtag installed
and idle (no profiler) against the same call without commtag, and with
commtag recording against the same call under the profiler without commtag.
One process per rank (gloo, world sizes 1 and 2, CPU tensors of 4 floats);
rank 0's figures are reported.

Why paired: a gloo call takes 15-400 us and drifts by microseconds from
second to second (frequency, neighbours, the peer's scheduling), so the
difference of two medians taken over separate blocks of calls is as noisy as
the 1 us it is meant to resolve. Here each *pair* times one call of variant A
and one of variant B back to back (even pairs A then B, odd pairs B then A)
and keeps d = tB - tA; drift slower than two calls cancels within each pair.

Before every timed call its variant's state is set, so each timed call
follows the same work: by default (``--toggle swap``) one function sets every
module attribute ``commtag.install()`` sets, either to the wrapper or back to
the original (the objects a real install()/uninstall() put there). Calling
``commtag.install()``/``commtag.uninstall()`` themselves (``--toggle api``)
runs different code before the two variants' calls, and that alone showed up
as ~0.5 us of "added" cost for a wrapper that does nothing but call the
original. "Unpatched" is always measured uninstalled, never by calling the
saved original while installed: ``all_gather_into_tensor``'s original calls
``all_gather_single`` through the module, which would still be the wrapper.

The first call of a pair follows the loop's own bookkeeping, the second
only a toggle; that shifts d one way in A-first pairs and the other way in
B-first pairs (with ``--toggle api`` also a real vs an idempotent toggle).
The added cost is therefore the mean of the two orders' medians (see
:func:`balanced`); a median over all d's would land anywhere between the two
modes whenever that shift exceeds the noise.

Pairs, each interleaved in blocks of ``--block`` pairs, rotating which kind
of pair comes first:

* ``idle``       unpatched vs installed-idle (profiler off);
* ``recording``  profiled vs installed-recording: both inside one
  torch.profiler session (CPU activity) per block, install toggled per call;
  the kept collectives are dropped between blocks (``recorder.drain()``);
* ``A/A``        unpatched vs unpatched: the measurement's bias (it should
  be ~0).

The calling thread's CPU time per call is paired the same way: at world size
2 on a shared 2-core machine the wall time also holds waiting for the peer
and for a core, and the CPU time isolates the work commtag adds to the caller.

Targets: idle added <= 1 us, recording added <= 15 us (the profiler's own
cost is not commtag's, hence profiled vs recording).

Usage: ``python launch/bench_runtime.py [--calls 10000] [--worlds 1,2] [--quick] [--block 250] [--toggle swap|api] [--json F]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Callable, Optional, Sequence

import orjson

from commtag.testing.bench import machine, markdown_table, median, verdict

#: Pair kind -> (variant A, variant B); the figure is built from tB - tA per pair (see balanced()).
PAIRS = {
    "idle": ("unpatched", "idle"),
    "recording": ("profiled", "recording"),
    "A/A": ("unpatched", "unpatched"),
}
#: Variants that run with commtag installed.
INSTALLED = frozenset({"idle", "recording"})
TARGET_IDLE_NS = 1_000
TARGET_RECORDING_NS = 15_000
WARMUP_CALLS = 50


def _ops(dist, torch) -> dict[str, Callable[[], object]]:
    """The collectives measured, each on a small tensor (latency, not bandwidth).

    Each looks the function up on ``dist`` at call time, so it runs whatever is
    installed at that moment.
    """
    world = dist.get_world_size()
    x = torch.ones(4)
    gathered = torch.empty(4 * world)
    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, src=0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(gathered, x),
    }


def _swap_toggles(commtag, dist) -> tuple[Callable[[], None], Callable[[], None]]:
    """install()/uninstall() as one function over two tables: set every module attribute install()
    sets, to its wrapper or back to its original. A real install() and uninstall() run different code
    (and the idempotent calls too), which leaves different caches behind for the two variants' calls."""
    from torch.distributed import distributed_c10d as c10d

    from commtag.runtime.install import hooks

    commtag.install()
    names = hooks.patched_names()
    wrappers = {name: getattr(c10d, name) for name in names}
    public = {name: dist.__dict__.get(name) is wrappers[name] for name in names}
    commtag.uninstall()
    originals = {name: getattr(c10d, name) for name in names}

    def setter(objects: dict[str, object]) -> Callable[[], None]:
        items = [(name, objects[name], public[name]) for name in names]

        def apply() -> None:
            for name, obj, also_public in items:
                setattr(c10d, name, obj)
                if also_public:
                    setattr(dist, name, obj)

        return apply

    return setter(wrappers), setter(originals)


def _worker(rank: int, world: int, init_file: str, pairs: int, block: int, toggle: str, out_dir: str) -> None:
    """Time every kind of pair on every op; every rank runs the same schedule, so they stay in lockstep."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag
    from commtag.runtime.record import recorder

    # Kineto prints a line per profiler start/stop on fd 2; keep it out of the report.
    log = os.open(os.path.join(out_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 2)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    ops = _ops(dist, torch)
    # kind -> op -> series: d = tB - tA per pair, split by which variant went first ("ab": A did).
    series = ("d_ab", "d_ba", "cpu_ab", "cpu_ba", "ta", "tb")
    out = {kind: {op: {name: array("q") for name in series} for op in ops} for kind in PAIRS}
    rounds = max(1, math.ceil(pairs / block))
    install, uninstall = _swap_toggles(commtag, dist) if toggle == "swap" else (commtag.install, commtag.uninstall)
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    kinds = list(PAIRS)
    for op, call in ops.items():
        for variant_installed in (False, True):  # warm up the transport and both code paths
            (install if variant_installed else uninstall)()
            for _ in range(WARMUP_CALLS):
                call()
        uninstall()
        for round_ in range(rounds):
            # Same rotation on every rank.
            order = kinds[round_ % len(kinds):] + kinds[: round_ % len(kinds)]
            for kind in order:
                a, b = PAIRS[kind]
                a_setup = install if a in INSTALLED else uninstall
                b_setup = install if b in INSTALLED else uninstall
                sinks = out[kind][op]
                d_ab, d_ba, cpu_ab, cpu_ba = sinks["d_ab"], sinks["d_ba"], sinks["cpu_ab"], sinks["cpu_ba"]
                ta_sink, tb_sink = sinks["ta"], sinks["tb"]
                n = min(block, pairs - round_ * block)
                prof = profile(activities=[ProfilerActivity.CPU]) if kind == "recording" else None
                if prof is not None:
                    prof.__enter__()
                try:
                    for i in range(n):
                        b_first = i & 1
                        first, second = (b_setup, a_setup) if b_first else (a_setup, b_setup)
                        first()
                        # The two timed calls are written out, not a helper: a frame around
                        # them would add its own cost to every sample.
                        c0 = cpu_clock()
                        t0 = clock()
                        call()
                        t1 = clock()
                        c1 = cpu_clock()
                        second()
                        c2 = cpu_clock()
                        t2 = clock()
                        call()
                        t3 = clock()
                        c3 = cpu_clock()
                        if b_first:
                            ta, tb = t3 - t2, t1 - t0
                            d_ba.append(tb - ta)
                            cpu_ba.append((c1 - c0) - (c3 - c2))
                        else:
                            ta, tb = t1 - t0, t3 - t2
                            d_ab.append(tb - ta)
                            cpu_ab.append((c3 - c2) - (c1 - c0))
                        ta_sink.append(ta)
                        tb_sink.append(tb)
                finally:
                    if prof is not None:
                        prof.__exit__(None, None, None)
                    uninstall()
                    recorder.drain()  # what the recording variant kept: memory stays bounded
        dist.barrier()
    result = {
        kind: {op: {name: list(values) for name, values in sinks.items()} for op, sinks in by_op.items()}
        for kind, by_op in out.items()
    }
    Path(out_dir, f"rank{rank}.json").write_bytes(orjson.dumps(result))
    dist.destroy_process_group()


def run_world(world: int, pairs: int, block: int, toggle: str = "swap") -> dict[str, dict[str, dict[str, list[int]]]]:
    """Spawn ``world`` ranks; return rank 0's {kind: {op: {series: ns per pair}}} (see _worker)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="commtag-bench-rt-") as tmp:
        init_file = os.path.join(tmp, "init")
        try:
            mp.spawn(_worker, args=(world, init_file, pairs, block, toggle, tmp), nprocs=world, join=True)
        except Exception:
            for log in sorted(Path(tmp).glob("rank*.log")):
                lines = [x for x in log.read_text(errors="replace").splitlines() if "USDT" not in x]
                print(f"--- {log.name} (last lines)", *lines[-15:], sep="\n", file=sys.stderr)
            raise
        return orjson.loads(Path(tmp, "rank0.json").read_bytes())


def median_ci(values: Sequence[int]) -> tuple[float, float]:
    """A distribution-free 95% interval for the median (order statistics n/2 -+ 0.98 sqrt(n))."""
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    n = len(ordered)
    half = 0.98 * math.sqrt(n)
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    return float(ordered[lo]), float(ordered[hi])


def balanced(ab: Sequence[int], ba: Sequence[int]) -> tuple[float, tuple[float, float]]:
    """The added cost from both orders: the mean of the two orders' medians, and its interval.

    Whatever precedes the first call of a pair differently from the second
    shifts d = tB - tA one way when A went first and the other way when B
    did; the mean of the per-order medians cancels that shift, where a median
    over both orders falls between the two modes. The interval averages the
    per-order intervals (a little wide: they are independent).
    """
    (lo_ab, hi_ab), (lo_ba, hi_ba) = median_ci(ab), median_ci(ba)
    return (median(ab) + median(ba)) / 2, ((lo_ab + lo_ba) / 2, (hi_ab + hi_ba) / 2)


def summarize(world: int, timings: dict[str, dict[str, dict[str, list[int]]]]) -> list[dict]:
    rows = []
    for op in timings["idle"]:
        idle, rec, aa = timings["idle"][op], timings["recording"][op], timings["A/A"][op]
        idle_added, idle_ci = balanced(idle["d_ab"], idle["d_ba"])
        rec_added, rec_ci = balanced(rec["d_ab"], rec["d_ba"])
        aa_added, aa_ci = balanced(aa["d_ab"], aa["d_ba"])
        rows.append({
            "world": world, "op": op, "pairs": len(idle["d_ab"]) + len(idle["d_ba"]),
            "median_ns": {
                "unpatched": median(idle["ta"]), "idle": median(idle["tb"]),
                "profiled": median(rec["ta"]), "recording": median(rec["tb"]),
            },
            "idle_added_ns": idle_added,
            "idle_added_ci_ns": idle_ci,
            "idle_added_by_order_ns": {"unpatched_first": median(idle["d_ab"]), "idle_first": median(idle["d_ba"])},
            "recording_added_ns": rec_added,
            "recording_added_ci_ns": rec_ci,
            "recording_added_by_order_ns": {"profiled_first": median(rec["d_ab"]), "recording_first": median(rec["d_ba"])},
            "aa_ns": aa_added,
            "aa_ci_ns": aa_ci,
            "cpu_idle_added_ns": balanced(idle["cpu_ab"], idle["cpu_ba"])[0],
            "cpu_recording_added_ns": balanced(rec["cpu_ab"], rec["cpu_ba"])[0],
            "cpu_aa_ns": balanced(aa["cpu_ab"], aa["cpu_ba"])[0],
        })
    return rows


def _us(ns: float, ci: Optional[Sequence[float]] = None) -> str:
    text = f"{ns / 1e3:+.2f}"
    if ci is not None:
        text += f" [{ci[0] / 1e3:+.2f}, {ci[1] / 1e3:+.2f}]"
    return text


def report(rows: list[dict], info: str) -> str:
    table = []
    for r in rows:
        m = r["median_ns"]
        table.append([
            r["world"], r["op"], r["pairs"],
            f"{m['unpatched'] / 1e3:.2f}", f"{m['idle'] / 1e3:.2f}",
            f"{_us(r['idle_added_ns'], r['idle_added_ci_ns'])} ({verdict(r['idle_added_ns'], TARGET_IDLE_NS)})",
            f"{m['profiled'] / 1e3:.2f}", f"{m['recording'] / 1e3:.2f}",
            f"{_us(r['recording_added_ns'], r['recording_added_ci_ns'])} "
            f"({verdict(r['recording_added_ns'], TARGET_RECORDING_NS)})",
            _us(r["aa_ns"], r["aa_ci_ns"]),
            f"{_us(r['cpu_idle_added_ns'])} / {_us(r['cpu_recording_added_ns'])} / {_us(r['cpu_aa_ns'])}",
        ])
    header = ["world", "op", "pairs/kind", "unpatched us", "idle us", "idle added us (<= 1)",
              "profiled us", "recording us", "recording added us (<= 15)", "A/A us",
              "caller CPU added us, idle / recording / A/A"]
    return "\n".join([
        f"Machine: {info}.",
        "Paired per call: each pair times one call of each variant back to back, order alternating; "
        "'added' = mean over the two orders of the median of tB - tA [95% interval]; 'A/A' pairs unpatched "
        "with unpatched (the measurement's bias). Unpatched/idle/profiled/recording us: median per call. "
        "One process per rank (rank 0 shown); gloo, CPU tensors of 4 floats.",
        "",
        markdown_table(header, table),
    ])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="pairs per kind and op (default 10000)")
    parser.add_argument("--block", type=int, default=250, help="pairs per interleaved block (default 250)")
    parser.add_argument("--worlds", default="1,2", help="gloo world sizes (default 1,2)")
    parser.add_argument("--quick", action="store_true", help="2000 pairs per kind and op")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("--toggle", choices=("swap", "api"), default="swap",
                        help="how the state is set before each timed call: 'swap' (default) sets the module "
                             "attributes install() sets, the same work in both directions; 'api' calls "
                             "commtag.install()/uninstall() (different work before the two variants: biased)")
    args = parser.parse_args(argv)
    pairs = 2_000 if args.quick else args.calls
    info = machine()
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        print(f"runtime overhead: world size {world}, {pairs} pairs per kind ...", file=sys.stderr, flush=True)
        rows += summarize(world, run_world(world, pairs, args.block, args.toggle))
    if args.json:
        args.json.write_bytes(orjson.dumps({"machine": info, "rows": rows}, option=orjson.OPT_INDENT_2))
    print(report(rows, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
