"""What commtag's flight-recorder ring adds to each collective, measured as paired per-call differences.

One gloo rank (world size 1, CPU tensors of 4 floats), commtag installed and no profiler running. Each
pair times one call with the ring off (the idle fast path) and one with it on, back to back, the order
alternating (see launch/bench_runtime.py for why pairs, and why the two orders' medians are averaged);
an A/A pair (off vs off) gives the measurement's own bias. The ring is switched the way
``install(dump_dir=...)`` switches it (the ring set, one reason held on the idle gate), without its
signal handlers, so both variants run the same code before their call.

Target: the ring on adds at most 2 us per collective. With it off the idle path is the one
launch/bench_runtime.py measures (the gate is unchanged).

Usage: ``python -m launch.bench_ring [--pairs 20000] [--json F]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import orjson

from commtag.testing.bench import machine, markdown_table, median, verdict

TARGET_RING_NS = 2_000
WARMUP_CALLS = 200
#: Pair kind -> (variant A, variant B): the figure is tB - tA.
PAIRS = {"ring": ("off", "on"), "A/A": ("off", "off")}


def _switches(dump_dir: Path) -> dict[str, Callable[[], None]]:
    """The ring on and off, as install(dump_dir=...) and uninstall() set it."""
    from commtag.runtime.install.idle import less_slow, more_slow
    from commtag.runtime.record import ring

    kept = ring.Ring(dump_dir, ring.DEFAULT_RING_SIZE)

    def on() -> None:
        if ring.RING is None:
            ring.RING = kept
            more_slow()

    def off() -> None:
        if ring.RING is not None:
            ring.RING = None
            less_slow()

    return {"on": on, "off": off}


def measure(pairs: int) -> dict[str, dict[str, list[int]]]:
    """Per pair kind: the differences tB - tA of A-first and B-first pairs (wall and thread CPU ns)."""
    import torch
    import torch.distributed as dist

    import commtag

    folder = tempfile.mkdtemp(prefix="bench_ring_")
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    commtag.install()
    switch = _switches(Path(folder) / "dumps")
    tensor = torch.ones(4)
    for variant in ("on", "off"):
        switch[variant]()
        for _ in range(WARMUP_CALLS):
            dist.all_reduce(tensor)
    out = {kind: {"ab": [], "ba": [], "cpu_ab": [], "cpu_ba": []} for kind in PAIRS}
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    for i in range(pairs):
        for kind, (a, b) in PAIRS.items():
            b_first = i & 1
            first, second = (switch[b], switch[a]) if b_first else (switch[a], switch[b])
            first()
            c0, t0 = cpu(), clock()
            dist.all_reduce(tensor)
            t1, c1 = clock(), cpu()
            second()
            c2, t2 = cpu(), clock()
            dist.all_reduce(tensor)
            t3, c3 = clock(), cpu()
            if b_first:
                out[kind]["ba"].append((t1 - t0) - (t3 - t2))
                out[kind]["cpu_ba"].append((c1 - c0) - (c3 - c2))
            else:
                out[kind]["ab"].append((t3 - t2) - (t1 - t0))
                out[kind]["cpu_ab"].append((c3 - c2) - (c1 - c0))
    switch["off"]()
    commtag.uninstall()
    dist.destroy_process_group()
    return out


def summarize(out: dict[str, dict[str, list[int]]]) -> list[dict[str, object]]:
    """Each kind's added cost: the mean of the two orders' medians, wall and CPU."""
    return [{"pair": kind, "added_ns": (median(s["ab"]) + median(s["ba"])) / 2,
             "added_cpu_ns": (median(s["cpu_ab"]) + median(s["cpu_ba"])) / 2, "pairs": len(s["ab"]) + len(s["ba"])}
            for kind, s in out.items()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rows = summarize(measure(args.pairs))
    ring_ns = next(r["added_ns"] for r in rows if r["pair"] == "ring")
    print(f"# commtag flight-recorder ring: added cost per all_reduce ({machine()})\n")
    print(markdown_table(("pair", "added (wall, us)", "added (thread CPU, us)", "pairs"),
                         [(r["pair"], f"{r['added_ns'] / 1000:.2f}", f"{r['added_cpu_ns'] / 1000:.2f}", r["pairs"])
                          for r in rows]))
    print(f"\nring on: {ring_ns / 1000:.2f} us per collective, target <= {TARGET_RING_NS / 1000:.0f} us: "
          f"{verdict(ring_ns, TARGET_RING_NS)}")
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
